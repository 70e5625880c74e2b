"""The holder's own accountant and identity, in process (tests/test_holder.py runs the
program): the eps it computes from a specification, the ones it refuses, and the
randomness and report ids it derives from its own secret."""
import math

import numpy as np
import pytest

from holder.accountant import SpecRefused, mechanism_of, own_cost
from holder.identity import IdentityError, keygen, load
from sealing.round_spec import EncoderFile, RoundSpec


def spec_of(model="shuffle", mechanism="collision", eps0=1.0, eps=2.0, floor=100, **kw):
    spec = RoundSpec(job_id="j", round=0, opens_at=1, deadline=100, model=model,
                     mechanism=mechanism, mechanism_params={"num_classes": 2}, eps0=eps0,
                     eps=eps, delta=1e-6 if model != "local" else 0.0, min_senders=floor, k=2,
                     connection_rule="rknn", queries=np.zeros((4, 3), np.float32),
                     encoder=(EncoderFile("predictor.json", "ab" * 32, 1),),
                     server_key=bytes(32), shuffler_keys=(bytes(32),), payload_len=1,
                     allowance=1)
    spec = spec.replace(payload_len=mechanism_of(spec, check_length=False).message_size)
    return spec.replace(**kw)


@pytest.mark.parametrize("model, mechanism, eps0, want, colluding", [
    ("shuffle", "collision", 1.0, 0.643689, 1.0),     # amplified at the floor of 100
    ("shuffle", "rr", 2.0, 1.99883, 2.0),
    ("local", "rr", 2.0, 2.0, 2.0),                   # nothing to amplify
    ("central", "laplace", None, 2.0, math.inf),      # the server's noise: no local guarantee
    ("shuffle", "multi", 1.0, 1.9997, math.inf),      # true messages among noise: none either
])
def test_the_holder_recomputes_each_models_eps(model, mechanism, eps0, want, colluding):
    spec = spec_of(model, mechanism, eps0)
    cost = own_cost(spec, mechanism_of(spec))
    assert cost.eps == pytest.approx(want, rel=1e-4) and cost.colluding_eps == colluding
    assert f"claimed eps={spec.eps:g}" in cost.note


def test_assuming_collusion_charges_eps0_and_refuses_a_mechanism_without_one():
    spec = spec_of()
    cost = own_cost(spec, mechanism_of(spec), assume_collusion=True)
    assert (cost.eps, cost.delta) == (1.0, 0.0) and cost.amplified_eps < 0.7
    assert cost.event == {"type": "LocalRandomizerDpEvent", "mechanism": "collision", "eps": 1.0}
    multi = spec_of(mechanism="multi")
    with pytest.raises(SpecRefused, match="no guarantee if the shuffler colludes"):
        own_cost(multi, mechanism_of(multi), assume_collusion=True)


def test_an_inconsistent_or_understated_specification_is_refused():
    with pytest.raises(SpecRefused, match="claims eps=0.5 but this holder's accountant computes "
                                          "eps=0.643689"):
        spec = spec_of(eps=0.5)
        own_cost(spec, mechanism_of(spec))
    with pytest.raises(SpecRefused, match="says messages of 3 bytes, but its mechanism makes 9"):
        mechanism_of(spec_of(payload_len=3))
    with pytest.raises(SpecRefused, match="cannot be built here"):
        mechanism_of(spec_of().replace(mechanism="nonesuch"))


def test_ids_and_coins_come_from_the_holders_secret_and_the_spec(tmp_path):
    me = keygen(tmp_path / "me")
    back = load(tmp_path / "me")
    assert (back.key_id, back.secret) == (me.key_id, me.secret) and len(me.key_id) == 64
    a, b = bytes(32), bytes([1] * 32)
    assert (me.report_ids(a, 3) == load(tmp_path / "me").report_ids(a, 3)).all()
    assert len({r.tobytes() for r in np.vstack([me.report_ids(a, 3), me.report_ids(b, 3)])}) == 6
    assert me.generator(a).integers(1 << 62) == me.generator(a).integers(1 << 62)
    assert me.generator(a).integers(1 << 62) != keygen(tmp_path / "other").generator(a).integers(1 << 62)
    (tmp_path / "me" / "holder.secret").chmod(0o644)
    with pytest.raises(IdentityError, match="readable by others; chmod 600"):
        load(tmp_path / "me")
