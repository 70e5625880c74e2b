"""``queries.s: auto`` follows the mechanism (issue 20): every shuffle config leaves s to the
rule, so switching privacy.mechanism alone gives that mechanism's setting. Single-message
Collision, whose per-count error exceeds the counts at any s, gets s = |Y|; multi-message
gets the noise rule's s capped by the messages a client may send."""
import os

import pytest

from rknn_ray.config import load_config
from rknn_ray.pipeline import multi_message_s_cap, prepare_data, resolve_auto

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
def test_collision_gets_one_query_per_class(name):
    cfg, data, resolved, choice = _resolved(name)
    assert cfg.privacy.mechanism == "collision"
    assert resolved.queries.s == data.num_classes == 10
    assert "clipped to [10," in choice["reason"]


@pytest.mark.parametrize("name", SHUFFLE_CONFIGS)
def test_multi_message_gets_the_capped_noise_rule(name):
    cfg, data, resolved, choice = _resolved(name, "privacy.mechanism=multi")
    cap, why = multi_message_s_cap(resolved, data, k=resolved.rknn.k)
    assert resolved.queries.s == cap
    assert "shuffle.max_messages_per_client" in choice["reason"]
    # every client sends the noise of 1 / honest_fraction clients (default 0.5)
    full = multi_message_s_cap(resolved.with_overrides(["privacy.honest_fraction=1.0"]), data,
                               k=resolved.rknn.k)[0]
    assert cap == pytest.approx(full / 2, abs=1)
    # negative-binomial flooding (issue 20 item 5) sends ~3x fewer noise messages per cell
    # than Poisson flooding did: even the 1,079 digits clients now get at least one query
    # per class at 64 messages per client (Poisson flooding left s = 8 < 10 classes)
    assert cap >= data.num_classes
