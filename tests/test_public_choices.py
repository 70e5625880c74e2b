"""Issue 21 item 3: nothing published or used for a public choice depends on private data.

A Dirichlet partition deals records by their (private) labels, so changing one label
moves records between clients; the per-client record bound, the message sizes, the
multi-message allowance, auto s / k and report.json's counts must not move with it.
"""
import dataclasses

import numpy as np
import pytest

from rknn_ray.config import load_config
from rknn_ray.errors import ConfigError
from rknn_ray.mechanisms import build
from rknn_ray.job.stages import resolve_auto
from rknn_ray.data.prepared import partitioned, prepare_data
from rknn_ray.mechanisms.stage import mechanism_params, multi_message_s_cap

BASE = ["data.partition=dirichlet", "data.alpha=0.3", "data.max_records_per_client=25",
        "queries.s=auto", "rknn.k=auto", "privacy.delta=0", "privacy.budget_eps=null"]
MODELS = [("central", "laplace"), ("local", "rr"), ("shuffle", "collision"), ("shuffle", "multi")]


def public_choices(cfg, data) -> dict:
    """Every public quantity the job derives from the data: report.json's counts, and per
    trust model the auto (s, k), the mechanism's parameters, message size, allowance,
    description (report.json's privacy.details) and the multi-message s cap."""
    out = {"report_counts": data.public_counts()}
    for model, mech in MODELS:
        delta = "1e-5" if model == "shuffle" else "0"          # central and local are pure
        c = cfg.with_overrides([f"privacy.model={model}", f"privacy.mechanism={mech}",
                                f"privacy.delta={delta}"])
        c, auto = resolve_auto(c, data)
        params = mechanism_params(c, data)
        m = build(model, mech, params)
        out[model, mech] = {"auto": auto, "params": params, "message_size": m.message_size,
                            "allowance": m.messages_per_sender(), "describe": m.describe(),
                            "s_cap": multi_message_s_cap(c, data)}
    return out


def _neighbour(cfg, data, private_y=None, drop=None):
    sp = data.splits
    x, y = sp.private_x, sp.private_y if private_y is None else private_y
    if drop is not None:
        keep = np.arange(len(y)) != drop
        x, y = x[keep], y[keep]
    splits = dataclasses.replace(sp, private_x=x, private_y=y)
    return partitioned(cfg, splits, data.num_classes, data.image_shape, data.dataset)


def _largest(data) -> int:
    return int(np.bincount(data.client_ids[data.held_rows()]).max())


def test_one_private_label_changes_no_public_choice():
    cfg = load_config("jobs/configs/digits_central.yaml", BASE)
    data = prepare_data(cfg)
    before = public_choices(cfg, data)
    moved_any, largest_changed = 0, 0
    for i in range(0, 60, 6):                 # ten different records, each relabelled
        y = data.splits.private_y.copy()
        y[i] = (y[i] + 1) % data.num_classes
        other = _neighbour(cfg, data, private_y=y)
        moved_any += int(np.sum(other.client_ids != data.client_ids) > 1)
        largest_changed += int(np.bincount(other.client_ids).max()
                               != np.bincount(data.client_ids).max())
        assert public_choices(cfg, other) == before, f"relabelling record {i} moved a public choice"
        assert _largest(other) <= cfg.data.max_records_per_client     # clients keep the bound
    # the test is not vacuous: one label moves other records, and the partition's real
    # largest client (what main published) moves with it
    assert moved_any == 10 and largest_changed >= 1


def test_bound_derived_choices_survive_removing_a_record():
    """Removing a record is not a replace-one neighbour (m is public then), but everything
    the bound sets (message sizes, allowances, report's bound) stays put."""
    cfg = load_config("jobs/configs/digits_central.yaml",
                      [b for b in BASE if not b.startswith(("queries.s", "rknn.k"))])
    data = prepare_data(cfg)
    other = _neighbour(cfg, data, drop=17)
    a, b = public_choices(cfg, data), public_choices(cfg, other)
    assert a["report_counts"]["max_records_per_client"] == 25 == \
        b["report_counts"]["max_records_per_client"]
    for key in MODELS:
        for field in ("message_size", "allowance", "s_cap"):
            assert a[key][field] == b[key][field], (key, field)


def test_records_beyond_the_bound_are_dropped_blindly():
    cfg = load_config("jobs/configs/digits_central.yaml", BASE[:2] + ["data.max_records_per_client=5"])
    data = prepare_data(cfg)
    held = data.held_rows()
    assert np.bincount(data.client_ids[held]).max() <= 5 < np.bincount(data.client_ids).max()
    sizes = np.bincount(data.client_ids, minlength=data.num_clients)
    assert len(held) == int(np.minimum(sizes, 5).sum())       # only the excess goes
    assert data.records_dropped() == len(data.client_ids) - len(held)
    # the shards hold exactly the kept records: their sources see the same rows
    from rknn_ray.data.sources import dataset_sources
    recs = [src.open() for src in dataset_sources(cfg, data, shards=2)]
    assert sum(len(r.labels) for r in recs) == len(held)
    assert max(r.max_records_per_client for r in recs) <= 5


def test_dirichlet_without_a_declared_bound_is_refused():
    with pytest.raises(ConfigError) as err:
        load_config("jobs/configs/digits_central.yaml", ["data.partition=dirichlet"])
    assert "data.max_records_per_client" in str(err.value)


def test_iid_bound_is_public_and_exact():
    cfg = load_config("jobs/configs/digits_central.yaml")
    data = prepare_data(cfg)
    m, n = len(data.splits.private_y), cfg.data.clients
    assert data.max_records_per_client == -(-m // n) == np.bincount(data.client_ids).max()
    assert data.records_dropped() == 0
