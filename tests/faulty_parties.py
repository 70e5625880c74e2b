"""Faulty and hostile parties for tests: subclasses of the production actors' logic.

The protocol session runs whatever party classes it is given
(:class:`rknn_ray.job.session.Parties`), on real Ray actors; the faults live here, not
in production code. Each ``*_shard`` / ``*_server`` / ``*_shuffler`` function returns a
subclass configured for one test (a class, since Ray builds the actor from it).
"""
from __future__ import annotations

import os
import signal
import time

import numpy as np

from actors.client_shard import ClientShardImpl
from actors.server import ServerImpl
from actors.shuffler import ShufflerImpl
from rknn_ray.client_step import client_step


class CrashingShard(ClientShardImpl):
    """Dies once (``os._exit``) after ``after`` batches; the ``marker`` file makes the
    restarted incarnation run normally. With ``lose_secret`` the shard deletes its stored
    secret first (a restart on another node)."""

    after: int = 1
    marker: str = ""
    lose_secret: bool = False

    def stream_reports(self, spec, batch_clients: int, source=None):
        for sent, batch in enumerate(super().stream_reports(spec, batch_clients, source), start=1):
            yield batch
            if sent >= self.after and self.marker and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                if self.lose_secret:
                    self._secrets.forget(self.shard_id)
                time.sleep(2.0)     # let Ray deliver the batches already yielded: they get re-sent
                os._exit(1)


def wait_to_be_killed(marker: str, limit_s: float = 120.0) -> None:
    """Write this process's id to ``marker`` (atomically), then wait for the test's
    ``kill -9`` (``limit_s`` at most): a party that is surely mid-work when it dies."""
    with open(marker + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(marker + ".tmp", marker)
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        time.sleep(0.2)


class PausingShard(ClientShardImpl):
    """Sends ``after`` batches, then writes its pid to ``marker`` and waits to be killed
    mid-round (tests/test_lost_parties.py); an incarnation that finds ``marker`` runs as
    usual."""

    after: int = 1
    marker: str = ""

    def stream_reports(self, spec, batch_clients: int, source=None):
        for sent, batch in enumerate(super().stream_reports(spec, batch_clients, source), start=1):
            yield batch
            if sent == self.after and self.marker and not os.path.exists(self.marker):
                wait_to_be_killed(self.marker)


class FloodingShard(ClientShardImpl):
    """A hostile client: the shard's first client re-randomizes its record ``count`` times
    (fresh batch keys) and signs every report with its real credential and seq
    0..count-1 -- the attack the per-sender allowance exists for. Sent after the round."""

    count: int = 1000

    def stream_reports(self, spec, batch_clients: int, source=None):
        from sealing.credentials import with_credentials
        from sealing.envelope import from_arrow, to_arrow
        x, y, ids = next(iter(self._records(source).batches(batch_clients)))
        x, y, ids = x[:1], y[:1], ids[:1]
        reports = np.concatenate([from_arrow(client_step(spec, self._secret, 10**6 + j, x, y, ids))[0]
                                  for j in range(self.count)])
        senders = np.repeat(ids[:1], self.count)
        yield from super().stream_reports(spec, batch_clients, source)
        seqs, tags = self._credential.sign(spec.ctx, senders, reports)
        yield with_credentials(to_arrow(reports, senders), seqs, tags)


class GarbageShard(ClientShardImpl):
    """Clients whose id is a multiple of ``every`` send random bytes behind the round's
    clear header instead of their reports, validly signed: the shuffler admits them
    (authenticated, right length); the server cannot open them (``tampered``)."""

    every: int = 10

    def stream_reports(self, spec, batch_clients: int, source=None):
        from sealing.credentials import with_credentials
        from sealing.envelope import CONTEXT_LEN, from_arrow, to_arrow
        for batch in super().stream_reports(spec, batch_clients, source):
            reports, senders = from_arrow(batch)
            bad = senders % self.every == 0
            reports = reports.copy()
            body = reports.shape[1] - CONTEXT_LEN
            reports[bad, CONTEXT_LEN:] = np.frombuffer(os.urandom(int(bad.sum()) * body),
                                                       np.uint8).reshape(-1, body)
            seqs, tags = self._credential.sign(spec.ctx, senders, reports)
            yield with_credentials(to_arrow(reports, senders), seqs, tags)


class ServerDyingAtRelease(ServerImpl):
    """The server process dies as it is asked to release the counts (``finish``): the
    counts may have been released, as far as the driver can tell."""

    def finish(self, *args, **kwargs):
        os._exit(1)


class ServerKilledWhileOpening(ServerImpl):
    """The server process is killed (SIGKILL, as ``kill -9``) once it has opened ``after``
    reports, mid-round: no counts are released, but every report it opened is a release to
    it."""

    after: int = 10

    def submit(self, batch) -> int:
        rows = super().submit(batch)
        if self.opened() >= self.after:
            self._drain()
            os.kill(os.getpid(), signal.SIGKILL)
        return rows


class ServerDyingAtOpen(ServerImpl):
    """The server process dies as the first client batch reaches it (the clients' stage, no
    shuffler): nothing was released, and the shards are still streaming."""

    def submit(self, *args, **kwargs):
        os._exit(1)


class ShufflerDyingAtShuffle(ShufflerImpl):
    """The shuffler process dies when the driver asks it to shuffle (after every client
    has sent): nothing was released."""

    def stats(self, *args, **kwargs):
        os._exit(1)


class ShufflerDyingInRound2(ShufflerImpl):
    """The shuffler process dies when asked to shuffle the job's second round: the first
    round was released, no report of the second reached the server."""

    def start_round(self, round_id: int, *args, **kwargs):
        self._round = round_id
        return super().start_round(round_id, *args, **kwargs)

    def stats(self, *args, **kwargs):
        if getattr(self, "_round", 0) == 1:
            os._exit(1)
        return super().stats(*args, **kwargs)


class ShufflerDyingAtSubmit(ShufflerImpl):
    """The shuffler process dies as the first client batch reaches it (the clients' stage):
    nothing was released, and the shards, alive throughout, are not the party to name."""

    def submit_refs(self, *args, **kwargs):
        os._exit(1)


def configured(cls: type, **attrs) -> type:
    """``cls`` with the given class attributes (one test's fault settings)."""
    unknown = set(attrs) - set(dir(cls))
    if unknown:
        raise TypeError(f"{cls.__name__} has no setting {sorted(unknown)}")
    return type(cls.__name__, (cls,), attrs)


def crashing_shard(marker, after: int = 1, lose_secret: bool = False) -> type:
    return configured(CrashingShard, marker=str(marker), after=int(after),
                      lose_secret=bool(lose_secret))


def flooding_shard(count: int) -> type:
    return configured(FloodingShard, count=int(count))


def garbage_shard(every: int) -> type:
    return configured(GarbageShard, every=int(every))


def pausing_shard(marker, after: int = 1) -> type:
    return configured(PausingShard, marker=str(marker), after=int(after))
