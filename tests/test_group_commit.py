"""shuffler.service.GroupCommit in-process: requests that wait together are judged in one
group, in arrival order, each answered with its own codes once the group is committed, and a
group whose commit fails answers every waiting request with the error."""
import asyncio
import sqlite3

import pytest

from benchmarks.shuffler_world import make_world
from sealing.upload_client import sign_reports
from shuffler.intake import Intake
from shuffler.service import GroupCommit
from shuffler.service_files import load_layer_key
from shuffler.store import ReportStore


@pytest.fixture()
def world(tmp_path):
    w = make_world(tmp_path, holders=3, registered=2, allowance=2, floor=1)
    holders = {k.public_key().public_bytes_raw(): k.public_key() for k in w.holders[:2]}
    intake = Intake(w.spec, holders, load_layer_key(w.shuffler_key),
                    ReportStore(tmp_path / "store", w.spec_hash))
    return w, intake


async def _together(commits, intake, requests):
    return await asyncio.gather(*(commits.submit(intake, r) for r in requests))


def test_waiting_requests_are_answered_each_with_its_own_codes(world):
    w, intake = world
    first = sign_reports(w.holders[0], [w.seal(bytes(24))])
    requests = [first,
                sign_reports(w.holders[1], [w.seal(bytes(24)), w.seal(bytes(24))]),
                first,                                       # the same report again
                sign_reports(w.holders[2], [w.seal(bytes(24))])]   # not registered
    commits = GroupCommit()
    answers = asyncio.run(_together(commits, intake, requests))
    assert answers == [["accepted"], ["accepted", "accepted"], ["duplicate"], ["unknown_key"]]
    assert intake.store.accepted() == 3 and intake.store.distinct_holders() == 2
    reopened = ReportStore(intake.store.path.parent, w.spec_hash)    # on disk, not only mirrored
    assert reopened.accepted() == 3
    assert reopened.answers()["duplicate"] == 1 and reopened.answers()["unknown_key"] == 1


def test_a_failed_commit_answers_every_waiting_request_with_the_error(world):
    w, intake = world
    intake.store.db.close()                         # every statement now raises
    requests = [sign_reports(k, [w.seal(bytes(24))]) for k in w.holders[:2]]
    commits = GroupCommit()

    async def each():
        return await asyncio.gather(*(commits.submit(intake, r) for r in requests),
                                    return_exceptions=True)
    answers = asyncio.run(each())
    assert len(answers) == 2
    assert all(isinstance(a, sqlite3.ProgrammingError) for a in answers)


def test_a_group_looks_its_report_ids_up_in_one_statement(world):
    """Intake.submit_many prefetches the group's report ids (ReportStore.prefetch): one
    SELECT for the group instead of one or two per report, the same codes as without."""
    w, intake = world
    kept = w.seal(bytes(24))
    assert intake.submit(sign_reports(w.holders[0], [kept])) == ["accepted"]
    fresh = w.seal(bytes(24))
    requests = [sign_reports(w.holders[0], [kept]),                 # in the file: duplicate
                sign_reports(w.holders[1], [fresh]),                # new: accepted
                sign_reports(w.holders[1], [fresh])]                # again in the group
    statements = []
    intake.store.db.set_trace_callback(statements.append)
    assert intake.submit_many(requests) == [["duplicate"], ["accepted"], ["duplicate"]]
    intake.store.db.set_trace_callback(None)
    lookups = [s for s in statements if s.startswith("SELECT") and "report_id" in s]
    assert len(lookups) == 1 and " IN (" in lookups[0]
    # an id not prefetched still reads from the file, in and out of a transaction
    assert intake.store.has(kept[34:50]) and intake.store.has(fresh[34:50])
    assert not intake.store.has(bytes(16))
    with intake.store.transaction():
        intake.store.prefetch([bytes(16)])
        assert intake.store.has(kept[34:50]) and not intake.store.has(bytes(16))


def test_prefetch_chunks_many_ids(world, monkeypatch):
    import shuffler.store as store_mod
    w, intake = world
    monkeypatch.setattr(store_mod, "LOOKUP_CHUNK", 3)
    reports = [w.seal(bytes(24)) for _ in range(2)]
    assert intake.submit(sign_reports(w.holders[0], reports)) == ["accepted", "accepted"]
    ids = [r[34:50] for r in reports] + [bytes([i]) * 16 for i in range(5)]
    with intake.store.transaction():
        intake.store.prefetch(ids)
        assert [intake.store.has(i) for i in ids] == [True, True] + [False] * 5
