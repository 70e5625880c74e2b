"""Live per-epoch metrics from Ray Train workers to a callback in the driver.

Rank 0 pushes each epoch's row (``{"epoch", "train_loss", "train_accuracy"}``, already
averaged over all ranks) to an :class:`EpochRelay` actor: a fire-and-forget call to a
list behind two methods, no CPU. A driver thread (:class:`LiveEpochs`) drains the
relay every ``interval`` seconds and hands each row to the callback, so epoch lines
and bars move while the student trains instead of all at once when ``fit()`` returns.

Why not one ``ray.train.report`` per epoch: Train V2's controller takes one report per
worker per health-check poll (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s) through a
queue of size 1, and every report is also a barrier across ranks. Measured on the
README demo (40 epochs, 2 CPU workers): training took 78 s with a report per epoch
instead of 7.5 s. The workers report once, at the end, with the only checkpoint
(``CheckpointConfig(num_to_keep=1)`` keeps Train's storage bounded).
"""
from __future__ import annotations

import threading
from typing import Callable

import ray


@ray.remote(num_cpus=0, max_restarts=0)
class EpochRelay:
    """Rows pushed by rank 0, drained by the driver (in order)."""

    def __init__(self):
        self._rows: list[dict] = []

    def push(self, row: dict) -> None:
        self._rows.append(row)

    def drain(self) -> list[dict]:
        rows, self._rows = self._rows, []
        return rows


def relay_pusher(relay) -> Callable[[dict], None] | None:
    """The worker side: an ``on_epoch`` that forwards rows without waiting (None: no relay)."""
    if relay is None:
        return None
    return lambda row: relay.push.remote(dict(row))


class LiveEpochs:
    """Driver side: start the relay, poll it in a thread, stop with a last drain.

    ``seen`` lists every row delivered, so callers can tell which epochs never
    arrived live (a failed poll, a relay that died) and deliver them afterwards.
    """

    def __init__(self, callback: Callable[[dict], None], interval: float = 0.5):
        self.callback, self.interval = callback, float(interval)
        self.seen: list[dict] = []
        self.relay = EpochRelay.remote()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="rknn-live-epochs", daemon=True)

    def _deliver(self) -> None:
        try:
            rows = ray.get(self.relay.drain.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - progress is cosmetic; the history file has every epoch
            return
        for row in rows:
            self.seen.append(row)
            self.callback(row)

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self._deliver()

    def __enter__(self) -> "LiveEpochs":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._deliver()
        ray.kill(self.relay)

    def finish(self, history: list[dict]) -> None:
        """Deliver the epochs of ``history`` that did not arrive live (never twice)."""
        done = {row.get("epoch") for row in self.seen}
        for row in history:
            if row.get("epoch") not in done:
                self.seen.append(row)
                self.callback(row)
