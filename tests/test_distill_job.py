"""The main job end to end through Ray (actors + Ray Train), and its bad-input behaviour."""
import json

import pyarrow.parquet as pq
import pytest

from jobs.distill import main

FAST = ["student.epochs=2", "queries.restarts=1"]


def _run(tmp_path, name, config, *overrides):
    out = tmp_path / name
    args = ["--config", f"jobs/configs/{config}", "--out", str(out), "--quiet"]
    for o in [*FAST, *overrides]:
        args += ["--set", o]
    return main(args), out


def test_digits_central_run_folder(ray_session, tmp_path):
    code, out = _run(tmp_path, "central", "digits_central.yaml", "run.rng=seeded")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    acc, priv, counts = report["accuracy"], report["privacy"], report["counts"]
    assert 0 <= acc["labels"] <= 1 and 0 <= acc["student"] <= 1
    assert acc["nonprivate_labels"] >= 0.85            # the same pipeline without noise
    assert (priv["model"], priv["mechanism"], priv["eps"], priv["delta"], priv["unit"]) == \
        ("central", "laplace", 1.0, 0.0, "record")
    assert priv["neighbour"] == "replace-one" and len(priv["rounds"]) == 1
    assert counts["clients"] == 100 and counts["records"] == 1079 and counts["messages"] == 100
    assert sum(counts["rejected"].values()) == 0
    assert report["rng"] == "seeded" and report["version"]
    for stage in ("data", "queries", "clients", "server_open", "student"):
        assert report["timings_s"][stage] >= 0
    table = pq.read_table(out / "labels.parquet")
    assert table.num_rows == counts["public"]
    assert {"label", "true_label", "query", "soft", "nonprivate_label"} <= set(table.column_names)
    for f in ("student.pt", "summary.png", "ledger.json", "config.yaml"):
        assert (out / f).stat().st_size > 0, f
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from rknn_ray.student import load_student
    assert load_student(str(out / "student.pt")) is not None
    # a second run into the same folder is refused and leaves the first intact
    before = (out / "report.json").read_bytes()
    code, _ = _run(tmp_path, "central", "digits_central.yaml")
    assert code == 2 and (out / "report.json").read_bytes() == before


def test_digits_shuffle_single_message_job(ray_session, tmp_path):
    code, out = _run(tmp_path, "shuffle", "digits_shuffle.yaml", "privacy.eps=2.0")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    priv = report["privacy"]
    assert priv["model"] == "shuffle" and priv["eps"] <= 2.0 + 1e-9 and priv["delta"] == 1e-6
    assert priv["rounds"][0]["n"] == report["counts"]["clients"] == 1079
    assert priv["details"]["eps0"] > 2.0                       # amplification at work
    assert report["shuffler"]["senders"] == 1079
    assert report["rng"] == "secure"


@pytest.mark.parametrize("override,needle", [
    ("privacy.eps=0", "privacy.eps"),
    ("rknn.k=31", "rknn.k"),
    ("queries.s=1000", "queries.s"),
    ("data.dataset=nope", "data.dataset"),
    ("data.data_root=/nonexistent", "fashion-mnist"),
])
def test_bad_input_fails_fast_with_a_fix(tmp_path, capsys, override, needle):
    config = "fmnist_central.yaml" if "data_root" in override else "digits_central.yaml"
    code, out = _run(tmp_path, "bad", config, override)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and ("Fix" in err or "fix" in err or "install" in err)
    assert not (out / "report.json").exists()
