"""Who hides whom in the shuffle model (issue 18; issue 21 item 1).

* Single message: the amplification counts the reports the server actually opened,
  assumed honest (``privacy.honest_fraction``), not the authenticated senders; a round
  that misses its target once opened is recorded at its true cost and refused.
* Multi-message: every client sends the noise shares of m = ceil(gamma n) clients, so
  any m honest senders leave the full noise the accountant's event describes; below m
  the guarantee is void (the audit's 10-of-1,000 experiment).
"""
import json

import numpy as np
import pytest

from rknn_ray.accounting import BOUNDS
from rknn_ray.accounting.accountants import event_cost
from rknn_ray.accounting.events import event_from_dict, event_to_dict
from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.config import load_config
from rknn_ray.errors import ConfigError
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.mechanisms.base import honest_count
from rknn_ray.rng import seeded_generator
from tests.digits_rounds import digits_cfg
from rknn_ray.accounting.guarantee import guarantee_of

DIGITS_N = 1079             # private digits records = clients (digits_shuffle.yaml)
GARBAGE = len(range(0, DIGITS_N, 10))      # clients whose id is a multiple of 10: 108


def _answers(n, s=10, c=10, seed=0):
    rng = np.random.default_rng(seed)
    nb = np.argsort(rng.random((n, s)), axis=1)[:, :1]
    return RecordAnswers(nb, rng.integers(0, c, (n, 1)), np.arange(n), s, c)


# ---------------------------------------------------------------- single message (issue 18)

def test_single_message_counts_opened_reports_assumed_honest():
    params = MechanismParams(10, 10, 1, 2.0, delta=1e-6, num_clients=DIGITS_N)
    mech = build("shuffle", "collision", params)
    assert mech.honest_fraction == 1.0 and mech.min_senders() == DIGITS_N
    opened = DIGITS_N - GARBAGE
    event = mech.round_event(DIGITS_N, opened)
    g = guarantee_of(mech, DIGITS_N, event, opened=opened)
    # n is the reports opened, not the authenticated senders
    assert g.n == event.num_senders == opened and event.reports_opened == opened
    expected = BOUNDS["clones_numerical"].central_eps(mech.local_eps, opened, 1e-6)
    assert g.eps == pytest.approx(expected) == pytest.approx(event_cost(event)[0])
    assert g.eps > 2.0                          # the target missed: the caller refuses
    assert event_from_dict(json.loads(json.dumps(event_to_dict(event)))) == event

    # assume 15% of senders may be corrupt: eps0 planned for ceil(0.85 n), and a tenth of
    # garbage stays inside the assumption
    hedged = build("shuffle", "collision", MechanismParams(
        10, 10, 1, 2.0, delta=1e-6, num_clients=DIGITS_N, options={"honest_fraction": 0.85}))
    assert hedged.local_eps < mech.local_eps
    assert hedged.cover(DIGITS_N, opened) == honest_count(0.85, DIGITS_N) == 918
    e2 = hedged.round_event(DIGITS_N, opened)
    g2 = guarantee_of(hedged, DIGITS_N, e2, opened=opened)
    assert g2.eps <= 2.0 * (1 + 1e-9) and g2.eps == pytest.approx(event_cost(e2)[0])
    assert "honest fraction 0.85" in g2.note
    # more visibly corrupt senders than assumed: the fraction applies to what opened
    assert hedged.cover(DIGITS_N, 800) == honest_count(0.85, 800) == 680
    floor, need = hedged.min_senders(), hedged.min_cover()     # authenticated floor, cover
    assert honest_count(0.85, floor) >= need > honest_count(0.85, floor - 1)


def test_a_release_never_costs_more_than_the_local_eps0():
    mech = build("shuffle", "rr", MechanismParams(10, 10, 1, 2.0, delta=1e-6,
                                                  num_clients=DIGITS_N))
    event = mech.round_event(DIGITS_N, 1)        # one report opened: nobody to hide among
    g = guarantee_of(mech, DIGITS_N, event, opened=1)
    assert (g.eps, g.delta) == (pytest.approx(mech.local_eps), 0.0)
    assert event_cost(event) == (pytest.approx(mech.local_eps), 0.0)


def test_honest_fraction_is_validated_and_has_one_home():
    with pytest.raises(ConfigError, match="privacy.honest_fraction"):
        load_config("jobs/configs/digits_shuffle.yaml", ["privacy.honest_fraction=0"])
    with pytest.raises(ConfigError, match="set by privacy.honest_fraction"):
        load_config("jobs/configs/digits_shuffle.yaml", ["privacy.options.honest_fraction=0.5"])
    with pytest.raises(ConfigError, match="privacy.honest_fraction"):
        build("shuffle", "multi", MechanismParams(4, 3, 1, 1.0, delta=1e-6, num_clients=100,
                                                  options={"honest_fraction": 1.5}))


