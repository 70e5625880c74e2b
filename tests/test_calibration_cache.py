"""The on-disk calibration cache (rknn_ray/accounting/calibration_cache.py): a second process
reuses the first's eps0, and an entry is used only once the bound itself accepts it.

The probe builds the digits job's single-message shuffle mechanism (Collision, the 'tight'
bound, 1079 senders) in a real subprocess and counts the bound's evaluations."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rknn_ray.accounting import calibration_cache as cc
from rknn_ray.accounting.bound_choice import round_bound
from rknn_ray.mechanisms import build
from rknn_ray.mechanisms.base import MechanismParams
from rknn_ray.mechanisms import shuffle_single

ROOT = Path(__file__).resolve().parents[1]
EPS, DELTA, N = 2.0, 1e-6, 1079
PARAMS = MechanismParams(num_queries=10, num_classes=10, k=1, eps=EPS, delta=DELTA,
                         num_clients=N, options={"bound": "tight"})

PROBE = f"""
import json, sys
from rknn_ray.accounting import calibration_cache
from rknn_ray.accounting.tight import TightBound
from rknn_ray.mechanisms import build
from rknn_ray.mechanisms.base import MechanismParams
calls = [0]
central = TightBound.central_eps
def counted(self, *a, **k):
    calls[0] += 1
    return central(self, *a, **k)
TightBound.central_eps = counted
m = build("shuffle", "collision", MechanismParams(num_queries=10, num_classes=10, k=1, eps={EPS},
          delta={DELTA}, num_clients={N}, options={{"bound": "tight"}}))
print(json.dumps({{"eps0": m.local_eps, "l": m.randomizer_params["collision_l"],
                  "evaluations": calls[0], "source": calibration_cache.__file__}}))
"""


def probe(env_changes: dict, source: Path = ROOT) -> tuple[dict, str]:
    """(what the probe printed, its stderr) from a fresh process running the project at
    ``source``."""
    env = {**os.environ, "PYTHONPATH": str(source), **env_changes}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=source, env=env, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("eps0-*.json"))


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """A cache folder one fresh process filled, and what that process printed."""
    folder = tmp_path_factory.mktemp("calibration")
    out, err = probe({cc.ENV: str(folder)})
    return folder, out, err


@pytest.fixture
def fresh_process(monkeypatch):
    """This process as if fresh: no calibration held in memory, no warning given yet."""
    shuffle_single._calibrated_eps0.cache_clear()
    monkeypatch.setattr(cc, "_warned", set())
    yield
    shuffle_single._calibrated_eps0.cache_clear()


def test_a_second_process_reuses_the_first_calibration(cold, tmp_path):
    folder, first, err = cold
    assert err == "" and first["evaluations"] >= 10       # the calibration searched
    stored = entries(folder)
    assert stored                                         # one file per calibration
    warm = tmp_path / "warm"
    shutil.copytree(folder, warm)
    second, err = probe({cc.ENV: str(warm)})
    assert err == ""
    assert second["eps0"] == first["eps0"] and second["l"] == first["l"]
    # one evaluation per calibration (the check of the stored eps0), no search
    assert second["evaluations"] == len(stored)
    assert [p.read_text() for p in entries(warm)] == [p.read_text() for p in stored]


def _use_a_copy(cold, tmp_path, monkeypatch):
    """(the cold run's folder, its result) with a copy of its entries, tmp_path / "c", made
    the cache of this test's processes."""
    folder, first, _ = cold
    shutil.copytree(folder, tmp_path / "c")
    monkeypatch.setenv(cc.ENV, str(tmp_path / "c"))
    return folder, first


def test_an_entry_above_the_edge_is_refused_and_replaced(cold, tmp_path, monkeypatch, capsys,
                                                         fresh_process):
    folder, first = _use_a_copy(cold, tmp_path, monkeypatch)
    tampered = entries(tmp_path / "c")
    for path in tampered:
        entry = json.loads(path.read_text())
        entry["eps0"] *= 1.02                               # raised past the edge
        path.write_text(json.dumps(entry))
    last = max((json.loads(p.read_text()) for p in tampered), key=lambda e: e["key"]["guess"] or 0)
    bound = round_bound("tight", "collision", 1, last["key"]["bound"]["attrs"]["l"])
    assert bound.central_eps(last["eps0"], N, DELTA) > EPS  # the precondition: it is unsafe
    mech = build("shuffle", "collision", PARAMS)
    assert mech.local_eps == first["eps0"]                  # what a fresh calibration gives
    warned = capsys.readouterr().err.strip().splitlines()
    assert len(warned) == len(tampered)
    assert sorted(w.split(" ")[5] for w in warned) == [str(p) for p in tampered]
    assert all("fails the bound's check" in w for w in warned)
    # each entry rewritten with the calibrated value, which the bound accepts
    rewritten = {p.name: json.loads(p.read_text()) for p in entries(tmp_path / "c")}
    assert rewritten == {p.name: json.loads(p.read_text()) for p in entries(folder)}


def test_a_corrupt_entry_is_ignored_and_rewritten(cold, tmp_path, monkeypatch, capsys,
                                                  fresh_process):
    folder, first = _use_a_copy(cold, tmp_path, monkeypatch)
    corrupt = entries(tmp_path / "c")
    assert corrupt
    for path in corrupt:
        path.write_text('{"key": {"format": 1, "eps0": 9')   # cut off mid-write
    mech = build("shuffle", "collision", PARAMS)
    assert mech.local_eps == first["eps0"]
    warned = capsys.readouterr().err
    assert warned.count("not valid JSON") == len(entries(folder))
    assert [p.read_text() for p in entries(tmp_path / "c")] == \
        [p.read_text() for p in entries(folder)]


def test_an_entry_under_another_key_is_not_used(cold, tmp_path, monkeypatch, capsys,
                                                fresh_process):
    """A file whose stored key is not the one its name stands for (copied over another
    entry) is refused even where its eps0 would pass."""
    folder, first = _use_a_copy(cold, tmp_path, monkeypatch)
    paths = entries(tmp_path / "c")
    assert paths
    for path in paths:
        entry = json.loads(path.read_text())
        entry["key"]["n"] += 1
        path.write_text(json.dumps(entry))
    assert build("shuffle", "collision", PARAMS).local_eps == first["eps0"]
    assert capsys.readouterr().err.count("its key does not match its name") == len(paths)


def test_a_code_change_is_a_new_key(cold, tmp_path):
    """An edit to the accounting sources (here a comment in a copy of the package) changes
    the fingerprint: the copy calibrates afresh beside the old entries instead of reusing them."""
    folder, first, _ = cold
    shutil.copytree(folder, tmp_path / "c")
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "rknn_ray", copy / "rknn_ray",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "rknn_ray" / "accounting" / "hockey.py", "a") as fh:
        fh.write("# an edit\n")
    second, _ = probe({cc.ENV: str(tmp_path / "c")}, source=copy)
    assert second["source"].startswith(str(copy))          # the edited code ran
    assert second["evaluations"] == first["evaluations"]    # searched again
    assert second["eps0"] == first["eps0"]
    old = {p.name for p in entries(folder)}
    new = {p.name for p in entries(tmp_path / "c")} - old
    assert old and len(new) == len(old)
    codes = {json.loads((tmp_path / "c" / name).read_text())["key"]["code"] for name in new}
    assert codes.isdisjoint(json.loads(p.read_text())["key"]["code"] for p in entries(folder))


