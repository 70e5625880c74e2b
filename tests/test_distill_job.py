"""The main job end to end through Ray (actors), and its bad-input behaviour."""
import json
import os
import re

import pyarrow.parquet as pq
import pytest

from jobs.distill import main

# Ray Train's start-up dominates a digits job (~10-15 s of ~20 s on a quiet machine): jobs here
# train in the driver, as conftest.digits_runs' do; the job's Ray Train path runs in the demo
# console test (test_progress_demo_console) and test_student_ray.py
FAST = ["student.epochs=2", "queries.restarts=1", "student.trainer=local"]


def _run(tmp_path, name, config, *overrides):
    out = tmp_path / name
    args = ["--config", f"jobs/configs/{config}", "--out", str(out), "--quiet"]
    for o in [*FAST, *overrides]:
        args += ["--set", o]
    if "run.rng=seeded" in overrides:
        args.append("--insecure-seeded")
    return main(args), out


def test_digits_central_run_folder(digits_runs, tmp_path):
    """The session's digits central run (conftest.digits_runs: secure rng, budget_eps 1.5)."""
    out = digits_runs / "digits_central"
    report = json.loads((out / "report.json").read_text())
    acc, priv, counts = report["accuracy"], report["privacy"], report["counts"]
    assert 0 <= acc["labels"] <= 1 and 0 <= acc["student"] <= 1
    assert acc["nonprivate_labels"] is None and "diagnostics" not in report   # nothing unprotected
    assert not (out / "diagnostics").exists()
    assert (priv["model"], priv["mechanism"], priv["eps"], priv["delta"], priv["unit"]) == \
        ("central", "laplace", 1.0, 0.0, "record")
    assert priv["neighbour"] == "replace-one" and len(priv["rounds"]) == 1
    assert counts["clients"] == 100 and counts["records"] == 1079 and counts["messages"] == 100
    assert sum(counts["rejected"].values()) == 0
    assert report["rng"] == "secure" and report["version"]
    assert report["resumed"] is None                     # finished in one go
    # the source's budget and spend are its history: in the ledger, not in the report
    assert set(priv["budget"]) == {"description", "ledger", "shown_by"}
    from rknn_ray.accounting.budget_store import BudgetStore
    (source,) = BudgetStore(priv["budget"]["ledger"]).datasets()
    assert source["budget"]["eps"] == 1.5 and source["spent"]["eps"] == pytest.approx(1.0)
    for stage in ("data", "queries", "clients", "server_open", "student"):
        assert report["timings_s"][stage] >= 0
    table = pq.read_table(out / "labels.parquet")
    assert table.num_rows == counts["public"]
    assert {"label", "true_label", "query", "soft"} <= set(table.column_names)
    assert not any("nonprivate" in c for c in table.column_names)
    for f in ("student.pt", "summary.png", "ledger.json", "config.yaml"):
        assert (out / f).stat().st_size > 0, f
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from rknn_ray.student import load_student
    assert load_student(str(out / "student.pt")) is not None
    # a second run into the same folder is refused and leaves the first intact
    before = (out / "report.json").read_bytes()
    assert main(["--config", "jobs/configs/digits_central.yaml", "--out", str(out),
                 "--quiet"]) == 2
    assert (out / "report.json").read_bytes() == before


