"""rknn_ray.rng.GeneratorPool: a re-keyed generator is chacha_generator of its key, draw for
draw, whatever its previous key and draws left behind (counter, block, a buffered half-word);
and derived_key's one-shot HMAC is the HMAC it was."""
import hashlib
import hmac
import os

import numpy as np
import pytest

from rknn_ray.rng import GeneratorPool, chacha_generator, derived_key


def draws(g):
    return (g.integers(0, 2**32, 3, dtype=np.uint32).tolist(), g.random(3).tolist(),
            g.integers(0, 1 << 64, 2, dtype=np.uint64).tolist(), g.integers(0, 7, 5).tolist(),
            g.bit_generator.random_raw(17).tolist(), g.permutation(9).tolist())


def test_rekeyed_generators_draw_as_fresh_ones():
    pool = GeneratorPool()
    for round_ in range(30):
        keys = [os.urandom(32) for _ in range(1 + round_ % 7)]
        got = pool.keyed(keys)
        assert len(got) == len(keys)
        for g, key in zip(got, keys):
            assert draws(g) == draws(chacha_generator(key))
            g.integers(0, 2**32, round_ % 3 + 1, dtype=np.uint32)   # leave state behind
            assert g.bit_generator.state["state"]["rounds"] == 20


def test_a_pool_refuses_a_wrong_key_length():
    with pytest.raises(ValueError):
        GeneratorPool().keyed([bytes(31)])


def test_derived_key_is_hmac_sha256_of_its_labels():
    secret = os.urandom(32)
    msg = b"rknn-ray/derive" + b"\x00randomize" + b"\x00abc" + b"\x003"
    assert derived_key(secret, "randomize", "abc", 3) == hmac.new(secret, msg, hashlib.sha256).digest()
