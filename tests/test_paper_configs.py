"""Paper 000 Table 1's "Ours" rows: the transcription, and one config per row that loads,
validates, mirrors the row's setting and reads its dataset's real file format."""
import glob
import os
import re

import pytest

from rknn_ray.config import load_config
from rknn_ray.data import load_dataset
from rknn_ray.errors import ConfigError, DataError
from rknn_ray.paper_numbers import TABLE1_OURS, matching, paper_rows
from tests.data_files import write_cifar, write_mnist, write_svhn

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "jobs", "configs")
PAPER = glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "papers", "000_*.txt"))


def test_every_ours_row_is_transcribed():
    assert len(TABLE1_OURS) == 9
    assert [len(paper_rows(d)) for d in ("mnist", "svhn", "cifar10", "digits")] == [3, 2, 4, 0]
    for r in TABLE1_OURS:
        assert (r.k, r.rounds, r.model, r.delta) == (1, 1, "central", 0.0)
        assert 0 < r.test_accuracy < 1 and r.queries in (10, 40, 500)


@pytest.mark.skipif(not PAPER, reason="the paper's text is not next to this checkout")
def test_transcription_matches_the_paper_text():
    text = open(PAPER[0], encoding="utf-8").read()
    table = text[text.index("Table 1: Test accuracy"):text.index("Summary")]
    found = []
    for line in table.splitlines():
        m = re.search(r"Ours \[(general|end2end)\]\t(\d+)\t([\d.]+)\t([\d.]+)%\t([\d.]*)%?\t?([\d.]*)",
                      line)
        if m:
            found.append((m.group(1), int(m.group(2)), float(m.group(3)), float(m.group(4)) / 100,
                          float(m.group(5)) / 100 if m.group(5) else None,
                          float(m.group(6)) / 100 if m.group(6) else None))
    ours = [(r.setting, r.queries, r.eps, r.test_accuracy, r.label_accuracy,
             r.nonprivate_accuracy) for r in TABLE1_OURS]
    assert len(found) == 9
    for got, want in zip(found, ours):
        assert got[:3] == want[:3]
        for a, b in zip(got[3:], want[3:]):
            assert (a is None and b is None) or abs(a - b) < 1e-9, (got, want)


def test_matching_by_dataset_and_eps():
    assert [r.queries for r in matching("mnist", 0.1)] == [40]
    assert [r.setting for r in matching("cifar10", 0.01, s=10)] == ["end2end"]
    assert matching("mnist", 1.0) == [] and matching("digits", 0.1) == []


@pytest.mark.parametrize("row", TABLE1_OURS, ids=lambda r: r.config)
def test_config_of_each_row_mirrors_it(row):
    cfg = load_config(os.path.join(CONFIGS, row.config))
    assert cfg.data.dataset == row.dataset and cfg.data.split == "paper"
    assert (cfg.queries.s, cfg.rknn.k, cfg.rounds.count) == (row.queries, row.k, row.rounds)
    assert (cfg.privacy.model, cfg.privacy.mechanism) == ("central", "laplace")
    assert cfg.privacy.eps == row.eps and cfg.privacy.delta == row.delta
    text = open(os.path.join(CONFIGS, row.config)).read()
    assert "What differs from the paper" in text and "Table 1" in text
    # the row's dataset is read from its real file format under data.data_root ...
    cfg.with_overrides(["data.data_root=/nonexistent"])     # a root is a plain override


@pytest.mark.parametrize("dataset", ["mnist", "svhn", "cifar10"])
def test_config_datasets_read_their_real_formats(tmp_path, dataset):
    row = paper_rows(dataset)[0]
    cfg = load_config(os.path.join(CONFIGS, row.config), [f"data.data_root={tmp_path}"])
    with pytest.raises(DataError, match=r"not found under .*Fix: pass --set data.data_root="):
        load_dataset(cfg.data.dataset, cfg.data.data_root)     # missing files: where to put them
    if dataset == "mnist":
        write_mnist(str(tmp_path), n_train=20, n_test=20)
        shape = (1, 28, 28)
    elif dataset == "cifar10":
        write_cifar(str(tmp_path), n_per_batch=4)
        shape = (3, 32, 32)
    else:
        write_svhn(str(tmp_path), "train_32x32.mat", 20)
        write_svhn(str(tmp_path), "test_32x32.mat", 20)
        shape = (3, 32, 32)
    opts = {"include_extra": cfg.data.include_extra} if dataset == "svhn" else {}
    d = load_dataset(cfg.data.dataset, cfg.data.data_root, **opts)
    assert d.image_shape == shape and len(d.train_y) == 20 and d.num_classes == 10


def test_svhn_extra_set_is_a_config_key(tmp_path):
    from rknn_ray.data.prepared import prepare_data
    write_svhn(str(tmp_path), "train_32x32.mat", 6)
    write_svhn(str(tmp_path), "test_32x32.mat", 1010)     # the paper split keeps 1,000 for eval
    over = [f"data.data_root={tmp_path}", "queries.s=1", "data.clients=5"]
    cfg = load_config(os.path.join(CONFIGS, "svhn_general_eps0.1.yaml"), over)
    assert cfg.data.include_extra is False and len(prepare_data(cfg).splits.private_y) == 6
    cfg = cfg.with_overrides(["data.include_extra=true"])
    with pytest.raises(DataError, match="extra_32x32.mat"):
        prepare_data(cfg)
    write_svhn(str(tmp_path), "extra_32x32.mat", 5)
    sp = prepare_data(cfg).splits
    assert (len(sp.private_y), len(sp.public_y), len(sp.eval_y)) == (11, 10, 1000)
    with pytest.raises(ConfigError, match="data.include_extra.*only read for SVHN"):
        load_config(os.path.join(CONFIGS, "mnist_general_eps0.1.yaml"), ["data.include_extra=true"])
