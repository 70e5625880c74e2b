"""``queries.s: auto`` follows the mechanism (issue 20): every shuffle config leaves s to the
rule, so switching privacy.mechanism alone gives that mechanism's setting. Single-message
Collision gets the noise rule's s from its exact per-report variances (issue 47: its error
*bound*, read as a std, had sent it to s = |Y|); multi-message gets the noise rule's s capped
by the messages a client may send."""
import os

import pytest

from rknn_ray.config import load_config
from rknn_ray.mechanisms.shuffle_multi import AUTO_DLAP_SHARES, DEFAULT_DLAP_SHARE
from rknn_ray.job.stages import resolve_auto
from rknn_ray.data.prepared import prepare_data
from rknn_ray.mechanisms.stage import free_dlap_shares, multi_message_s_cap

SHUFFLE_CONFIGS = ["digits_shuffle.yaml", "fmnist_shuffle.yaml"]


def _resolved(name, *overrides):
    cfg = load_config(f"jobs/configs/{name}", list(overrides))
    if cfg.data.dataset == "fashion_mnist" and not os.path.isdir(
            "/usr/share/datasets/fashion-mnist"):
        pytest.skip("Fashion-MNIST absent (apt-get install dataset-fashion-mnist)")
    data = prepare_data(cfg)
    resolved, choice = resolve_auto(cfg, data)
    return cfg, data, resolved, choice


@pytest.mark.parametrize("name", SHUFFLE_CONFIGS)
def test_shuffle_configs_leave_s_to_the_rule(name):
    assert load_config(f"jobs/configs/{name}").queries.s == "auto"


@pytest.mark.parametrize("name", SHUFFLE_CONFIGS)
def test_collision_gets_the_noise_rules_s_from_its_exact_variances(name):
    """The count std is the mechanism's own: mu votes in the cell at the member variance,
    the other reports at the non-member one; s is the largest with SNR >= 8 after smoothing
    (above |Y|: on digits s = 10 labelled 0.80 / 0.71 in two seeds, the rule's s = 30 0.88 /
    0.87, docs/results.md)."""
    import math

    from rknn_ray.mechanisms.stage import mechanism_for
    cfg, data, resolved, choice = _resolved(name)
    assert cfg.privacy.mechanism == "collision"
    assert resolved.queries.s > data.num_classes
    mech = mechanism_for(resolved, data, k=1, num_queries=len(data.splits.public_y))
    v = mech._class_variances()
    n = data.num_clients
    mu = n / len(data.splits.public_y)
    assert choice["noise_std_k1"] == pytest.approx(math.sqrt(mu * v[1] + (n - mu) * v[0]))


@pytest.mark.parametrize("name", SHUFFLE_CONFIGS)
def test_multi_message_gets_the_capped_noise_rule(name):
    """At a fixed DLap share: the noise rule's s, capped by the messages a client may send."""
    cfg, data, resolved, choice = _resolved(name, "privacy.mechanism=multi",
                                            "privacy.options.dlap_share=0.85")
    assert "dlap_share" not in choice           # the config fixed it: nothing chosen
    cap, why = multi_message_s_cap(resolved, data, k=resolved.rknn.k)
    assert resolved.queries.s == cap
    assert "shuffle.max_messages_per_record" in choice["reason"]
    # every client sends the noise of 1 / honest_fraction clients (default 0.5)
    full = multi_message_s_cap(resolved.with_overrides(["privacy.honest_fraction=1.0"]), data,
                               k=resolved.rknn.k)[0]
    assert cap == pytest.approx(full / 2, abs=1)
    # negative-binomial flooding (issue 20 item 5) sends ~3x fewer noise messages per cell
    # than Poisson flooding did: even the 1,079 digits clients now get at least one query
    # per class at 64 messages per client (Poisson flooding left s = 8 < 10 classes)
    assert cap >= data.num_classes


@pytest.mark.parametrize("name", SHUFFLE_CONFIGS)
def test_multi_message_chooses_the_dlap_share_with_the_most_queries(name):
    """Left free, the DLap share is the one of AUTO_DLAP_SHARES whose s (noise rule and
    message cap at that share) is largest, the larger share on a tie; the choice, what each
    share allowed and why are in the choice (report.json utility.auto)."""
    cfg, data, resolved, choice = _resolved(name, "privacy.mechanism=multi")
    per_share = {}
    for share in AUTO_DLAP_SHARES:
        fixed = resolve_auto(cfg.with_overrides([f"privacy.options.dlap_share={share}"]), data)[0]
        per_share[share] = fixed.queries.s
    best = max(AUTO_DLAP_SHARES, key=lambda sh: per_share[sh])
    assert resolved.privacy.options["dlap_share"] == choice["dlap_share"] == best
    assert resolved.queries.s == per_share[best] == choice["s"]
    assert choice["dlap_share_tried"] == {str(sh): v for sh, v in per_share.items()}
    assert f"privacy.options.dlap_share = {best:g}" in choice["reason"]
    # fewer flooding messages per cell buy more queries at the same cap
    assert per_share[best] > per_share[DEFAULT_DLAP_SHARE]
    assert resolved.queries.s >= data.num_classes


def test_the_dlap_share_is_left_alone_unless_it_is_free():
    """s fixed, no message cap, another mechanism, or a share the config set: no choice."""
    for overrides in (["queries.s=40"], ["shuffle.max_messages_per_record=null"],
                      ["privacy.options.dlap_share=0.7"]):
        cfg = load_config("jobs/configs/digits_shuffle.yaml",
                          ["privacy.mechanism=multi", *overrides])
        assert free_dlap_shares(cfg) == ()
    assert free_dlap_shares(load_config("jobs/configs/digits_shuffle.yaml")) == ()   # collision
    cfg = load_config("jobs/configs/digits_shuffle.yaml", ["privacy.mechanism=multi"])
    assert free_dlap_shares(cfg) == AUTO_DLAP_SHARES
    data = prepare_data(cfg)
    resolved, choice = resolve_auto(cfg.with_overrides(["queries.s=40"]), data)
    assert "dlap_share" not in (resolved.privacy.options or {}) and choice is None   # nothing auto


def test_the_message_cap_grows_with_the_records_a_holder_may_keep():
    """shuffle.max_messages_per_record: a holder that may keep B records may send B times the
    messages of a one-record client, so auto s is not cut by its real messages (issue 47);
    one-record clients keep the cap they had; an absolute per-client cap still applies."""
    import dataclasses

    from rknn_ray.mechanisms.stage import message_cap
    cfg = load_config("jobs/configs/digits_shuffle.yaml", ["privacy.mechanism=multi"])
    data = prepare_data(cfg)
    assert message_cap(cfg, data)[0] == 64
    holders = dataclasses.replace(data, record_bound=40)
    assert message_cap(cfg, holders)[0] == 64 * 40
    one, _ = multi_message_s_cap(cfg, data)
    many, why = multi_message_s_cap(cfg, holders)
    assert "x 40 records" in why and many >= one
    both = cfg.with_overrides(["shuffle.max_messages_per_client=100"])
    assert message_cap(both, holders)[0] == 100
