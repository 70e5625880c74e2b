"""Config loading, overrides and every bad-input case, checked before work starts."""
import copy
import dataclasses
import glob
import os
import pickle
import re
import subprocess
import sys

import pytest
import yaml

from rknn_ray.config import (DEFAULTS, SECTIONS, Config,
                             load_config, parse_override, specs)
from rknn_ray.data.checks import validate_with_data
from rknn_ray.errors import ConfigError
from rknn_ray.job.resources import protocol_cpus, validate_resources
from rknn_ray.mechanisms.options import PRIVACY_OPTIONS, SHADOWED_OPTIONS
from rknn_ray.runio import prepare_run_dir, write_json
from tests.ast_parse import parse as parse_source

ROOT = os.path.join(os.path.dirname(__file__), "..")
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "jobs", "configs", "*.yaml")))
LOCAL_COLLISION = ["privacy.model=local", "privacy.mechanism=collision"]
SYNTHETIC = ["data.dataset=synthetic"]


def _dump(tmp_path, data, name="c.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


# ---------------------------------------------------------------------- round trips

@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_shipped_configs_validate_and_round_trip(path, tmp_path):
    cfg = load_config(path)
    assert cfg.privacy.eps > 0
    again = load_config(_dump(tmp_path, cfg.to_dict()))      # what distill writes to config.yaml
    assert again == cfg and Config.from_dict(cfg.to_dict()) == cfg


def test_round_trip_keeps_free_form_sections_and_budget_split(tmp_path):
    cfg = load_config(None, SYNTHETIC + LOCAL_COLLISION + [
        "data.synthetic.dim=3", "privacy.options.collision_l=7", "rounds.count=2",
        "rounds.budget_split=[0.25, 0.5]"])
    plain = cfg.to_dict()
    assert plain["rounds"]["budget_split"] == [0.25, 0.5] and type(plain["privacy"]["options"]) is dict
    assert load_config(_dump(tmp_path, plain)) == cfg
    assert cfg.with_overrides([]) == cfg


def test_defaults_are_the_sections_defaults():
    assert load_config(None).to_dict() == DEFAULTS
    assert DEFAULTS["rounds"] == {"count": 1, "budget_split": "even", "query_selection": "farthest",
                                  "uncertainty": "margin", "pool_factor": 2.0,
                                  "split_queries": False}
    assert DEFAULTS["run"]["diagnostics"] is False


# ---------------------------------------------------------------------- parsing and merging

def test_override_parsing():
    assert parse_override("privacy.eps=0.5") == {"privacy": {"eps": 0.5}}
    assert parse_override("data.data_root=/x") == {"data": {"data_root": "/x"}}
    cfg = load_config(None, ["privacy.eps=2", "rknn.k=3", "queries.s=50"])
    assert (cfg.privacy.eps, cfg.rknn.k, cfg.queries.s) == (2, 3, 50)


def test_yaml_1_1_exponent_strings_are_numbers(tmp_path):
    # YAML 1.1 reads 1e-6 (no dot) as the string '1e-6'
    path = tmp_path / "c.yaml"
    path.write_text("privacy: {model: shuffle, mechanism: collision, eps: 5e-1, delta: 1e-6}\n"
                    "queries: {s: 1e2}\n")
    cfg = load_config(str(path), ["student.lr=2e-3", "rounds.count=2", "rounds.budget_split=[1e-1, 5e-1]"])
    assert (cfg.privacy.eps, cfg.privacy.delta, cfg.student.lr) == (0.5, 1e-6, 2e-3)
    assert cfg.queries.s == 100 and type(cfg.queries.s) is int
    assert cfg.rounds.budget_split == (0.1, 0.5)
    assert type(load_config(None, ["student.epochs=2.0"]).student.epochs) is int


def test_free_form_sections_merge_key_by_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data: {dataset: synthetic, synthetic: {num_samples: 900, seed: 3}}\n"
                    "privacy: {model: local, mechanism: separation, options: {collision_l: 9}}\n")
    cfg = load_config(str(path), ["data.synthetic.num_classes=4", "data.synthetic.dim=3",
                                  "data.synthetic.dim=5", "privacy.options.separation_split=0.3"])
    assert cfg.data.synthetic == {"num_samples": 900, "seed": 3, "num_classes": 4, "dim": 5}
    assert cfg.privacy.options == {"collision_l": 9, "separation_split": 0.3}
    # a mapping override merges too; null drops one key; a null section empties it
    assert load_config(str(path), ["privacy.options={expected_dropout: 0.1}"]).privacy.options == \
        {"collision_l": 9, "expected_dropout": 0.1}
    assert load_config(str(path), ["data.synthetic.seed=null"]).data.synthetic == {"num_samples": 900}
    assert load_config(str(path), ["privacy.options=null"]).privacy.options == {}
    assert cfg.with_overrides(["privacy.options.collision_l=11"]).privacy.options == \
        {"collision_l": 11, "separation_split": 0.3}


