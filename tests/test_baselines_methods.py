"""Each baseline end to end on digits (small student): a row of the report-row schema, a
guarantee with its unit, and its privacy recorded as events in a ledger."""
import numpy as np
import pytest

from dp_accounting import dp_event

from rknn_ray.accounting.accountants import Costing, event_cost
from rknn_ray.accounting import PrivacyLedger
from rknn_ray.accounting.events import (ApproxDpEvent, SelectiveRRDpEvent, SubsampleDpEvent,
                                        event_from_dict, event_to_dict)
from rknn_ray.baselines import dpdfd, dpsgd, nfdp, pate, private_knn
from rknn_ray.baselines.common import BaselineRow, fit_classifiers
from rknn_ray.job.baselines import prepare_baseline
from rknn_ray.baselines.registry import BASELINES, run_baseline
from rknn_ray.baselines.events import dpsgd_event, gnmax_event
from rknn_ray.config import load_config
from rknn_ray.errors import PrivacyBudgetError
from rknn_ray.accounting.guarantee import Guarantee
from rknn_ray.report_row import ROW_FIELDS, ReportRow

ROW_KEYS = {"method", "dataset", "eps", "delta", "unit", "accuracy", "label_accuracy", "rounds",
            "bytes_per_client", "wall_s"}


@pytest.fixture(scope="module")
def setup():
    cfg = load_config("jobs/configs/digits_central.yaml",
                      ["run.progress=false", "student.epochs=2", "student.augment=none"])
    return prepare_baseline(cfg)


def check(result, ledger, event_type, unit="record", target=None):
    """The row (the report-row schema) has the ledger's (eps, delta): exactly the accountant's
    cost of the release's standard event, rebuilt from the ledger, under the choices recorded
    beside it."""
    assert isinstance(result, ReportRow)
    row = result.table_fields()
    assert ROW_KEYS <= set(row) and set(ROW_FIELDS) <= set(row) and "details" not in row
    assert row["unit"] == unit
    assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["label_accuracy"] <= 1.0
    entries = ledger.to_dict()["entries"]
    assert (row["model"], row["mechanism"]) == (entries[0]["model"], entries[0]["mechanism"])
    assert row["ledger_events"] == len(entries)
    assert entries and entries[0]["event"]["type"] == event_type.__name__
    assert entries[0]["unit"] == unit
    ev = event_from_dict(entries[0]["event"])
    assert isinstance(ev, event_type)
    assert event_to_dict(ev) == entries[0]["event"]
    assert "eps" not in entries[0]["event"] or event_type is SelectiveRRDpEvent  # its RR parameter
    costing = Costing.from_dict(entries[0]["accounting"])
    assert (row["eps"], row["delta"]) == event_cost(ev, costing)
    assert (entries[0]["eps"], entries[0]["delta"]) == event_cost(ev, costing)
    if target is not None:
        assert row["eps"] <= target * (1 + 1e-9)
    return row


def test_batched_classifiers_learn(setup):
    y = setup.splits.private_y
    m = fit_classifiers([setup.private_emb], [y], 10, steps=200)
    acc = np.mean(m.predict_proba(setup.eval_emb)[0].argmax(-1) == setup.splits.eval_y)
    assert acc > 0.85


def test_nfdp_on_ray_actors(setup, ray_session):
    from actors.nfdp_shard import RayParties
    led = PrivacyLedger()
    r = nfdp.run_nfdp(setup, 1.0, parties=4, rounds=2, hosts=RayParties, ledger=led)
    row = check(r, led, SubsampleDpEvent, target=1.0)
    k, n = r.details["k"], min(r.details["party_sizes"])
    assert (row["eps"], row["delta"]) == pytest.approx(nfdp.nfdp_epsilon_delta(k, n, True))
    assert r.details["delta_exceeds_1_over_n"] and row["delta"] > 1.0 / n
    assert row["rounds"] == 2 and row["accuracy"] > 0.5
    assert led.to_dict()["entries"][0]["neighbour"] == "add-remove-one"


def test_nfdp_without_replacement_in_process(setup):
    led = PrivacyLedger()
    r = nfdp.run_nfdp(setup, 0.1, replacement=False, rounds=1, mode="logits", ledger=led)
    row = check(r, led, SubsampleDpEvent, target=0.1)
    assert row["method"] == "fedmd_nfdp_wor"
    assert row["delta"] == pytest.approx(r.details["k"] / min(r.details["party_sizes"]))


def test_nfdp_refuses_when_k_would_be_zero(setup):
    with pytest.raises(ValueError, match="k=1"):
        nfdp.run_nfdp(setup, 1e-4)


@pytest.mark.parametrize("agg", ["lnmax", "gnmax"])
def test_pate(setup, agg):
    led = PrivacyLedger()
    r = pate.run_pate(setup, 4.0, 1e-5, aggregator=agg, num_teachers=20,
                      data_dependent=agg == "gnmax", ledger=led)
    check(r, led, dp_event.SelfComposedDpEvent, target=4.0)
    # figures read from the exact votes are NOT PRIVATE: diagnostics, never details
    assert r.diagnostics["plurality_accuracy"] > 0.7 and "plurality_accuracy" not in r.details
    if agg == "gnmax":
        assert "data_dependent_eps_reference_only" in r.diagnostics


def test_private_knn(setup):
    led = PrivacyLedger()
    r = private_knn.run_private_knn(setup, 4.0, 1e-5, gamma=0.3, ledger=led)
    check(r, led, dp_event.SelfComposedDpEvent, target=4.0)
    assert r.diagnostics["noiseless_vote_accuracy"] > 0.7
    assert "noiseless_vote_accuracy" not in r.details


