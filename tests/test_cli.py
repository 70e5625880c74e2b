"""The ``rknn-ray`` front door: every command listed and documented, packaged configs by name
from any folder, ``--config`` without a command still the job."""
import os
import subprocess
import sys

import pytest

from jobs.cli import main
from jobs.config_files import CONFIG_DIR, describe, packaged_configs, resolve_config
from rknn_ray.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: what ``rknn-ray --help`` must list (issue 36)
COMMANDS = ["run", "report", "budget", "compare", "grid", "amplification", "cluster", "shuffler",
            "holder"]
FAST = ["student.epochs=1", "queries.restarts=1", "student.trainer=local"]


def _cli(args, cwd):
    """``python -m jobs.cli ARGS`` in ``cwd`` with this checkout first on the path."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_top_level_help_lists_every_command(tmp_path):
    out = _cli(["--help"], tmp_path)
    assert out.returncode == 0, out.stderr
    for name in COMMANDS:
        assert f"\n    {name}" in out.stdout, name


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_has_help_with_an_example(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert f"usage: rknn-ray {name}" in text
    examples = text.split("examples:\n", 1)[1]
    assert f"rknn-ray {name} " in examples       # a command line to copy


def test_an_unknown_command_names_the_nearest_one(capsys):
    assert main(["reprot", "runs/x"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'reprot'" in err and "did you mean 'report'" in err


def test_a_packaged_config_resolves_by_name_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = os.path.join(CONFIG_DIR, "digits_central.yaml")
    assert resolve_config("digits_central") == path
    assert resolve_config("digits_central.yaml") == path
    (tmp_path / "digits_central.yaml").write_text("privacy: {eps: 0.5}\n")
    assert resolve_config("digits_central.yaml") == "digits_central.yaml"   # a file wins
    assert resolve_config("sub/none.yaml") == "sub/none.yaml"  # a path: load_config says why
    with pytest.raises(ConfigError, match="did you mean digits_central"):
        resolve_config("digits_centrl")


def test_list_configs_names_each_packaged_config_with_a_line(tmp_path):
    out = _cli(["run", "--list-configs"], tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(packaged_configs())
    assert all(len(line.split(None, 1)) == 2 for line in lines)       # every one described
    assert describe(os.path.join(CONFIG_DIR, "digits_central.yaml")).startswith("README demo")


def test_config_by_name_without_a_command_is_the_job(tmp_path):
    """``rknn-ray --config NAME`` is ``run``: the packaged config loads from another folder
    (refused at the consent check, after loading, before any work)."""
    out = _cli(["--config", "digits_central", "--set", "run.rng=seeded"], tmp_path)
    assert out.returncode == 2
    assert "insecure-seeded" in out.stderr and "not found" not in out.stderr
    out = _cli(["run", "--config", "no_such_config"], tmp_path)
    assert out.returncode == 2
    assert "neither a file nor a packaged config" in out.stderr
    assert not os.listdir(tmp_path)


def test_run_by_config_name_from_another_folder(ray_session, tmp_path, monkeypatch):
    """The README's job by name, from a folder without the repository: the run folder lands
    in that folder's runs/."""
    monkeypatch.chdir(tmp_path)
    args = ["run", "--config", "digits_central", "--quiet"]
    for o in FAST:
        args += ["--set", o]
    assert main(args) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("digits_central-")
    assert (run_dir / "report.json").is_file()


LOADED = ("import sys, jobs.cli\n"
          "rc = jobs.cli.main(sys.argv[1:])\n"
          "heavy = ('ray', 'torch', 'rknn_ray.job', 'dp_accounting')\n"
          "print('loaded:', sorted(m for m in heavy if m in sys.modules))\n"
          "sys.exit(rc)\n")


@pytest.mark.parametrize("mistake, words", [
    (["--set", "privacy.epz=1"], "privacy.epz"),
    (["--set", "privacy.eps=-1"], "privacy.eps"),
    (["--config", "no_such_config.yaml"], "no_such_config")])
def test_a_config_mistake_is_one_line_before_the_job_layer_loads(tmp_path, mistake, words):
    """`rknn-ray run` with a mistyped key, a bad value or a config file that is not there:
    exit 2, one line naming it, no run folder, and neither Ray, torch, the accountants nor the
    job layer imported to say it (a real process; it took ~3 CPU s before, under 1 now)."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", LOADED, "run", "--config", "digits_central",
                           "--out", str(tmp_path / "run"), *mistake], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], done.stderr
    assert done.stdout.strip() == "loaded: []", done.stdout
    assert not (tmp_path / "run").exists()
