"""exact_lower.strided_convolve: the third-cell laws' convolution without the zeros of the
spread-out sequence (G x fewer products) equals np.convolve of the spread-out sequence, the
code it replaced, up to the order of the float sums, which the laws' error bound already
covers: the certified lower bound's value moves by ulps and stays below the old estimate."""
import numpy as np
import pytest

from rknn_ray.accounting import exact_lower
from rknn_ray.accounting.exact_lower import (BitRRThirdCellDelta, CollisionThirdValueExactDelta,
                                             strided_convolve, third_cell_grid)


def spread_convolve(w0, G, pr):
    """The replaced code: w0 spread G apart, convolved with pr."""
    up = np.zeros(G * (w0.size - 1) + 1)
    up[::G] = w0
    return np.convolve(up, pr)


@pytest.mark.parametrize("G", [1, 2, 3, 8])
def test_it_equals_the_spread_out_convolution(G):
    rng = np.random.default_rng(G)
    for a in (1, 2, 7, 300):
        for b in (1, 2, 5, 9, 1000):
            w0, pr = rng.random(a), rng.random(b)
            pr[rng.random(b) < 0.3] = 0.0                 # bincount's empty cells
            ref = spread_convolve(w0, G, pr)
            new = strided_convolve(w0, G, pr)
            assert new.shape == ref.shape
            np.testing.assert_allclose(new, ref, rtol=1e-13, atol=0)
            if G == 1:
                np.testing.assert_array_equal(new, ref)


@pytest.mark.parametrize("n", [300, 5000])
def test_the_lower_bounds_move_by_ulps_and_stay_certified(n, monkeypatch):
    def deltas():
        out = []
        for eps0 in (1.0, 3.0):
            for pd in (BitRRThirdCellDelta(eps0, n, grid=third_cell_grid(n)),
                       CollisionThirdValueExactDelta(eps0, n, 8, grid=third_cell_grid(n))):
                out += [pd.delta(f * eps0) for f in (0.2, 0.5)]
        return out
    new = deltas()
    monkeypatch.setattr(exact_lower, "strided_convolve", spread_convolve)
    old = deltas()
    assert third_cell_grid(n) > 1                          # the strided path ran
    for (e_new, up_new, dn_new), (e_old, up_old, dn_old) in zip(new, old):
        assert e_new == pytest.approx(e_old, rel=1e-14, abs=0)
        assert up_new == up_old
        assert dn_new == pytest.approx(dn_old, rel=1e-12)
        assert e_new - dn_new <= e_old                     # still below the old estimate
