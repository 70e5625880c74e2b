"""Adaptive rounds (rknn_ray/labeling/adaptive.py): round t >= 1 picks queries where the interim
student is least certain, from public embeddings and released-derived labels only."""
import inspect

import numpy as np
import pytest

from rknn_ray.labeling.adaptive import (UNCERTAINTY_RULES, interim_student_probs, select_uncertain,
                               uncertainty)
from rknn_ray.accounting.guarantee import guarantee_of
from rknn_ray.job.rounds import next_round_uncertain


def _blobs(seed=0, per=60, centres=((0, 0), (10, 0), (0, 10), (10, 10))):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(c, 0.5, size=(per, 2)) for c in centres]).astype(np.float32)
    return x


def _probs_with_uncertain(n, uncertain, classes=4, seed=0):
    """Confident rows everywhere except ``uncertain`` (graded: later rows less certain)."""
    p = np.full((n, classes), 0.01)
    p[:, 0] = 1 - 0.01 * (classes - 1)
    for rank, i in enumerate(uncertain):
        gap = 0.3 * (1 - rank / max(1, len(uncertain)))     # margins 0.3 .. ~0
        p[i] = 0.0
        p[i, 0], p[i, 1] = 0.5 + gap / 2, 0.5 - gap / 2
    return p


def test_uncertainty_rules_on_known_rows():
    p = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.7, 0.2, 0.1]])
    assert uncertainty(p, "margin") == pytest.approx([0.0, 1.0, 1.0, 0.5])
    ent = uncertainty(p, "entropy")
    assert ent[0] == pytest.approx(0.0, abs=1e-9) and ent[2] == pytest.approx(1.0)
    assert ent[1] == pytest.approx(np.log(2) / np.log(3))
    assert set(UNCERTAINTY_RULES) == {"margin", "entropy"}
    with pytest.raises(ValueError, match="unknown uncertainty"):
        uncertainty(p, "variance")


@pytest.mark.parametrize("rule", UNCERTAINTY_RULES)
def test_picks_the_least_certain_free_samples(rule):
    x = _blobs()
    uncertain = np.array([5, 70, 130, 190, 200, 11, 75, 140])
    p = _probs_with_uncertain(len(x), uncertain)
    taken = np.array([0, 60, 120, 180])
    qs, info = select_uncertain(x, p, taken, s=8, seed=3, rule=rule, pool_factor=1.0)
    assert sorted(qs.public_index.tolist()) == sorted(uncertain.tolist())     # pool = picks
    assert info["pool"] == 8 and info["rule"] == f"uncertain/{rule}"
    assert info["uncertainty_chosen"] > info["uncertainty_all"]
    np.testing.assert_array_equal(qs.features, x[qs.public_index])
    assert qs.assignment.shape == (len(x),) and qs.assignment.max() < 8


def test_disjoint_from_earlier_queries_even_where_they_are_least_certain():
    x = _blobs()
    uncertain = np.arange(0, 240, 10)
    p = _probs_with_uncertain(len(x), uncertain)
    taken = uncertain[:12]                      # the most uncertain are queries already
    qs, info = select_uncertain(x, p, taken, s=12, seed=0, pool_factor=1.0)
    assert not set(qs.public_index) & set(taken)
    assert sorted(qs.public_index.tolist()) == sorted(uncertain[12:].tolist())
    assert info["free"] == len(x) - 12 and len(set(qs.public_index)) == 12