def test_dpsgd_head(setup):
    led = PrivacyLedger()
    r = dpsgd.run_dpsgd(setup, 4.0, 1e-5, epochs=3, ledger=led)
    check(r, led, dp_event.SelfComposedDpEvent, target=4.0)
    assert r.accuracy > 0.5                     # a linear head on PCA-16 digits at eps 4


def test_dpdfd_is_label_level(setup):
    led = PrivacyLedger()
    r = dpdfd.run_dpdfd(setup, 4.0, ledger=led)
    row = check(r, led, SelectiveRRDpEvent, unit="label")
    assert row["eps"] == 4.0 and row["delta"] == 0.0
    assert led.to_dict()["entries"][0]["neighbour"] == "change-one-query-label"
    # a label-level guarantee cannot be composed with record-level ones in one ledger
    led = PrivacyLedger()
    led.record(Guarantee(ApproxDpEvent(1.0, 0.0), "central", "x"), 0)
    with pytest.raises(PrivacyBudgetError):
        led.record(Guarantee(SelectiveRRDpEvent(1.0, 10), "central", "selective_rr",
                             unit="label"), 1)


def test_registry_runs_every_baseline_with_one_signature(setup):
    """The registry names every baseline of the comparison, each run(setup, eps, delta,
    ledger) giving a row of the report-row schema; the adapter fixes what the name says."""
    assert list(BASELINES) == ["fedmd_nfdp", "fedmd_nfdp_wor", "dpdfd_selective_rr",
                               "pate_lnmax", "pate_gnmax", "private_knn", "dpsgd_head"]
    for name, event_type, delta in (("fedmd_nfdp_wor", SubsampleDpEvent, None),
                                    ("pate_lnmax", dp_event.SelfComposedDpEvent, 1e-6)):
        led = PrivacyLedger()
        row = run_baseline(name, setup, 2.0, 1e-6, led)
        assert isinstance(row, BaselineRow) and row.method == name and row.target_eps == 2.0
        check(row, led, event_type, target=2.0)
        if delta is not None:
            assert row.delta == delta                  # the delta the caller asked for
    assert row.mechanism == "pate_lnmax" and row.details["queries"] == setup.queries.size
    with pytest.raises(ValueError, match="unknown baseline 'pate'.*pate_gnmax"):
        run_baseline("pate", setup, 1.0, 1e-5)


def test_baseline_events_cost_in_project_accountants():
    from rknn_ray.accounting.accountants import get_accountant
    at = Costing(delta=1e-5)
    evs = [(gnmax_event(3.0, 3), at), (dpsgd_event(0.1, 1.0, 10), at)]
    each = [event_cost(e, c) for e, c in evs]
    assert each[0] == (pate.pate_epsilon("gnmax", 3.0, 3, 1e-5)[0], 1e-5)
    assert each[1] == (dpsgd.dpsgd_epsilon(0.1, 1.0, 10, 1e-5), 1e-5)
    assert get_accountant("basic").compose(evs) == pytest.approx(
        (each[0][0] + each[1][0], 2e-5), rel=1e-12)
    eps, _ = get_accountant("pld").compose(evs, 1e-4)
    assert eps <= each[0][0] + each[1][0] + 1e-9


def test_baselines_train_the_configs_feature_student_and_resolve_auto_s():
    """student.input: features (Fashion-MNIST's central config) is the student every baseline
    trains too, and queries.s: auto is resolved the way jobs.distill resolves it."""
    from rknn_ray.baselines.common import student_from_query_counts
    cfg = load_config("jobs/configs/digits_central.yaml",
                      ["run.progress=false", "student.epochs=2", "student.input=features",
                       "queries.s=auto", "rknn.k=auto"])
    st = prepare_baseline(cfg)
    assert isinstance(st.cfg.queries.s, int) and st.queries.size == st.cfg.queries.s
    truth = np.eye(st.num_classes)[st.query_truth] * 10.0       # exact-looking query counts
    acc, lab_acc, _ = student_from_query_counts(st, truth)
    assert lab_acc > 0.8 and acc > 0.5       # an MLP on the public PCA features learns them


def test_baseline_privacy_randomness_is_chacha_unless_the_config_asks_for_seeded():
    """Noise, subsamples and randomized response of every baseline come from
    privacy_generator: ChaCha20 keyed from the OS under run.rng=secure (two runs differ),
    a reproducible PCG64 only for a seeded (NOT PRIVATE) simulation."""
    import types

    from randomgen import ChaCha

    from rknn_ray.baselines.common import privacy_generator

    def setup(kind):
        return types.SimpleNamespace(cfg=types.SimpleNamespace(run=types.SimpleNamespace(
            rng=kind, seed=3)))
    a, b = privacy_generator(setup("secure"), 17), privacy_generator(setup("secure"), 17)
    assert isinstance(a.bit_generator, ChaCha)
    assert not np.array_equal(a.normal(size=8), b.normal(size=8))
    c, d = privacy_generator(setup("seeded"), 17), privacy_generator(setup("seeded"), 17)
    assert np.array_equal(c.normal(size=8), d.normal(size=8))
    import inspect

    from rknn_ray.baselines import dpdfd, dpsgd, nfdp, pate, private_knn
    for module in (dpdfd, pate, private_knn):        # no seeded privacy randomness left
        assert "default_rng" not in inspect.getsource(module), module.__name__
    assert "privacy_generator(setup" in inspect.getsource(dpsgd.run_dpsgd)
    assert "make_generator(rng_kind" in inspect.getsource(nfdp.NfdpParties)
