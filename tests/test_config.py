"""Config loading, overrides and every bad-input case, checked before work starts."""
import glob
import os

import pytest

from rknn_ray.config import load_config, parse_override, validate_resources, validate_with_data
from rknn_ray.errors import ConfigError
from rknn_ray.runio import prepare_run_dir, write_json

CONFIGS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "jobs", "configs", "*.yaml")))


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert cfg.privacy.eps > 0
    assert load_config(None, _as_overrides(cfg.to_dict())) == cfg     # round trip


def test_override_parsing():
    assert parse_override("privacy.eps=0.5") == {"privacy": {"eps": 0.5}}
    assert parse_override("data.data_root=/x") == {"data": {"data_root": "/x"}}
    assert load_config(None, ["privacy.delta=1e-6"]).privacy.delta == 1e-6  # YAML 1.1 str
    cfg = load_config(None, ["privacy.eps=2", "rknn.k=3", "queries.s=50"])
    assert (cfg.privacy.eps, cfg.rknn.k, cfg.queries.s) == (2, 3, 50)


def _as_overrides(d: dict) -> list[str]:
    import json
    return [f"{sec}.{k}={json.dumps(v)}" for sec, vals in d.items() for k, v in vals.items()]


def test_config_is_frozen_and_overrides_make_validated_copies():
    import dataclasses
    cfg = load_config(None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.privacy.eps = 3.0
    quiet = cfg.with_overrides(["run.progress=false"])
    assert quiet.run.progress is False and cfg.run.progress is True
    with pytest.raises(ConfigError, match="privacy.eps"):
        cfg.with_overrides(["privacy.eps=-1"])


def test_free_form_sections_merge_key_by_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data: {dataset: synthetic, synthetic: {num_samples: 900, seed: 3}}\n"
                    "privacy: {model: local, mechanism: collision, options: {collision_l: 9}}\n")
    cfg = load_config(str(path), ["data.synthetic.num_classes=4", "data.synthetic.dim=3",
                                  "privacy.options.separation_split=0.3"])
    assert cfg.data.synthetic == {"num_samples": 900, "seed": 3, "num_classes": 4, "dim": 3}
    assert cfg.privacy.options == {"collision_l": 9, "separation_split": 0.3}


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
    ("student.arch=resnet999", "student.arch"),
    ("student.augment=mixup", "student.augment"),
    ("student.use_gpu=maybe", "student.use_gpu"),
    ("privacy.noise=gaussian", "privacy.noise"),
    ("privacy.accountant=rdp", "privacy.accountant"),
    ("privacy.amplification_bound=lower_bound", "privacy.amplification_bound"),
    ("privacy.eps=1e-300", "privacy.eps"),
    ("privacy.options.colision_l=3", "did you mean 'privacy.options.collision_l'"),
    ("data.synthetic.samples=3", "data.synthetic.samples"),
    ("shuffle.dropout=1.5", "shuffle.dropout"),
    ("shuffle.onion_layers=20", "shuffle.onion_layers"),
    ("cluster.shard_cpus=0", "cluster.shard_cpus"),
    ("labels.train_on=private", "labels.train_on"),
    ("rounds.count=0", "rounds.count"),
    ("rounds.budget_split=[0.7, 0.7]", "rounds.budget_split"),
    ("run.diagnostics=sometimes", "run.diagnostics"),
])
def test_bad_values_name_the_key_and_fix(override, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_config(None, [override])
    assert "Fix:" in str(info.value)


def test_rounds_split_and_resources():
    cfg = load_config(None, ["rounds.count=2", "rounds.budget_split=[0.25, 0.75]"])
    assert cfg.rounds.budget_split == (0.25, 0.75)
    with pytest.raises(ConfigError, match="rounds.budget_split"):
        load_config(None, ["rounds.count=3", "rounds.budget_split=[0.5, 0.5]"])
    validate_resources(load_config(None), 2)             # 2 x 0.5 + 0.25 fits 2 CPUs
    with pytest.raises(ConfigError, match="cluster.shards"):
        validate_resources(load_config(None, ["cluster.shards=8"]), 2)


def test_sizes_known_after_loading():
    cfg = load_config(None, ["queries.s=100"])
    with pytest.raises(ConfigError, match="public samples"):
        validate_with_data(cfg, 50, 1000, 10)
    with pytest.raises(ConfigError, match="clients"):
        validate_with_data(load_config(None, ["data.clients=1000"]), 500, 10, 10)
    with pytest.raises(ConfigError, match="rknn.r"):
        validate_with_data(load_config(None, ["rknn.r=3", "queries.s=10"]), 500, 1000, 2)
    with pytest.raises(ConfigError, match="rounds.count"):
        validate_with_data(load_config(None, ["rounds.count=3", "queries.s=100"]), 250, 1000, 10)


def test_binary_config_file_is_a_clear_error(tmp_path):
    binary = tmp_path / "c.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match="not a valid YAML"):
        load_config(str(binary))


def test_missing_and_broken_config_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("privacy: [1, 2\n")
    with pytest.raises(ConfigError, match="not a valid YAML"):
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
