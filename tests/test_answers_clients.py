"""RecordAnswers.clients(): the one-client shortcut is np.unique's answer (values and
dtypes), and the checks of __post_init__ still refuse unsorted client ids."""
import numpy as np
import pytest

from rknn_ray.labeling.answers import RecordAnswers


def answers(ids):
    m = len(ids)
    return RecordAnswers(np.zeros((m, 2), np.int64), np.zeros((m, 1), np.int64),
                         np.asarray(ids, np.int64), 4, 2)


@pytest.mark.parametrize("ids", [[5], [0], [3, 3, 3], [1, 2], [0, 0, 4, 4, 4, 9], []])
def test_clients_is_np_unique(ids):
    got = answers(ids).clients()
    want = np.unique(np.asarray(ids, np.int64), return_index=True, return_counts=True)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.tolist() == w.tolist()


def test_unsorted_ids_are_still_refused():
    with pytest.raises(ValueError):
        answers([2, 1])
    answers([7])          # one record: nothing to sort
