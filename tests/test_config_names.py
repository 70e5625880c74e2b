"""Issue 48: packaged configs by name from Python, from any folder, and a config's data paths
resolved against the config file's own folder (no job run here: fast)."""
import os

import pytest

from rknn_ray.config import load_config
from rknn_ray.errors import ConfigError
from rknn_ray.job.api import _config
from rknn_ray.config_names import config_dir, packaged_configs, resolve_config


def test_a_packaged_config_by_name_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = _config("digits_central", {"privacy": {"eps": 0.5}}, False)
    assert cfg.data.dataset == "digits" and cfg.privacy.eps == 0.5
    assert resolve_config("digits_central.yaml") == os.path.join(config_dir(), "digits_central.yaml")
    with pytest.raises(ConfigError, match="did you mean digits_central"):
        _config("digits_centrl", {}, False)
    assert "table_central" in packaged_configs()


def test_table_config_paths_resolve_against_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                  # not the repository root
    cfg = load_config(resolve_config("table_central"))
    for part in ("private", "public", "evaluation"):
        path = getattr(cfg.data, part)["path"]
        assert os.path.isabs(path) and os.path.isfile(path), path
        assert os.path.dirname(path) == os.path.join(config_dir(), "data", "breast_cancer")


def test_relative_paths_beside_a_users_config_and_from_the_working_folder(tmp_path, monkeypatch):
    mine = tmp_path / "project"
    (mine / "data").mkdir(parents=True)
    (mine / "data" / "public.csv").write_text("row_id,x\nr0,1\n")
    (tmp_path / "private.csv").write_text("x,label\n1,a\n")
    (mine / "job.yaml").write_text(
        "data:\n  dataset: table\n  classes: [a, b]\n"
        "  private: {path: private.csv, label: label}\n"          # only beside the cwd
        "  public: {path: data/public.csv, id: row_id}\n"         # beside the config
        "  evaluation: {path: s3://bucket/ev.parquet, label: label}\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(str(mine / "job.yaml"))
    assert cfg.data.public["path"] == str(mine / "data" / "public.csv")
    assert cfg.data.private["path"] == "private.csv"              # a config written before
    assert cfg.data.evaluation["path"] == "s3://bucket/ev.parquet"


def test_student_trainer_auto_chooses_by_size():
    from rknn_ray.student.config import AUTO_LOCAL_WORK
    st = load_config(None, ["student.trainer=auto", "student.epochs=10"]).student
    cnn, mlp = AUTO_LOCAL_WORK["cnn"] // 10, AUTO_LOCAL_WORK["mlp"] // 10
    assert st.chosen_trainer(cnn, (1, 28, 28))[0] == "local"
    trainer, why = st.chosen_trainer(cnn + 1, (1, 28, 28))
    assert trainer == "ray" and why.startswith("auto: ") and "(cnn)" in why
    assert st.chosen_trainer(cnn + 1, (64,))[0] == "local"        # an MLP: cheaper per sample
    assert st.chosen_trainer(mlp + 1, (64,))[0] == "ray"
    ray = load_config(None, ["student.trainer=ray"]).student
    assert ray.chosen_trainer(10) == ("ray", "configured")
