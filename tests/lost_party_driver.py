"""A real ``jobs.distill`` whose parties wait to be killed, for tests/test_lost_parties.py.

``python -m tests.lost_party_driver PARTY MARKERS ARGS...`` runs ``jobs.distill.main(ARGS)``
(its console, exit code and ledger as the CLI has them) with one party replaced by a
subclass that writes its process id to ``MARKERS/<party>.pid`` when it is surely mid-work,
then waits: the test kills that process with ``kill -9`` (tests/faulty_parties.py).

PARTY: ``shard`` (client shard 0, after its first batch of the round; ``shard:N``: shard N)
or ``scan`` (the scan's actor waits before scanning, in ``scanner.pid``; the parts' holder
writes ``holder.pid`` as it starts the scan).
"""
from __future__ import annotations

import functools
import os
import sys

from actors.parts_holder import PartsHolder
from tests.faulty_parties import pausing_shard, wait_to_be_killed


class _PidHolder(PartsHolder):
    marker = ""

    def collect(self, scanner, spec, key, shards):
        with open(self.marker + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(self.marker + ".tmp", self.marker)
        return super().collect(scanner, spec, key, shards)


def _patch_scan(markers: str) -> None:
    from rknn_ray.job import private_scan

    class PausingScanner(private_scan.PrivateScanner):
        def scan(self, *args, **kwargs):
            wait_to_be_killed(os.path.join(markers, "scanner.pid"))
            return super().scan(*args, **kwargs)

    private_scan.PrivateScanner = PausingScanner
    private_scan.PartsHolder = type("PidHolder", (_PidHolder,),
                                    {"marker": os.path.join(markers, "holder.pid")})


def main(party: str, markers: str, args: list[str]) -> int:
    import jobs.distill as distill
    from rknn_ray.job.session import Parties
    if party.split(":")[0] == "shard":
        index = int(party.split(":")[1]) if ":" in party else 0
        shard = pausing_shard(os.path.join(markers, "shard.pid"))
        distill.run = functools.partial(distill.run, parties=Parties(shards={index: shard}))
    elif party == "scan":
        _patch_scan(markers)
    else:
        raise SystemExit(f"unknown party {party!r}")
    return distill.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