def _garbage_parties():
    """Every shard's clients with an id divisible by 10 send garbage (tests/faulty_parties.py)."""
    from rknn_ray.job.session import Parties
    from tests.faulty_parties import garbage_shard
    return Parties(shard=garbage_shard(10))


def _two_rounds(parties, overrides_per_round):
    """One session, one round per config override list (the same shards, the same faults)."""
    from rknn_ray.job.progress import Progress
    from rknn_ray.job.session import ProtocolSession
    from rknn_ray.accounting import PrivacyLedger
    from rknn_ray.job.stages import fit_queries
    from rknn_ray.data.prepared import prepare_data
    from rknn_ray.data.sources import dataset_sources
    from rknn_ray.mechanisms.stage import mechanism_for
    cfg = digits_cfg()
    data = prepare_data(cfg)
    enc, _, qs = fit_queries(cfg, data)
    out = []
    with ProtocolSession(cfg, dataset_sources(cfg, data), "job-cover", progress=Progress(False),
                         parties=parties) as session:
        for t, overrides in enumerate(overrides_per_round):
            c = digits_cfg(*overrides)
            ledger = PrivacyLedger(budget_eps=c.privacy.eps, budget_delta=c.privacy.delta)
            mech = mechanism_for(c, data)
            try:
                out.append((mech, ledger, session.run_round(t, mech, enc, qs.features, ledger)))
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                out.append((mech, ledger, exc))
    return out


def test_a_tenth_sending_garbage_gives_the_eps_of_the_opened_reports(ray_session):
    """The issue's experiment on real actors: 108 of 1,079 clients send random bytes under
    valid credentials. The shuffler admits all 1,079 (the old n); the server opens 971. The
    round is recorded at the accountant's eps for n = 971 and refused for labelling. The
    same attack inside an assumed honest fraction of 0.85 is admitted with n = 918."""
    from rknn_ray.job.session import CoverShortfall
    (mech, ledger, exc), (mech2, ledger2, res) = _two_rounds(
        _garbage_parties(), [[], ["privacy.honest_fraction=0.85"]])
    assert isinstance(exc, CoverShortfall), exc
    opened = DIGITS_N - GARBAGE
    (entry,) = ledger.entries
    assert entry.guarantee.n == opened and entry.event.num_senders == opened
    accountant = mech.bound.central_eps(mech.local_eps, opened, 1e-6)   # the config's bound
    assert entry.guarantee.eps == pytest.approx(accountant)
    assert event_cost(entry.event, mech.costing())[0] == pytest.approx(accountant)
    assert accountant > 2.0
    assert ledger.spent()[0] == pytest.approx(accountant)       # spent, over the budget
    assert exc.guarantee == entry.guarantee
    msg = str(exc)
    assert "refused for labelling" in msg and f"opened {opened} reports" in msg
    assert f"of {DIGITS_N} authenticated senders" in msg and f"tampered {GARBAGE}" in msg
    assert "privacy.honest_fraction" in msg                      # the fix

    assert not isinstance(res, Exception), res
    assert res.authenticated_senders == DIGITS_N and res.messages == opened
    assert res.rejected["tampered"] == GARBAGE
    assert res.guarantee.n == 918 and res.guarantee.eps <= 2.0 * (1 + 1e-9)
    assert res.guarantee.eps == pytest.approx(event_cost(res.event, mech2.costing())[0])
    assert ledger2.entries[0].event.reports_opened == opened


def test_the_job_commits_a_refused_round_at_its_true_cost(ray_session, tmp_path, monkeypatch,
                                                         capsys, isolated_privacy_ledger):
    import functools

    import jobs.distill as distill
    from rknn_ray.accounting.budget_store import BudgetStore
    monkeypatch.setattr(distill, "run", functools.partial(distill.run,
                                                          parties=_garbage_parties()))
    out = tmp_path / "garbage"
    code = distill.main(["--config", "jobs/configs/digits_shuffle.yaml", "--out", str(out),
                         "--quiet", "--insecure-seeded", "--set", "run.rng=seeded",
                         "--set", "queries.s=10", "--set", "queries.restarts=1"])
    err = capsys.readouterr().err
    assert code == 2 and "refused for labelling" in err and "Traceback" not in err
    assert "nothing was released" not in err and "eps is counted in the ledger" in err
    assert not (out / "report.json").exists() and not (out / "release.npz").exists()
    marker = json.loads((out / "incomplete.json").read_text())
    assert "eps stays counted" in marker["next_step"]
    (dataset,) = BudgetStore(str(isolated_privacy_ledger)).datasets()
    (row,) = [r for r in dataset["releases"] if r["status"] == "released"]
    assert "refused for labelling" in row["note"] and row["eps"] > 2.0
    assert dataset["spent"]["eps"] == pytest.approx(row["eps"])   # the rest was given back


