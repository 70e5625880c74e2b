"""Job-wide memory of fixed-width keys already seen (report ids, (sender, seq) slots).

Holds no key and opens nothing: the server's accumulator, the onion peeler and the
shuffler's sender admission all use it, so it lives apart from the opening core.
"""
from __future__ import annotations

import numpy as np

from sealing.envelope import KEY_LEN

class ReplayGuard:
    """Job-wide memory of fixed-width keys already seen (report ids, ephemeral keys).

    A second sight is a replay. Kept as a few sorted runs whose sizes at least double
    from the newest to the oldest (a tiny log-structured merge): a batch is checked
    with one binary search per run and stored as a new run, and runs of similar size
    are merged. Amortized O(n log n) for n keys (one sorted array with an insert per
    batch was O(n^2 / batch): about 100 GB of copying at ten million reports); a
    million 16-byte ids cost 16 MB.
    """

    def __init__(self, width: int = KEY_LEN):
        self._dtype = np.dtype(f"S{width}")
        self._runs: list[np.ndarray] = []

    def __len__(self) -> int:
        return int(sum(r.size for r in self._runs))

    def fresh(self, eph: np.ndarray) -> np.ndarray:
        """Boolean mask of first sightings (within ``eph`` and across earlier calls); records them."""
        fresh = np.zeros(eph.size, bool)
        if eph.size == 0:
            return fresh
        uniq, first = np.unique(np.asarray(eph, self._dtype), return_index=True)
        seen = np.zeros(uniq.size, bool)
        for run in self._runs:
            pos = np.searchsorted(run, uniq)
            inside = pos < run.size
            seen[inside] |= run[pos[inside]] == uniq[inside]
        fresh[first[~seen]] = True
        new = uniq[~seen]                       # sorted: np.unique's output
        if new.size:
            self._runs.append(new)
            while len(self._runs) > 1 and self._runs[-2].size <= 2 * self._runs[-1].size:
                newer, older = self._runs.pop(), self._runs.pop()
                self._runs.append(np.sort(np.concatenate([older, newer]), kind="stable"))
        return fresh
