"""rknn_ray.accounting.pld_deltas.grid_deltas gives dp_accounting's vectorised
get_delta_for_epsilon (a Python loop) bit for bit: symmetric and asymmetric PLDs, the
project's multi-message protocol PLD and a composition of them, grids inside and outside
the losses; anything but a sorted finite grid goes to the library's own call."""
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from rknn_ray.accounting.multi_message import protocol_pld
from rknn_ray.accounting.pld_deltas import grid_deltas

PLDS = {
    "multi-message": lambda: protocol_pld(0.8, 50.0, 2),
    "multi-message NB, composed": lambda: protocol_pld(0.95, 300.0, 4, 2.0).compose(
        protocol_pld(0.8, 50.0, 2)),
    "laplace": lambda: pld_lib.from_laplace_mechanism(1.0, value_discretization_interval=1e-3),
    "subsampled (asymmetric)": lambda: pld_lib.from_laplace_mechanism(
        1.0, sampling_prob=0.3, value_discretization_interval=1e-3),
}


@pytest.mark.parametrize("name", sorted(PLDS))
def test_the_grid_deltas_are_the_librarys(name):
    pld = PLDS[name]()
    for es in (np.linspace(0.05, 3.0, 2049), np.linspace(-2.0, 40.0, 101), np.array([0.5]),
               np.array([])):
        np.testing.assert_array_equal(grid_deltas(pld, es),
                                      np.asarray(pld.get_delta_for_epsilon(es)))


def test_an_unsorted_or_infinite_grid_goes_to_the_library():
    pld = PLDS["laplace"]()
    es = np.array([0.5, np.inf])
    np.testing.assert_array_equal(grid_deltas(pld, es), np.asarray(pld.get_delta_for_epsilon(es)))
    with pytest.raises(ValueError, match="sorted"):          # the library's own refusal
        grid_deltas(pld, np.array([1.0, 0.5]))
