"""BlanketDelta._inner_many's unmasked fast path (every cell live: the usual n ~ 1e3-1e4) and
its flat table lookups give bit for bit the values of the masked implementation they
replaced, kept here as the reference: the bound's numbers did not move."""
import numpy as np

from rknn_ray.accounting import tight
from rknn_ray.accounting.binom_fast import EXACT_RTOL_PER_M, binom_logpmf, half_sf_exact, pmf_rtol
from rknn_ray.accounting.hockey import FLOAT_SLACK_PER_TERM
from rknn_ray.accounting.tight import SKIP, BlanketDelta, TightBound


class _Masked(BlanketDelta):
    """The implementation before the fast path (commit e36b5b5), verbatim."""

    def _inner_many(self, n2: int, Cs: np.ndarray, ee: float):
        """:meth:`_inner` for many fixed parts at once (short s windows: exact tails)."""
        p = self.p
        cxp, D = 1.0 - ee * p, (p - 1.0) * (1.0 + ee)
        s, w, w_rel, out = self._s_window(n2)
        sf_ = s.astype(float)[None, :]
        Cp = Cs[:, None] + cxp * sf_
        h0 = np.clip(np.floor(-Cp / D).astype(np.int64) + 1, 0, s[None, :] + 1)
        z = np.maximum(h0 - sf_ / 2.0, 0.0)
        bound = D * sf_ * np.exp(-2.0 * z * z / sf_)
        live = bound > SKIP
        skipped = np.sum(np.where(live, 0.0, bound), axis=1)
        m = np.broadcast_to(s[None, :] - 1, Cp.shape)[live]
        t = (h0 - 1)[live]
        sf = np.zeros(Cp.shape)
        pmf = np.zeros(Cp.shape)
        tab = self._half_table(int(m.min()), int(m.max())) if m.size else None
        band = 0.0
        if tab is not None:
            lo, W, P, S, rel, band = tab
            col = np.clip(t - (m // 2 - W), 0, 2 * W)
            sf[live], pmf[live] = S[m - lo, col], P[m - lo, col]
            pmf_rel = sf_rel = rel
        else:
            sf[live] = half_sf_exact(m, t)
            if m.size:
                pmf[live] = np.exp(binom_logpmf(t, m, 0.5))
            pmf_rel = pmf_rtol(float(np.abs(t - m / 2.0).max(initial=0.0)) + 1)
            sf_rel = EXACT_RTOL_PER_M * float(max(1, s.max()))
        A = (Cp + D * sf_ / 2.0) * sf
        B = -(Cp / 2.0) * pmf
        est = np.sum(w * np.maximum(A + B, 0.0), axis=1)
        mag = np.sum(w * (np.abs(A) + np.abs(B)), axis=1)
        err = (2.0 * (w_rel + pmf_rel) * mag + sf_rel * np.sum(w * np.abs(A), axis=1)
               + p * n2 * out + skipped + FLOAT_SLACK_PER_TERM * (8 * s.size + 16) * np.maximum(1.0, mag))
        if band:
            err = err + band * np.sum(w * (np.abs(Cp + D * sf_ / 2.0) + np.abs(Cp) / 2.0), axis=1)
        return est, err, mag


def _kind(live: np.ndarray) -> str:
    return "all" if live.all() else "none" if not live.any() else "some"


# (mechanism, its arguments, n, eps0, TABLE_MAX): every cell live, some, none; with the
# Bin(m, 1/2) table and without it (TABLE_MAX = 0: the exact tails, as at n >~ 1e5)
GRID = [("bitrr", dict(kr=1, d=10), 300, 1.0, tight.TABLE_MAX),
        ("bitrr", dict(kr=1, d=10), 5000, 3.0, tight.TABLE_MAX),
        ("collision", dict(l=8), 1079, 3.0, tight.TABLE_MAX),
        ("bitrr", dict(kr=1, d=10), 1079, 3.0, 0)]


def test_the_fast_path_gives_the_masked_values(monkeypatch):
    seen = set()
    real_many, real_table = BlanketDelta._inner_many, BlanketDelta._half_table

    def spy_many(self, n2, Cs, ee):
        out = real_many(self, n2, Cs, ee)
        ref = _Masked._inner_many(self, n2, Cs, ee)
        for a, b in zip(out, ref):
            np.testing.assert_array_equal(a, b)
        p = self.p
        cxp, D = 1.0 - ee * p, (p - 1.0) * (1.0 + ee)
        s = self._s_window(n2)[0].astype(float)[None, :]
        Cp = Cs[:, None] + cxp * s
        h0 = np.clip(np.floor(-Cp / D) + 1, 0, s + 1)
        z = np.maximum(h0 - s / 2.0, 0.0)
        seen.add(_kind(D * s * np.exp(-2.0 * z * z / s) > SKIP))
        return out

    def spy_table(self, m_lo, m_hi):
        tab = real_table(self, m_lo, m_hi)
        seen.add("table" if tab is not None else "no table")
        return tab
    monkeypatch.setattr(BlanketDelta, "_inner_many", spy_many)
    monkeypatch.setattr(BlanketDelta, "_half_table", spy_table)
    for mechanism, kw, n, eps0, table_max in GRID:
        monkeypatch.setattr(tight, "TABLE_MAX", table_max)
        pd = TightBound(mechanism, **kw).pair_delta(eps0, n)
        for eps in (0.05 * eps0, 0.3 * eps0, 0.8 * eps0):
            pd.delta(eps)
    assert seen == {"all", "some", "none", "table", "no table"}