def test_spreads_picks_over_the_uncertain_pool_and_is_deterministic():
    x = _blobs()
    # the uncertain pool spans all four blobs, but blob 0's samples are the least certain
    uncertain = np.concatenate([np.arange(180, 188), np.arange(120, 128), np.arange(60, 68),
                                np.arange(0, 20)])             # graded: blob 0 last = least certain
    p = _probs_with_uncertain(len(x), uncertain)
    qs, _ = select_uncertain(x, p, np.array([], np.int64), s=8, seed=1, pool_factor=5.0)
    blobs_hit = set((qs.public_index // 60).tolist())
    assert blobs_hit == {0, 1, 2, 3}            # k-means over the pool, not the top 8 of one blob
    assert set(qs.public_index) <= set(uncertain)
    again, info_again = select_uncertain(x, p, np.array([], np.int64), s=8, seed=1, pool_factor=5.0)
    np.testing.assert_array_equal(qs.public_index, again.public_index)
    top8, _ = select_uncertain(x, p, np.array([], np.int64), s=8, seed=1, pool_factor=1.0)
    assert set((top8.public_index // 60).tolist()) == {0}


def test_refuses_more_queries_than_free_public_samples():
    x = _blobs(per=5)
    p = _probs_with_uncertain(len(x), np.arange(5))
    with pytest.raises(ValueError, match="not yet queries"):
        select_uncertain(x, p, np.arange(15), s=6, seed=0)


def test_selection_inputs_are_public_or_released_only():
    """select_uncertain's signature admits nothing private: embeddings of public samples,
    the interim student's probabilities, earlier query indices, and knobs."""
    params = set(inspect.signature(select_uncertain).parameters)
    assert params == {"public_emb", "probs", "taken", "s", "seed", "rule", "pool_factor"}
    params = set(inspect.signature(interim_student_probs).parameters)
    assert params == {"public_emb", "targets", "weight", "num_classes", "label_type", "seed",
                      "epochs"}


def test_next_round_never_reads_private_records_or_public_labels():
    """The driver's glue on real digits and a real central release: replacing every private
    record by NaN and shuffling private and public labels leaves the selection unchanged."""
    import dataclasses

    from rknn_ray.job.session import RoundResult
    from rknn_ray.config import load_config
    from rknn_ray.job.stages import fit_queries
    from rknn_ray.data.prepared import prepare_data
    from rknn_ray.labeling.stage import exact_answers
    from rknn_ray.mechanisms.stage import mechanism_for

    cfg = load_config("jobs/configs/digits_central.yaml",
                      ["rounds.count=2", "rounds.query_selection=uncertain", "queries.restarts=1"])
    data = prepare_data(cfg)
    encoder, public_emb, qs0 = fit_queries(cfg, data)
    exact = exact_answers(encoder, data, qs0, cfg.rknn.k).counts()
    mech = mechanism_for(cfg, data, eps=0.5, model="central", name="laplace")
    noisy = exact + np.random.default_rng(0).laplace(0, 2 / 0.5, exact.shape)   # a release
    g = guarantee_of(mech, data.num_clients)
    rnd = RoundResult(noisy, g, None, {}, 0, 0, 0, {})
    picked, info = next_round_uncertain(cfg, data, [rnd], [qs0], public_emb, seed=1)
    assert picked.size == cfg.queries.s and not set(picked.public_index) & set(qs0.public_index)
    assert info["uncertainty_chosen"] >= info["uncertainty_free"]
    assert 0 <= info["interim_agreement_released"] <= 1 and info["post_processing"] is True

    sp = data.splits
    rng = np.random.default_rng(7)
    blind = dataclasses.replace(sp, private_x=np.full_like(sp.private_x, np.nan),
                                private_y=rng.permutation(sp.private_y),
                                public_y=rng.permutation(sp.public_y))
    again, info2 = next_round_uncertain(cfg, dataclasses.replace(data, splits=blind), [rnd], [qs0],
                                        public_emb, seed=1)
    np.testing.assert_array_equal(picked.public_index, again.public_index)
    assert info2["uncertainty_chosen"] == pytest.approx(info["uncertainty_chosen"])


def test_round_query_counts_each_round_or_split():
    from rknn_ray.config import load_config
    from rknn_ray.labeling.stage import round_query_counts
    assert round_query_counts(load_config(None, ["queries.s=60", "rounds.count=3"])) == [60] * 3
    split = ["queries.s=61", "rounds.count=3", "rounds.split_queries=true"]
    assert round_query_counts(load_config(None, split)) == [21, 20, 20]
    assert round_query_counts(load_config(None, ["queries.s=61"])) == [61]


def test_rknn_ray_report_names_each_rounds_selection():
    from jobs.report import run_sections
    report = {"privacy": {"rounds": [{}, {}]}, "counts": {}, "accuracy": {},
              "timings_s": {"round_0": 1.0, "round_1": 1.0, "select_1": 2.0},
              "selection": [{"round": 0, "rule": "kmeans", "queries": 30},
                            {"round": 1, "rule": "uncertain/margin", "queries": 30, "pool": 60,
                             "uncertainty_chosen": 0.8, "uncertainty_all": 0.5}]}
    sections = dict(run_sections({"report": report, "path": "run", "incomplete": None}))
    counts = dict(sections["Counts"])
    assert counts["round 2 queries"] == ("uncertain/margin: 30 among the 60 least certain "
                                         "(uncertainty 0.8 vs 0.5 over all public)")
    times = dict(sections["Timings"])
    assert times["round 2 query selection"] == "2.0 s" and times["round 1"] == "1.0 s"
    assert times["total of the stages"] == "4.0 s"