# ---------------------------------------------------------------------- frozen

def test_config_is_frozen_and_overrides_make_validated_copies():
    cfg = load_config(None, SYNTHETIC + ["data.synthetic.dim=3"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.privacy.eps = 3.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rounds = None
    for change in (lambda d: d.__setitem__("dim", 4), lambda d: d.update(dim=4),
                   lambda d: d.pop("dim"), lambda d: d.clear()):
        with pytest.raises(TypeError, match="with_overrides"):
            change(cfg.data.synthetic)
    assert cfg.data.synthetic == {"dim": 3}
    quiet = cfg.with_overrides(["run.progress=false"])
    assert quiet.run.progress is False and cfg.run.progress is True
    with pytest.raises(ConfigError, match="privacy.eps"):
        cfg.with_overrides(["privacy.eps=-1"])


def test_config_survives_pickle_and_deepcopy_read_only():
    # Ray ships the Config to every ClientShard: it must come back equal and still read-only
    cfg = load_config(None, LOCAL_COLLISION + ["privacy.options.collision_l=5"])
    for copied in (pickle.loads(pickle.dumps(cfg)), copy.deepcopy(cfg)):
        assert copied == cfg and hash(copied) == hash(cfg)
        with pytest.raises(TypeError):
            copied.privacy.options["collision_l"] = 6


# ---------------------------------------------------------------------- every bad value

BAD = [
    # (overrides, key the error must name)
    (["privacy.eps=0"], "privacy.eps"),
    (["privacy.eps=-1"], "privacy.eps"),
    (["privacy.eps=.nan"], "privacy.eps"),
    (["privacy.eps=.inf"], "privacy.eps"),
    (["privacy.eps=abc"], "privacy.eps"),
    (["privacy.eps=1e-300"], "privacy.eps"),
    (["privacy.delta=1.5"], "privacy.delta"),
    (["privacy.delta=-0.1"], "privacy.delta"),
    (["privacy.model=shuffle", "privacy.mechanism=collision", "privacy.delta=0"], "privacy.delta"),
    (["privacy.budget_eps=0"], "privacy.budget_eps"),
    (["privacy.budget_delta=1"], "privacy.budget_delta"),
    (["rknn.k=0"], "rknn.k"),
    (["rknn.k=500"], "rknn.k"),
    (["rknn.r=0"], "rknn.r"),
    (["data.dataset=imagenet"], "data.dataset"),
    (["data.split=random"], "data.split"),
    (["data.partition=random"], "data.partition"),
    (["data.clients=0"], "data.clients"),
    (["data.alpha=0"], "data.alpha"),
    (["data.data_root=[1]"], "data.data_root"),
    (["privacy.model=trusted"], "privacy.model"),
    (["privacy.mechanism=gauss"], "privacy.mechanism"),
    (["privacy.model=central", "privacy.mechanism=collision"], "privacy.mechanism"),
    (["privacy.epsilon=1"], "privacy.epsilon"),
    (["run.rng=mersenne"], "run.rng"),
    (["run.seed=-1"], "run.seed"),
    (["run.name=a/b"], "run.name"),
    (["run.name="], "run.name"),
    (["run.diagnostics=sometimes"], "run.diagnostics"),
    (["run.progress=1"], "run.progress"),
    (["represent.encoder=sift"], "represent.encoder"),
    (["represent.dim=0"], "represent.dim"),
    (["queries.s=2.5"], "queries.s"),
    (["student.epochs=0"], "student.epochs"),
    (["student.epochs=.inf"], "student.epochs"),
    (["student.lr=0"], "student.lr"),
    (["student.arch=resnet999"], "student.arch"),
    (["student.augment=mixup"], "student.augment"),
    (["student.use_gpu=maybe"], "student.use_gpu"),
    (["student.use_gpu=1"], "student.use_gpu"),
    (["privacy.noise=gaussian"], "privacy.noise"),
    (["privacy.multi_record=all"], "privacy.multi_record"),
    (["privacy.accountant=rdp"], "privacy.accountant"),
    (["privacy.amplification_bound=lower_bound"], "privacy.amplification_bound"),
    (["privacy.amplification_bound=tightest"], "privacy.amplification_bound"),
    (["shuffle.dropout=1"], "shuffle.dropout"),
    (["shuffle.dropout=-0.1"], "shuffle.dropout"),
    (["shuffle.onion_layers=9"], "shuffle.onion_layers"),
    (["shuffle.onion_layers=-1"], "shuffle.onion_layers"),
    (["shuffle.onion_layers=1.5"], "shuffle.onion_layers"),
    (["shuffle.min_senders=0"], "shuffle.min_senders"),
    (["shuffle.min_senders=many"], "shuffle.min_senders"),
    (["cluster.shard_cpus=0"], "cluster.shard_cpus"),
    (["cluster.shard_cpus=-1"], "cluster.shard_cpus"),
    (["cluster.shards=0"], "cluster.shards"),
    (["cluster.server_cpus=0"], "cluster.server_cpus"),
    (["cluster.openers=65"], "cluster.openers"),
    (["labels.train_on=private"], "labels.train_on"),
    (["labels.type=fuzzy"], "labels.type"),
    (["rounds.query_selection=random"], "rounds.query_selection"),
    (["rounds.query_selection=uncertain", "rounds.uncertainty=variance"], "rounds.uncertainty"),
    (["rounds.pool_factor=0.5"], "rounds.pool_factor"),
    (["rounds.pool_factor=many"], "rounds.pool_factor"),
    (["rounds.split_queries=maybe"], "rounds.split_queries"),
    (["rounds.count=3", "rounds.split_queries=true", "queries.s=8", "rknn.k=3"],
     "rounds.split_queries"),                                     # 2 queries per round < k
    (["privacy.options.colision_l=3"], "privacy.options.colision_l"),
    (["privacy.options.noise=continuous"], "privacy.options.noise"),
    (LOCAL_COLLISION + ["privacy.options.collision_l=1"], "privacy.options.collision_l"),
    (LOCAL_COLLISION + ["rknn.k=2", "rknn.r=2", "privacy.options.collision_l=4"],
     "privacy.options.collision_l"),
    (["privacy.options.separation_split=1"], "privacy.options.separation_split"),
    (["privacy.options.expected_dropout=1"], "privacy.options.expected_dropout"),
    (["privacy.options=3"], "privacy.options"),
    (SYNTHETIC + ["data.synthetic.samples=3"], "data.synthetic.samples"),
    (SYNTHETIC + ["data.synthetic.dim=abc"], "data.synthetic.dim"),
    (["data.synthetic.dim=3"], "data.synthetic"),        # only read for the synthetic data set
    (["privacy=3"], "privacy"),
    (["privacy..eps=1"], "privacy..eps"),
    (["rounds.budget_split=[0.5,"], "rounds.budget_split"),
]


@pytest.mark.parametrize("overrides,key", BAD, ids=lambda v: v if isinstance(v, str) else ",".join(v))
def test_bad_values_name_the_key_and_fix(overrides, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert info.value.key == key
    assert "Fix:" in str(info.value) and info.value.fix


@pytest.mark.parametrize("override,hint", [
    ("privacy.epsilon=1", "did you mean 'privacy.eps'"),
    ("privacy.options.colision_l=3", "did you mean 'privacy.options.collision_l'"),
    ("privacy.options.noise=continuous", "privacy.noise="),
    ("data.synthetic.dims=3", "did you mean 'data.synthetic.dim'"),
    ("cluster.shard_cpu=1", "did you mean 'cluster.shard_cpus'"),
])
def test_unknown_keys_suggest_the_right_one(override, hint):
    with pytest.raises(ConfigError) as info:
        load_config(None, (SYNTHETIC if "synthetic" in override else []) + [override])
    assert hint in info.value.fix


# ---------------------------------------------------------------------- rounds

@pytest.mark.parametrize("overrides", [
    ["rounds.count=0"],
    ["rounds.count=101"],
    ["rounds.count=two"],
    ["rounds.count=3", "rounds.budget_split=[0.5, 0.5]"],           # length != count
    ["rounds.count=2", "rounds.budget_split=[0.5, 0]"],             # a round with no budget
    ["rounds.count=2", "rounds.budget_split=[1.5, -0.5]"],
    ["rounds.count=2", "rounds.budget_split=[0.7, 0.7]"],           # sum > 1
    ["rounds.count=1", "rounds.budget_split=uneven"],
    ["rounds.count=1", "rounds.budget_split=0.5"],
    ["rounds.count=1", "rounds.budget_split=[half]"],
], ids=lambda v: ",".join(v))
def test_rounds_validation(overrides):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert info.value.key.startswith("rounds.")


def test_valid_rounds():
    cfg = load_config(None, ["rounds.count=3", "rounds.budget_split=[0.25, 0.25, 0.5]"])
    assert (cfg.rounds.count, cfg.rounds.budget_split) == (3, (0.25, 0.25, 0.5))
    assert load_config(None, ["rounds.count=2", "rounds.budget_split=[0.2, 0.3]"]).rounds.budget_split \
        == (0.2, 0.3)                                               # sum < 1: spend less
    assert load_config(None, ["rounds.count=3"]).rounds.budget_split == "even"


# ---------------------------------------------------------------------- free-form keys are real

def test_privacy_options_are_the_keys_the_mechanisms_read():
    read = set()
    for path in glob.glob(os.path.join(ROOT, "rknn_ray", "mechanisms", "*.py")):
        text = open(path, encoding="utf-8").read()
        read |= set(re.findall(r"(?:options(?:\.get\(|\[)|option\([\w.]+,)\s*[\"'](\w+)[\"']",
                               text))
    assert read == set(PRIVACY_OPTIONS) | set(SHADOWED_OPTIONS)


def test_an_unset_option_is_its_one_declared_default():
    """A mechanism built without an option calibrates exactly as with the option's declared
    default (rknn_ray/mechanisms/options.py), and refuses a value outside its declared range
    with the config's own message."""
    from rknn_ray.mechanisms import build
    from rknn_ray.mechanisms.base import MechanismParams
    from rknn_ray.mechanisms.options import OPTION_DEFAULTS

    def params(**options):
        return MechanismParams(4, 3, 1, 1.0, delta=1e-6, num_clients=3000, options=options)
    unset, stated = (build("shuffle", "multi", params(**o)) for o in (
        {}, {k: OPTION_DEFAULTS[k] for k in ("dlap_share", "expected_dropout")}))
    assert unset.cal == stated.cal and unset.n_cal == stated.n_cal
    unset, stated = (build("local", "separation", params(**o)) for o in (
        {}, {"separation_split": OPTION_DEFAULTS["separation_split"]}))
    assert unset.split == stated.split
    for name in ("dlap_share", "expected_dropout"):
        with pytest.raises(ConfigError) as bad_build:
            build("shuffle", "multi", params(**{name: 1.0}))
        with pytest.raises(ConfigError) as bad_config:
            load_config("jobs/configs/digits_shuffle.yaml", [f"privacy.options.{name}=1.0"])
        assert bad_build.value.key == bad_config.value.key == f"privacy.options.{name}"
        assert bad_build.value.fix == bad_config.value.fix


def _project_imports(path: str) -> set[str]:
    """Every rknn_ray module a file imports, at any depth (inside functions too)."""
    import ast
    tree = parse_source(open(path, encoding="utf-8").read())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
            and n.module.startswith("rknn_ray")} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
        if a.name.startswith("rknn_ray")}


def test_the_config_composes_sections_and_data_never_imports_it():
    """rknn_ray/config.py imports only the sections' declarations (rknn_ray/<package>/config.py)
    and the key machinery, not the library they configure; preparing data never imports the
    config module (its data-dependent checks are rknn_ray/data/checks.py)."""
    assert _project_imports(os.path.join(ROOT, "rknn_ray", "config.py")) == {
        "rknn_ray.errors", "rknn_ray.keyspec", "rknn_ray.data.config", "rknn_ray.labeling.config",
        "rknn_ray.mechanisms.config", "rknn_ray.representation.config", "rknn_ray.student.config",
        "rknn_ray.remote.config"}
    into_config = sorted(path for path in glob.glob(os.path.join(ROOT, "rknn_ray", "data", "**",
                                                                   "*.py"), recursive=True)
                         if "rknn_ray.config" in _project_imports(path))
    assert into_config == []


# ---------------------------------------------------------------------- after loading

def test_resources_fit_or_name_the_fix():
    cfg = load_config(None)
    assert protocol_cpus(cfg) == 2 * 0.5 + 0.25                     # shards + server, no shuffler
    validate_resources(cfg, 2)
    shuffle = load_config("jobs/configs/digits_shuffle.yaml", ["shuffle.onion_layers=3"])
    assert protocol_cpus(shuffle) == 2 * 0.5 + 0.25 + 3 * 0.25      # + one shuffler per onion layer
    validate_resources(shuffle, 2)
    with pytest.raises(ConfigError, match="cluster.shards <= 3") as info:
        validate_resources(load_config(None, ["cluster.shards=8"]), 2)
    assert info.value.key == "cluster.shards" and "server 0.25" in info.value.problem
    with pytest.raises(ConfigError, match="cluster.server_cpus"):
        validate_resources(load_config(None, ["cluster.server_cpus=4"]), 2)


def test_sizes_known_after_loading():
    cfg = load_config(None, ["queries.s=100"])
    validate_with_data(cfg, 100, 1000, 10)
    with pytest.raises(ConfigError, match="public samples"):
        validate_with_data(cfg, 50, 1000, 10)
    with pytest.raises(ConfigError, match="clients"):
        validate_with_data(load_config(None, ["data.clients=1000"]), 500, 10, 10)
    validate_with_data(load_config(None, ["data.clients=1000", "data.partition=one_per_client"]),
                       500, 10, 10)
    with pytest.raises(ConfigError, match="rknn.r"):
        validate_with_data(load_config(None, ["rknn.r=3", "queries.s=10"]), 500, 1000, 2)
    with pytest.raises(ConfigError, match="rounds.count"):
        validate_with_data(load_config(None, ["rounds.count=3", "queries.s=100"]), 250, 1000, 10)
    # split over the rounds: s in total, so 3 rounds of 100 // 3 fit 250 public samples
    validate_with_data(load_config(None, ["rounds.count=3", "queries.s=100",
                                          "rounds.split_queries=true"]), 250, 1000, 10)
    shuffle = ["privacy.model=shuffle", "privacy.mechanism=collision", "queries.s=10"]
    validate_with_data(load_config(None, shuffle + ["privacy.delta=1e-4"]), 500, 1000, 10)
    with pytest.raises(ConfigError, match=r"1/n = 0.001 for n = 1000.*below 0.0001"):
        validate_with_data(load_config(None, shuffle + ["privacy.delta=1e-3"]), 500, 1000, 10)


def test_student_config_from_run_config():
    from rknn_ray.student import StudentConfig
    cfg = load_config("jobs/configs/digits_shuffle.yaml")
    scfg = StudentConfig.from_config(cfg).validate()
    assert (scfg.epochs, scfg.batch_size, scfg.augment, scfg.label_type, scfg.seed) == \
        (cfg.student.epochs, cfg.student.batch_size, "shift", cfg.labels.type, cfg.run.seed)


# ---------------------------------------------------------------------- files

@pytest.mark.parametrize("content,problem", [
    (bytes(range(256)) * 4, "not a valid YAML"),
    (b"privacy: [1, 2\n", "not a valid YAML"),
    (b"- privacy\n- eps\n", "holds a list"),
    (b"just text\n", "holds a str"),
], ids=["binary", "broken", "list", "scalar"])
def test_unusable_config_files_are_clear_errors(tmp_path, content, problem):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=problem) as info:
        load_config(str(path))
    assert info.value.key == "--config"


