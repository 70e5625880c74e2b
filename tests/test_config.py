"""Config loading, overrides and every bad-input case, checked before work starts."""
import glob
import os

import pytest

from rknn_ray.config import load_config, parse_override, validate
from rknn_ray.errors import ConfigError
from rknn_ray.runio import prepare_run_dir, write_json

CONFIGS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "jobs", "configs", "*.yaml")))


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert cfg["privacy"]["eps"] > 0


def test_override_parsing():
    assert parse_override("privacy.eps=0.5") == {"privacy": {"eps": 0.5}}
    assert parse_override("data.data_root=/x") == {"data": {"data_root": "/x"}}
    assert load_config(None, ["privacy.delta=1e-6"])["privacy"]["delta"] == 1e-6  # YAML 1.1 str
    cfg = load_config(None, ["privacy.eps=2", "rknn.k=3", "queries.s=50"])
    assert (cfg["privacy"]["eps"], cfg["rknn"]["k"], cfg["queries"]["s"]) == (2, 3, 50)


@pytest.mark.parametrize("override,match", [
    ("privacy.eps=0", "privacy.eps"),
    ("privacy.eps=-1", "privacy.eps"),
    ("privacy.eps=.nan", "privacy.eps"),
    ("privacy.eps=abc", "privacy.eps"),
    ("privacy.delta=1.5", "privacy.delta"),
    ("privacy.delta=-0.1", "privacy.delta"),
    ("rknn.k=0", "rknn.k"),
    ("rknn.k=500", "exceeds the number of queries"),
    ("data.dataset=imagenet", "unknown data set"),
    ("privacy.model=trusted", "privacy.model"),
    ("privacy.mechanism=gauss", "privacy.mechanism"),
    ("privacy.epsilon=1", "did you mean 'privacy.eps'"),
    ("data.partition=random", "data.partition"),
    ("run.rng=mersenne", "run.rng"),
    ("student.epochs=0", "student.epochs"),
])
def test_bad_values_name_the_key_and_fix(override, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_config(None, [override])
    assert "Fix:" in str(info.value)


def test_sizes_known_after_loading():
    cfg = load_config(None, ["queries.s=100"])
    with pytest.raises(ConfigError, match="public samples"):
        validate(cfg, public_size=50)
    with pytest.raises(ConfigError, match="clients"):
        validate(load_config(None, ["data.clients=1000"]), num_private=10)


def test_missing_and_broken_config_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("privacy: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))


def test_run_dir_never_clobbers_a_run(tmp_path):
    out = prepare_run_dir(str(tmp_path / "run"))
    write_json(os.path.join(out, "report.json"), {"accuracy": 1})
    with pytest.raises(ConfigError, match="already holds a run"):
        prepare_run_dir(out)
    assert open(os.path.join(out, "report.json")).read().strip().startswith("{")
    assert prepare_run_dir(out, overwrite=True) == out
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        prepare_run_dir(str(tmp_path / "other"))
    assert not [f for f in os.listdir(out) if f.startswith(".tmp-")]