# ---------------------------------------------------------------- multi-message (issue 21.1)

@pytest.mark.parametrize("honest", [1000, 500, 10])
def test_withheld_noise_leaves_what_the_guarantee_needs_at_the_honest_fraction(honest):
    """The audit's experiment: n = 1,000, s = 10 (|Y| = 10), eps = 1, delta = 1e-6; only
    ``honest`` clients send their noise shares, the rest their true messages alone. With
    the default honest fraction 0.5, 500 or more honest senders leave at least the
    DLap(p) + flooding the accountant's event is costed with; 10 leave almost nothing."""
    n = 1000
    mech = build("shuffle", "multi", MechanismParams(10, 10, 1, 1.0, delta=1e-6, num_clients=n))
    event = mech.event()
    assert (mech.honest_fraction, mech.n_honest) == (0.5, 500)
    assert (event.honest_fraction, event.noise_senders) == (0.5, 500)
    assert event_cost(event)[0] == pytest.approx(mech.cal.eps) and mech.cal.eps <= 1.0
    assert "at least 500 senders follow the protocol" in guarantee_of(mech).note
    p = event.dlap_p
    needed = 2 * p / (1 - p) ** 2                 # the variance of DLap(p): what eps rests on
    ans = _answers(n)
    exact = ans.counts().ravel()
    honest_ans = RecordAnswers(ans.neighbors[:honest], ans.labels[:honest],
                               ans.client_ids[:honest], 10, 10)
    rest = (ans.neighbors[honest:, 0] * 10 + ans.labels[honest:, 0])   # true messages only
    noise = []
    for i in range(40):
        stat = mech.statistic(mech.randomize(honest_ans, seeded_generator(i)).payloads)
        noise.append(stat + np.bincount(rest, minlength=100) - exact)
    noise = np.concatenate(noise)
    share = honest / mech.n_honest                # NB(h/m) per sign: h/m of the variance
    exact_cells = float((noise == 0).mean())
    if honest >= mech.n_honest:
        assert noise.var() == pytest.approx(share * needed, rel=0.15)
        assert noise.var() >= 0.85 * needed
        # with exactly m honest senders the noise is DLap(p): P[0] = (1-p)/(1+p)
        if honest == mech.n_honest:
            assert exact_cells == pytest.approx((1 - p) / (1 + p), abs=0.03)
    else:
        assert noise.var() < 0.1 * needed         # h/m = 2% of it (heavy-tailed: loose check)
        assert exact_cells > 0.9                  # the attack: counts come out exact


def test_the_allowance_grows_with_the_larger_shares():
    """Honest clients send m-client shares: the per-sender cap must let them all through."""
    n = 1000
    mk = lambda g: build("shuffle", "multi", MechanismParams(  # noqa: E731
        10, 10, 1, 1.0, delta=1e-6, num_clients=n, options={"honest_fraction": g}))
    full, half = mk(1.0), mk(0.5)
    assert half.noise_cap > full.noise_cap and half.n_honest == 500
    assert half.messages_per_sender() == 1 + half.noise_cap
    batch = half.randomize(_answers(n), seeded_generator(3))
    per_sender = np.bincount(batch.senders, minlength=n)
    assert per_sender.max() <= half.messages_per_sender()
    # expected noise messages per client double with m = n / 2
    assert half.cal.noise_messages_per_client > 1.8 * full.cal.noise_messages_per_client


def test_the_error_bound_sums_the_nb_difference_tail_exactly():
    """nb_difference_quantile at shape 1 is the discrete Laplace's closed-form quantile
    (P[|Z| > t] = 2 p^(t+1) / (1 + p)); more shape, more noise, a larger bound."""
    import math as _m

    from rknn_ray.mechanisms.shuffle_multi import nb_difference_quantile
    for p in (0.3, 0.65, 0.9):
        for beta in (0.05, 1e-3):
            closed = next(t for t in range(10_000) if 2 * p ** (t + 1) / (1 + p) <= beta)
            assert nb_difference_quantile(1.0, p, beta) == closed
        assert nb_difference_quantile(2.0, p, 0.01) > nb_difference_quantile(1.0, p, 0.01)
    mech = build("shuffle", "multi", MechanismParams(10, 10, 1, 1.0, delta=1e-6, num_clients=1000))
    assert mech.error_bound(0.05) == nb_difference_quantile(2.0, mech.cal.dlap_p, 0.05 / 10)
    assert _m.isfinite(mech.error_bound(0.05))