def test_missing_folder_and_empty_config_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="is a folder"):
        load_config(str(tmp_path))
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing set\n")
    with pytest.raises(ConfigError, match="sets nothing"):    # not the default job, unasked
        load_config(str(empty))
    nested = tmp_path / "nested.yaml"
    nested.write_text("privacy: 3\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(str(nested))


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


def test_student_trainer_is_ray_or_local():
    # auto by default (issue 57: the demo warned that its own Ray Train setting was slow);
    # the digits demos ask for Ray Train by name, to show it
    assert load_config(None).student.trainer == "auto"
    assert load_config("jobs/configs/digits_central.yaml").student.trainer == "ray"
    assert load_config(None, ["student.trainer=local"]).student.trainer == "local"
    with pytest.raises(ConfigError, match="student.trainer"):
        load_config(None, ["student.trainer=spark"])


# ---------------------------------------------------------------------- one declaration per key

def test_validating_every_config_imports_no_torch_faiss_or_ray():
    """Validation (and the generated reference) read the keys' declarations only: a bad value
    fails in a fraction of a second, on a machine without the heavy stack loaded."""
    code = ("import glob, sys\n"
            "from rknn_ray.config import load_config\n"
            "from jobs.config_reference import render\n"
            "paths = sorted(glob.glob('jobs/configs/*.yaml'))\n"
            "cfgs = [load_config(p) for p in paths]\n"
            "cfgs[0].with_overrides(['student.method=semi', 'queries.s=auto', 'rknn.k=auto'])\n"
            "render()\n"
            "print(len(paths), sorted(m for m in ('torch', 'faiss', 'ray') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.path.abspath(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() [-1:] == ["[]"], out.stdout
    assert int(out.stdout.split()[0]) == len(CONFIGS) >= 10


def test_the_validator_and_the_reference_read_the_fields_declaration(monkeypatch):
    """Change a key's declared range or choices in one place, its field: the validator and the
    generated reference both follow, with no table to keep in step."""
    from jobs.config_reference import render
    from rknn_ray.keyspec import Spec
    r = next(f for f in dataclasses.fields(SECTIONS["rknn"]) if f.name == "r")
    monkeypatch.setattr(r, "metadata", {"spec": Spec("label bits", int, low=1, high=3)})
    with pytest.raises(ConfigError, match=r"choose rknn.r in \[1, 3\]"):
        load_config(None, ["rknn.r=4"])
    assert "| `rknn.r` | `1` | integer in [1, 3] | label bits |" in render()
    arch = next(f for f in dataclasses.fields(SECTIONS["student"]) if f.name == "arch")
    monkeypatch.setattr(arch, "metadata", {"spec": Spec("net", str, choices=("auto", "mlp"))})
    with pytest.raises(ConfigError, match=r"use one of \['auto', 'mlp'\]"):
        load_config(None, ["student.arch=cnn8"])
    assert "| `student.arch` | `auto` | `auto` \\| `mlp` | net |" in render()


def test_every_key_says_what_it_accepts():
    """Each typed key's declaration names its type and range, its choices, or its own rule
    (the reference once said 'see rknn_ray/config.py' for eight keys)."""
    from jobs.config_reference import render
    for path, spec in specs().items():
        assert spec.doc, path
        assert spec.accepts() and spec.accepts() != "text", path
    assert set(specs()) == {f"{s}.{k}" for s, keys in DEFAULTS.items() for k in keys}
    assert "see `rknn_ray/config.py`" not in render()


def test_student_keys_are_declared_once():
    """The run config's student section, the supervised loop's StudentConfig and the semi
    loop's SemiConfig share each student key's declaration, so they reject a value with the
    same words."""
    from rknn_ray.student.config import SemiConfig, StudentConfig, StudentSection
    assert SECTIONS["student"] is StudentSection
    declared = {f.name: f.metadata["spec"] for f in dataclasses.fields(StudentSection)}
    for cls in (StudentConfig, SemiConfig):
        shared = {f.name: f.metadata["spec"] for f in dataclasses.fields(cls) if f.name in declared}
        assert shared.keys() == declared.keys()
        assert all(shared[name] is declared[name] for name in declared), cls
    for override, kwargs in [("student.epochs=0", {"epochs": 0}),
                             ("student.augment=mixup", {"augment": "mixup"}),
                             ("student.threshold=1.5", {"threshold": 1.5}),
                             ("student.trainer=spark", {"trainer": "spark"})]:
        with pytest.raises(ConfigError) as run:
            load_config(None, [override])
        for cls in (StudentConfig, SemiConfig):
            with pytest.raises(ConfigError) as lib:
                cls(**kwargs).validate()
            assert str(lib.value) == str(run.value)
    assert StudentConfig(epochs=2.0).validate().epochs == 2          # normalized like the config


def test_semi_config_from_run_config_keeps_the_jobs_mapping():
    from rknn_ray.student.config import SemiConfig
    cfg = load_config(None, ["student.method=semi", "student.lr=0.01", "student.target=soft",
                             "represent.trainer=local", "represent.flip=false", "run.seed=3"])
    semi = SemiConfig.from_config(cfg).validate()
    assert (semi.lr, semi.batch_size, semi.target, semi.trainer, semi.flip, semi.seed) == \
        (0.01, cfg.student.batch_size, "soft", "local", False, 3)
    assert semi.weight_decay == 5e-4                   # student.weight_decay: 0 -> the semi default
    assert SemiConfig.from_config(cfg.with_overrides(["student.weight_decay=0.1"])).weight_decay == 0.1


def test_choices_declared_beside_torch_code_match_it():
    """represent.backbone's choices are declared in the config (rknn_ray.representation.contrastive loads
    torch); they must be the ones the encoder accepts."""
    from rknn_ray.representation.contrastive import BACKBONES
    assert specs()["represent.backbone"].allowed() == BACKBONES


def test_load_config_takes_a_dict_of_sections():
    """A notebook's config without a file: the same merge and validation as a YAML file."""
    given = {"privacy": {"eps": 0.5}, "data": {"dataset": "digits"}}
    cfg = load_config(given, ["student.epochs=3"])
    assert (cfg.privacy.eps, cfg.student.epochs) == (0.5, 3)
    assert cfg == load_config(None, ["privacy.eps=0.5", "data.dataset=digits", "student.epochs=3"])
    assert given == {"privacy": {"eps": 0.5}, "data": {"dataset": "digits"}}   # not changed
    with pytest.raises(ConfigError, match="did you mean 'privacy.eps'"):
        load_config({"privacy": {"epss": 1.0}})
    with pytest.raises(ConfigError, match="privacy.eps"):
        load_config({"privacy": {"eps": -1.0}})


def test_with_overrides_takes_dotted_keys_and_validates_again():
    cfg = load_config("jobs/configs/digits_central.yaml")
    changed = cfg.with_overrides({"privacy.eps": 0.5, "privacy.options.collision_l": 40})
    assert (changed.privacy.eps, changed.privacy.options["collision_l"]) == (0.5, 40)
    assert changed == cfg.with_overrides(["privacy.eps=0.5", "privacy.options.collision_l=40"])
    assert cfg.privacy.eps == 1.0                                      # a copy
    with pytest.raises(ConfigError, match="did you mean 'privacy.eps'"):
        cfg.with_overrides({"privacy.epss": 0.5})
    with pytest.raises(ConfigError, match="out of range"):
        cfg.with_overrides({"privacy.eps": -1.0})
    with pytest.raises(ConfigError, match="empty part"):
        cfg.with_overrides({"privacy..eps": 1.0})


def test_every_packaged_config_survives_validation_again():
    """The job validates the Config it is handed once more: a valid one comes back equal."""
    for path in sorted(glob.glob("jobs/configs/*.yaml")):
        cfg = load_config(path)
        assert Config.from_dict(cfg.to_dict()) == cfg, path


@pytest.mark.parametrize("value", ["0", "1e-7", "-1"])
def test_privacy_eps_below_its_floor_names_the_one_range_the_docs_give(value):
    """Issue 57: eps=0 said "(0, inf)", eps=1e-7 ">= 1e-6", the docs "[1e-06, inf)"."""
    with pytest.raises(ConfigError) as err:
        load_config("jobs/configs/digits_central.yaml", [f"privacy.eps={value}"])
    assert "choose privacy.eps in [1e-06, inf)" in str(err.value)
    doc = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "docs", "configuration.md")).read()
    assert "| `privacy.eps` | `1.0` | number in [1e-06, inf) |" in doc