def test_the_fingerprint_covers_the_accounting_sources_and_the_callers(tmp_path):
    files = {p.name for p in cc.fingerprinted_files((shuffle_single.__file__,))}
    assert {"bounds.py", "tight.py", "hockey.py", "calibration.py", "calibration_cache.py",
            "shuffle_single.py"} <= files
    mine = tmp_path / "caller.py"
    mine.write_text("x = 1\n")
    before = cc.code_fingerprint((str(mine),))
    mine.write_text("x = 2\n")
    cc.code_fingerprint.cache_clear()                       # a new process
    assert cc.code_fingerprint((str(mine),)) != before


def test_off_calibrates_every_time_and_writes_nothing(cold, tmp_path):
    _, first, _ = cold
    home = tmp_path / "home"
    home.mkdir()
    env = {cc.ENV: "off", "HOME": str(home), "XDG_CACHE_HOME": str(home / "xdg"),
           "RKNN_RAY_CACHE": str(home / "cache")}
    for _ in range(2):
        out, err = probe(env)
        assert out["evaluations"] == first["evaluations"] and out["eps0"] == first["eps0"]
    assert list(home.rglob("*")) == []


def test_an_unwritable_folder_means_no_cache_silently(tmp_path, monkeypatch, capsys,
                                                      fresh_process):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(cc.ENV, str(blocker / "calibration"))   # cannot become a folder
    bound = round_bound("clones_numerical")
    want = bound.local_eps0(EPS, N, DELTA)
    assert cc.cached_local_eps0(bound, EPS, N, DELTA) == want
    assert capsys.readouterr().err == ""


def test_where_the_cache_lives(tmp_path, monkeypatch):
    for var in (cc.ENV, "RKNN_RAY_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cc.cache_dir() == tmp_path / ".cache" / "rknn-ray" / "calibration"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cc.cache_dir() == tmp_path / "xdg" / "rknn-ray" / "calibration"
    monkeypatch.setenv("RKNN_RAY_CACHE", str(tmp_path / "root"))
    assert cc.cache_dir() == tmp_path / "root" / "calibration"
    monkeypatch.setenv(cc.ENV, str(tmp_path / "mine"))
    assert cc.cache_dir() == tmp_path / "mine"
    for off in ("off", "OFF", "none", "0", "false"):
        monkeypatch.setenv(cc.ENV, off)
        assert cc.cache_dir() is None


def test_concurrent_writers_leave_one_whole_entry(tmp_path):
    """Two processes calibrating the same key at once (as Ray workers do) both finish, and
    the entry they both wrote is whole and used by a third."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), cc.ENV: str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", PROBE], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    got = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert got[0]["eps0"] == got[1]["eps0"]
    assert all(json.loads(p.read_text())["eps0"] > 0 for p in entries(tmp_path))
    third, err = probe({cc.ENV: str(tmp_path)})
    assert err == "" and third["evaluations"] == len(entries(tmp_path))
    assert not list(tmp_path.glob(".tmp-*"))              # no temp file left behind


def test_the_test_run_has_its_own_cache():
    """conftest points the cache at a folder of this run, never the developer's: the suite
    starts cold, and its processes share what it calibrates."""
    folder = Path(os.environ[cc.ENV])
    assert folder == Path(os.environ["RKNN_RAY_TEST_CALIBRATION_CACHE"]) and folder.is_dir()
    assert cc.cache_dir() == folder
    assert not folder.is_relative_to(Path.home() / ".cache")