def test_two_rounds_with_diagnostics_spend_at_most_eps(ray_session, tmp_path):
    """rounds.count=2 on one set of actors: two ledger entries, total <= privacy.eps; the
    non-private reference exists only because diagnostics were asked for, apart."""
    code, out = _run(tmp_path, "two", "digits_central.yaml", "run.rng=seeded", "rounds.count=2",
                     "run.diagnostics=true", "privacy.eps=1.0")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    priv = report["privacy"]
    assert priv["eps"] <= 1.0 + 1e-12 and len(priv["rounds"]) == 2
    assert report["rng"] == "seeded" and priv["private"] is False and "NOT PRIVATE" in priv["warning"]
    assert [r["eps"] for r in priv["rounds"]] == pytest.approx([0.5, 0.5])
    assert len(priv["ledger"]["entries"]) == 2 and report["counts"]["rounds"] == 2
    # between the rounds the shards made round 2's keys (cluster.precompute_keys): every
    # report of round 2 was sealed with one, none of round 1's
    assert report["counts"]["keys_made_ahead"] == [0, report["counts"]["messages"] // 2]
    s = report["config"]["queries"]["s"]
    assert report["counts"]["queries"] == 2 * s                  # two rounds of s, all distinct
    diag = report["diagnostics"]
    assert diag["private"] is False and diag["nonprivate_labels"] >= 0.8
    assert report["accuracy"]["nonprivate_labels"] is None
    assert "NOT PRIVATE" in (out / "diagnostics" / "README.txt").read_text()
    assert (out / "diagnostics" / "nonprivate_labels.parquet").stat().st_size > 0
    assert (out / "diagnostics" / "summary_nonprivate.png").read_bytes()[:4] == b"\x89PNG"
    # released outputs get an ordinary file mode; the non-private folder is owner-only
    import stat
    assert stat.S_IMODE((out / "diagnostics").stat().st_mode) == 0o700
    assert stat.S_IMODE((out / "report.json").stat().st_mode) & 0o044 == 0o044 & ~_umask()


def test_two_adaptive_rounds_pick_uncertain_queries_at_equal_total_eps(ray_session, tmp_path):
    """rounds.query_selection=uncertain: round 2's queries come from the interim student's
    least certain public samples (post-processing); two ledger events add up to eps; with
    rounds.split_queries the s queries are divided over the rounds (s/2 per release)."""
    code, out = _run(tmp_path, "adaptive", "digits_central.yaml", "run.rng=seeded",
                     "rounds.count=2", "rounds.query_selection=uncertain",
                     "rounds.uncertainty=entropy", "privacy.eps=1.0", "rounds.split_queries=true")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    priv = report["privacy"]
    assert [r["eps"] for r in priv["rounds"]] == pytest.approx([0.5, 0.5])
    assert priv["eps"] == pytest.approx(1.0) and len(priv["ledger"]["entries"]) == 2
    s = report["config"]["queries"]["s"]
    assert report["counts"]["queries"] == s                      # s in total, none repeated
    import numpy as np
    with np.load(out / "release.npz") as release:                # each release: its round's s
        assert [release[f"counts_{t}"].shape[0] for t in (0, 1)] == [s // 2, s - s // 2]
    first, second = report["selection"]
    assert first.pop("connection")["rule"] == "reverse_knn"      # rknn.connection's default
    assert first == {"round": 0, "rule": "kmeans", "queries": s // 2}
    assert second["rule"] == "uncertain/entropy" and second["queries"] == s - s // 2
    assert second["pool"] == min(second["free"], s) and second["post_processing"] is True
    assert second["uncertainty_chosen"] >= second["uncertainty_free"]
    assert 0 <= second["interim_agreement_released"] <= 1
    assert "diagnostics" not in report and not (out / "diagnostics").exists()
    assert report["timings_s"]["select_1"] >= 0
    table = pq.read_table(out / "labels.parquet")
    assert table.column("query").to_numpy().max() == s - 1       # labels use both rounds


def test_digits_shuffle_single_message_job(digits_runs):
    """The session's digits shuffle run (conftest.digits_runs; eps 2 is the config's)."""
    report = json.loads((digits_runs / "digits_shuffle" / "report.json").read_text())
    assert report["config"]["privacy"]["eps"] == 2.0
    priv = report["privacy"]
    assert priv["model"] == "shuffle" and priv["eps"] <= 2.0 + 1e-9 and priv["delta"] == 1e-6
    assert priv["rounds"][0]["n"] == report["counts"]["clients"] == 1079
    assert priv["details"][0]["eps0"] > 2.0                    # amplification at work
    assert report["shuffler"][0]["senders"] == 1079
    assert report["rng"] == "secure"


@pytest.mark.parametrize("override,needle", [
    ("privacy.eps=0", "privacy.eps"),
    ("rknn.k=61", "rknn.k"),          # digits_central has s = 60 queries
    ("queries.s=1000", "queries.s"),
    ("data.dataset=nope", "data.dataset"),
    ("data.data_root=/nonexistent", "fashion-mnist"),
    ("cluster.shards=8", "cluster.shards"),
    ("shuffle.dropout=1.5", "shuffle.dropout"),
    ("student.arch=resnet999", "student.arch"),
])
def test_bad_input_fails_fast_with_a_fix(tmp_path, capsys, override, needle):
    config = "fmnist_central.yaml" if "data_root" in override else "digits_central.yaml"
    code, out = _run(tmp_path, "bad", config, override)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and ("Fix" in err or "fix" in err or "install" in err)
    assert not out.exists()                                  # no traceback, no empty folder


def test_key_file_problems_are_caught_before_ray_starts(tmp_path, capsys):
    key = tmp_path / "server.pem"
    key.write_text("not a key")
    key.chmod(0o644)
    args = ["--config", "jobs/configs/digits_central.yaml", "--out", str(tmp_path / "k")]
    assert main([*args, "--key-file", str(key)]) == 2
    assert "chmod 600" in capsys.readouterr().err
    key.chmod(0o600)
    assert main([*args, "--key-file", str(key)]) == 2
    assert "not a PEM private key" in capsys.readouterr().err
    assert main([*args, "--key-file", str(tmp_path / "missing.pem")]) == 2
    assert "no key file" in capsys.readouterr().err
    assert not (tmp_path / "k").exists()


def test_failure_after_the_release_is_recorded_and_resume_finishes_without_a_new_round(
        ray_session, tmp_path, monkeypatch, isolated_privacy_ledger):
    """SIGINT during the student: the release is already saved and in the persistent ledger
    (saved before the ledger commits it); the folder says incomplete; --resume finishes it
    and spends nothing more."""
    import rknn_ray.student
    from rknn_ray.accounting.budget_store import BudgetStore
    on_disk_at_commit = []
    real_commit = BudgetStore.commit_round

    def spy(self, *args, **kwargs):
        on_disk_at_commit.append((tmp_path / "cut" / "release.npz").exists())
        return real_commit(self, *args, **kwargs)
    monkeypatch.setattr(BudgetStore, "commit_round", spy)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(rknn_ray.student, "train_student", interrupted)
    monkeypatch.setattr(rknn_ray.student, "train_student_local", interrupted)   # FAST's trainer
    code, out = _run(tmp_path, "cut", "digits_central.yaml", "run.rng=seeded")
    assert code == 130
    assert on_disk_at_commit == [True]
    marker = json.loads((out / "incomplete.json").read_text())
    assert marker["release_saved"] is True and "--resume" in marker["next_step"]
    assert not (out / "report.json").exists() and (out / "release.npz").exists()
    (dataset,) = BudgetStore(str(isolated_privacy_ledger)).datasets()
    assert dataset["spent"]["eps"] == pytest.approx(1.0) and dataset["released"] == 1
    monkeypatch.undo()
    monkeypatch.setenv("RKNN_RAY_LEDGER", str(isolated_privacy_ledger))
    assert main(["--resume", str(out), "--quiet", "--set", "student.epochs=1"]) == 2  # seeded
    assert main(["--resume", str(out), "--quiet", "--insecure-seeded",
                 "--set", "student.epochs=1"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["privacy"]["eps"] == pytest.approx(1.0) and len(report["privacy"]["rounds"]) == 1
    assert not (out / "incomplete.json").exists()
    # report.json says it was resumed, after what, and its page shows it
    resumed = report["resumed"]
    assert resumed["after"] == marker["reason"] and resumed["release_saved_at"] <= resumed["at"]
    from jobs.report import build_report
    _, page = build_report(str(out))
    assert "Resumed run: finished at" in open(page).read()
    (dataset,) = BudgetStore(str(isolated_privacy_ledger)).datasets()
    assert dataset["spent"]["eps"] == pytest.approx(1.0) and dataset["released"] == 1
    assert main(["--resume", str(out), "--quiet", "--insecure-seeded"]) == 2   # complete: nothing to do
    (dataset,) = BudgetStore(str(isolated_privacy_ledger)).datasets()
    (row,) = [r for r in dataset["releases"] if r["status"] == "released"]
    assert "NOT PRIVATE" in row["note"]                  # the ledger marks the seeded release


def test_a_seeded_run_needs_insecure_seeded_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "seeded"
    code = main(["--config", "jobs/configs/digits_central.yaml", "--out", str(out), "--quiet",
                 "--set", "run.rng=seeded"])
    err = capsys.readouterr().err
    assert code == 2 and "run.rng" in err and "--insecure-seeded" in err and "not be private" in err
    assert not out.exists()


@pytest.mark.parametrize("faulty,party", [("ServerDyingAtRelease", "server"),
                                          ("ShufflerDyingAtShuffle", "shuffler"),
                                          ("ShufflerDyingAtSubmit", "shuffler")])
def test_a_dead_party_is_named_and_the_ledger_says_what_may_have_been_released(
        ray_session, tmp_path, monkeypatch, capsys, isolated_privacy_ledger, faulty, party):
    """Fault injection per party: the job ends with one message naming the party, the run folder
    says incomplete, and the job settles its reservation itself (issue 55): spent once a report
    may have reached the server (a server dying at the release), returned when none did (a
    shuffler that died holding sealed reports nobody can open)."""
    import functools

    import jobs.distill as distill
    from rknn_ray.accounting.budget_store import BudgetStore
    from rknn_ray.job.session import Parties
    from tests import faulty_parties
    monkeypatch.setattr(distill, "run", functools.partial(
        distill.run, parties=Parties(**{party: getattr(faulty_parties, faulty)})))
    code, out = _run(tmp_path, party, "digits_shuffle.yaml", "run.rng=seeded")
    err = capsys.readouterr().err
    assert code == 2 and f"the {party} died" in err and "Traceback" not in err
    assert not re.search(r"client shard \d", err)   # the shards lived: none blamed or retried
    marker = json.loads((out / "incomplete.json").read_text())
    assert f"the {party} died" in marker["reason"] and marker["release_saved"] is False
    assert not (out / "report.json").exists()
    (dataset,) = BudgetStore(str(isolated_privacy_ledger)).datasets()
    (entry,) = dataset["releases"]
    assert dataset["reserved"] == 0
    if party == "server":
        assert entry["status"] == "released" and "counted as spent" in entry["note"]
        assert dataset["spent"]["eps"] == pytest.approx(2.0)
    else:
        assert entry["status"] == "unused" and "nothing was released" in entry["note"]
        assert dataset["spent"]["eps"] == 0


def test_empty_idx_files_and_an_unwritable_out_are_clear_errors(tmp_path, capsys):
    import numpy as np

    from rknn_ray.data.idx import write_idx
    root = tmp_path / "fm"
    root.mkdir()
    for split, n in (("train", 0), ("t10k", 100)):
        write_idx(str(root / f"{split}-images-idx3-ubyte"), np.zeros((n, 28, 28), np.uint8))
        write_idx(str(root / f"{split}-labels-idx1-ubyte"), np.zeros((n,), np.uint8))
    code, out = _run(tmp_path, "empty", "fmnist_central.yaml", f"data.data_root={root}",
                     "queries.s=10")
    err = capsys.readouterr().err
    assert code == 2 and "no records" in err and "Fix" in err and "Traceback" not in err
    assert not out.exists()
    assert main(["--config", "jobs/configs/digits_central.yaml", "--out", "/proc/rknn-run"]) == 2
    assert "cannot write the run folder" in capsys.readouterr().err


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_seeded_job_releases_the_same_counts_every_time(ray_session, tmp_path):
    """run.rng=seeded is the reproducible simulation the CLI says it is: two runs of one
    command (each its own job id, the ledger's key) release the same counts. The clients'
    coins follow the seed, not the job id."""
    import numpy as np
    runs = []
    for name in ("first", "again"):
        code, out = _run(tmp_path, name, "digits_shuffle.yaml", "run.rng=seeded",
                         "privacy.eps=2.0", "student.epochs=1")
        assert code == 0
        runs.append(out)
    ids = [json.loads((out / "report.json").read_text())["job_id"] for out in runs]
    assert ids[0] != ids[1]
    with np.load(runs[0] / "release.npz") as a, np.load(runs[1] / "release.npz") as b:
        assert np.array_equal(a["counts_0"], b["counts_0"])
