"""Sealed reports: round trip, fixed length, and every kind of bad report rejected and counted."""
import os
import pickle
import stat

import numpy as np
import pyarrow as pa
import pytest

from rknn_ray.errors import ConfigError
from sealing.envelope import (CONTEXT_LEN, HEADER_LEN, SEAL_CHUNK, RoundContext, ciphertext_len,
                               from_arrow, report_ids_from_key, seal_batch, to_arrow)
from sealing.onion import seal_onion
from sealing.replay import ReplayGuard
from shuffler.layers import LayerKeyPair, LayerPeeler
from server.keys import ServerKeyPair
from server.opening import REJECT_KINDS, ReportOpener

CTX = RoundContext("job-a", 7)


@pytest.fixture(scope="module")
def keypair():
    return ServerKeyPair.generate()


def payloads(m, length=12, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (m, length), dtype=np.uint8)


def opened_and_rejects(opener, ciphertexts):
    out = opener.open_batch(ciphertexts)
    return out.payloads, out.rejects


def rejects_only(counter, **expected):
    want = dict.fromkeys(REJECT_KINDS, 0)
    want.update(expected)
    assert dict(counter) == want


def test_round_trip_fixed_length_and_randomized(keypair):
    p = payloads(50)
    ct = seal_batch(keypair.public_bytes(), p, CTX, pad_to=40)
    assert ct.shape == (50, ciphertext_len(40)) == (50, HEADER_LEN + 16 + 2 + 40 + 16)
    opened, rej = opened_and_rejects(ReportOpener(keypair, CTX, payload_len=12), ct)
    assert np.array_equal(opened, p)
    rejects_only(rej)
    # same message sealed twice gives unrelated ciphertexts (fresh ephemeral key each time)
    again = seal_batch(keypair.public_bytes(), p, CTX, pad_to=40)
    assert not np.any(np.all(again[:, CONTEXT_LEN:] == ct[:, CONTEXT_LEN:], axis=1))


def test_padding_hides_message_length(keypair):
    short = seal_batch(keypair.public_bytes(), payloads(3, 4), CTX, pad_to=32)
    long = seal_batch(keypair.public_bytes(), payloads(3, 32), CTX, pad_to=32)
    assert short.shape == long.shape
    # the clear header carries only version, layer, job tag, round (identical) + ephemeral key
    assert np.array_equal(short[:, :CONTEXT_LEN], long[:, :CONTEXT_LEN])
    with pytest.raises(ValueError, match="pad_to"):
        seal_batch(keypair.public_bytes(), payloads(1, 33), CTX, pad_to=32)


def test_flipped_byte_anywhere_after_header_is_tampered(keypair):
    ct = seal_batch(keypair.public_bytes(), payloads(20), CTX)
    bad = ct.copy()
    cols = np.arange(20) % (ct.shape[1] - CONTEXT_LEN) + CONTEXT_LEN   # eph key, body or tag
    bad[np.arange(20), cols] ^= 0x01
    opened, rej = opened_and_rejects(ReportOpener(keypair, CTX, 12), np.concatenate([bad, ct]))
    assert len(opened) == 20
    rejects_only(rej, tampered=20)


def test_wrong_round_and_wrong_job_are_told_apart_from_tampering(keypair):
    pub = keypair.public_bytes()
    other_round = seal_batch(pub, payloads(3), RoundContext("job-a", 8))
    other_job = seal_batch(pub, payloads(4), RoundContext("job-b", 7))
    good = seal_batch(pub, payloads(5), CTX)
    opened, rej = opened_and_rejects(ReportOpener(keypair, CTX, 12), np.concatenate([other_round, good, other_job]))
    assert len(opened) == 5
    rejects_only(rej, wrong_round=3, wrong_job=4)
    # rewriting the clear header to claim this round breaks the AEAD binding: tampered
    forged = other_round.copy()
    forged[:, :CONTEXT_LEN] = good[0, :CONTEXT_LEN]
    _, rej = opened_and_rejects(ReportOpener(keypair, CTX, 12), forged)
    rejects_only(rej, tampered=3)


def test_report_ids_survive_sealing_and_a_resealed_report_keeps_its_id(keypair):
    """A retried client re-seals the same report under a fresh ephemeral key: the
    ciphertexts differ, the report id does not (the accumulator counts it once)."""
    pub = keypair.public_bytes()
    ids = report_ids_from_key(bytes(32), 6)
    assert np.array_equal(ids, report_ids_from_key(bytes(32), 6))          # derived, stable
    assert not np.array_equal(ids, report_ids_from_key(b"\x01" + bytes(31), 6))
    assert len({bytes(r) for r in ids}) == 6
    first = seal_batch(pub, payloads(6), CTX, report_ids=ids)
    again = seal_batch(pub, payloads(6), CTX, report_ids=ids)
    assert not np.array_equal(first, again)
    o1, o2 = [ReportOpener(keypair, CTX, 12).open_batch(c) for c in (first, again)]
    assert np.array_equal(o1.report_ids, o2.report_ids)
    assert np.array_equal(o1.report_ids, ids.view("S16").ravel())
    assert not np.array_equal(o1.eph_pubs, o2.eph_pubs)
    guard = ReplayGuard(16)
    assert guard.fresh(o1.report_ids).all() and not guard.fresh(o2.report_ids).any()
    # without ids every report gets fresh random ones
    r1 = ReportOpener(keypair, CTX, 12).open_batch(seal_batch(pub, payloads(6), CTX)).report_ids
    assert len(set(r1.tolist())) == 6 and not set(r1.tolist()) & set(o1.report_ids.tolist())
    # a replay into the next round is refused by its header
    opener = ReportOpener(keypair, CTX, 12)
    opener.start_round(8)
    rejects_only(opener.open_batch(first[:1]).rejects, wrong_round=1)


@pytest.mark.parametrize("junk", [
    np.zeros((3, 10), np.uint8),                  # too short to hold a header and a tag
    np.zeros((4, 120), np.float32),               # wrong dtype
    np.zeros(100, np.uint8),                      # not 2-D
    [[1, 2, 3]],                                  # not an array at all
])
def test_malformed_input_is_counted_never_raised(keypair, junk):
    opened, rej = opened_and_rejects(ReportOpener(keypair, CTX, 12), junk)
    assert len(opened) == 0 and rej["malformed"] >= 1
    assert sum(v for k, v in rej.items() if k != "malformed") == 0


def test_version_layer_length_and_padding_violations_are_malformed(keypair):
    pub = keypair.public_bytes()
    ct = seal_batch(pub, payloads(4), CTX, pad_to=16)
    bad_version = ct[:1].copy()
    bad_version[0, 0] = 9
    layered = seal_batch(pub, payloads(1), CTX, pad_to=16, layer=1)     # still wrapped for a hop
    other_len = seal_batch(pub, payloads(2, 16), CTX, pad_to=16)        # honest crypto, wrong size
    random_rows = np.frombuffer(os.urandom(3 * ct.shape[1]), np.uint8).reshape(3, -1).copy()
    random_rows[:, :CONTEXT_LEN] = ct[0, :CONTEXT_LEN]                  # right header, junk body
    batch = np.concatenate([ct, bad_version, layered, other_len, random_rows])
    opened, rej = opened_and_rejects(ReportOpener(keypair, CTX, payload_len=12), batch)
    assert np.array_equal(opened, payloads(4))
    rejects_only(rej, malformed=1 + 1 + 2, tampered=3)
    # low-order ephemeral key (all-zero shared secret) is rejected, not a crash
    zero_point = ct[:1].copy()
    zero_point[0, CONTEXT_LEN:HEADER_LEN] = 0
    _, rej = opened_and_rejects(ReportOpener(keypair, CTX, 12), zero_point)
    rejects_only(rej, malformed=1)


def test_a_batch_over_several_chunks_keeps_its_order_and_each_reject(keypair):
    """Sealing and opening go one primitive at a time over chunks of SEAL_CHUNK messages:
    a batch spanning three chunks round-trips in order, and bad rows anywhere in it
    (a chunk's first and last row included) are counted and dropped alone."""
    m = 2 * SEAL_CHUNK + 5
    plain = payloads(m, seed=3)
    ct = seal_batch(keypair.public_bytes(), plain, CTX)
    tampered = [0, SEAL_CHUNK - 1, 2 * SEAL_CHUNK + 4]
    low_order = [SEAL_CHUNK, 2 * SEAL_CHUNK]
    ct[tampered, -1] ^= 1
    ct[np.ix_(low_order, np.arange(CONTEXT_LEN, HEADER_LEN))] = 0
    out = ReportOpener(keypair, CTX, 12).open_batch(ct)
    good = np.setdiff1d(np.arange(m), tampered + low_order)
    assert np.array_equal(out.kept, good) and np.array_equal(out.payloads, plain[good])
    assert len(set(out.eph_pubs.tolist())) == good.size     # a fresh ephemeral key per message
    rejects_only(out.rejects, malformed=2, tampered=3)


def test_fuzzed_batches_never_crash_and_account_for_every_row(keypair):
    rng = np.random.default_rng(3)
    ct = seal_batch(keypair.public_bytes(), payloads(40), CTX)
    opener = ReportOpener(keypair, CTX, 12)
    for trial in range(5):
        bad = ct.copy()
        rows = rng.choice(40, 15, replace=False)
        bad[rows, rng.integers(0, ct.shape[1], 15)] ^= rng.integers(1, 256, 15).astype(np.uint8)
        opened, rej = opened_and_rejects(opener, bad)
        assert len(opened) + sum(rej.values()) == 40
        assert len(opened) >= 25   # the untouched rows open (duplicates are the accumulator's)


def test_another_servers_key_cannot_open(keypair):
    ct = seal_batch(ServerKeyPair.generate().public_bytes(), payloads(5), CTX)
    opened, rej = opened_and_rejects(ReportOpener(keypair, CTX, 12), ct)
    assert len(opened) == 0
    rejects_only(rej, tampered=5)


def test_key_file_is_private_atomic_and_validated(tmp_path, keypair):
    path = keypair.save(tmp_path / "server.key")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["server.key"]   # no temp file left behind
    loaded = ServerKeyPair.load(path)
    assert loaded.public_bytes() == keypair.public_bytes()
    ct = seal_batch(keypair.public_bytes(), payloads(3), CTX)
    assert np.array_equal(ReportOpener(loaded, CTX, 12).open_batch(ct)[0], payloads(3))
    keypair.save(path)   # overwrite in place keeps 0600
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        ServerKeyPair.load(path)
    junk = tmp_path / "junk.key"
    junk.write_bytes(b"not a key")
    os.chmod(junk, 0o600)
    with pytest.raises(ConfigError, match="PEM"):
        ServerKeyPair.load(junk)
    with pytest.raises(ConfigError, match="no key file"):
        ServerKeyPair.load(tmp_path / "missing.key")


def test_private_keys_refuse_to_travel(keypair):
    with pytest.raises(TypeError, match="public_bytes"):
        pickle.dumps(keypair)
    with pytest.raises(TypeError, match="public_bytes"):
        pickle.dumps(LayerKeyPair.generate(1))
    assert keypair.public_bytes().hex()[:16] in repr(keypair)


def test_arrow_round_trip_is_zero_copy_and_respects_slices(keypair):
    ct = seal_batch(keypair.public_bytes(), payloads(10), CTX)
    senders = np.arange(10, dtype=np.int64) * 7
    batch = to_arrow(ct, senders)
    assert batch.schema.names == ["sender", "report"]
    assert batch.schema.field("sender").type == pa.int64()
    assert batch.schema.field("report").type == pa.binary(ct.shape[1])
    back, s = from_arrow(batch)
    assert np.array_equal(back, ct) and np.array_equal(s, senders)
    assert back.ctypes.data == batch.column("report").buffers()[1].address   # no copy
    part, s = from_arrow(batch.slice(3, 4))
    assert np.array_equal(part, ct[3:7]) and np.array_equal(s, senders[3:7])
    only_reports, none = from_arrow(to_arrow(ct))
    assert none is None and np.array_equal(only_reports, ct)
    with pytest.raises(ValueError, match="one sender id per report"):
        to_arrow(ct, senders[:3])


def test_onion_layers_peel_in_order_and_never_open_the_server_layer(keypair):
    hops = [LayerKeyPair.generate(1), LayerKeyPair.generate(2)]
    p = payloads(8)
    ct = seal_onion(keypair.public_bytes(), [h.public_bytes() for h in hops], p, CTX, pad_to=20)
    assert ct.shape[1] == ciphertext_len(20) + 2 * (HEADER_LEN + 16 + 2 + 16)
    # the server cannot skip the chain, and hop 2 cannot peel hop 1's layer
    rejects_only(ReportOpener(keypair, CTX, 12).open_batch(ct).rejects, malformed=8)
    rejects_only(LayerPeeler(hops[1], CTX).peel(ct)[2], malformed=8)
    inner, kept, rej = LayerPeeler(hops[0], CTX).peel(ct)
    assert np.array_equal(kept, np.arange(8))
    rejects_only(rej)
    inner, _, rej = LayerPeeler(hops[1], CTX).peel(inner)
    rejects_only(rej)
    server_layer = inner
    assert np.array_equal(ReportOpener(keypair, CTX, 12).open_batch(server_layer)[0], p)
    # a layer key never opens the server layer, even if the header is relabelled to its layer
    rejects_only(LayerPeeler(hops[0], CTX).peel(server_layer)[2], malformed=8)
    relabelled = server_layer.copy()
    relabelled[:, 1] = 1
    rejects_only(LayerPeeler(hops[0], CTX).peel(relabelled)[2], tampered=8)
    with pytest.raises(ValueError, match="Layer 0 is the server's"):
        LayerKeyPair.generate(0)


def test_wire_format_2_opens_with_only_the_documented_primitives(keypair):
    """An opener written from the module docstring alone (X25519, BLAKE2b-256 of secret |
    ephemeral key | recipient key | label | version | layer, ChaCha20-Poly1305 with a zero
    nonce and job digest | header as associated data) opens what seal_batch made."""
    import hashlib

    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    from sealing.encapsulation import KDF_LABEL, derive_key, parse_public_key
    p = payloads(3, 12)
    ct = seal_batch(keypair.public_bytes(), p, CTX, pad_to=20)
    assert ct[0, 0] == 2 == CTX.version and ct[0, 1] == 0          # version 2, server layer
    recipient = keypair.public_bytes()
    for row, want in zip(ct, p):
        header, sealed = row[:HEADER_LEN].tobytes(), row[HEADER_LEN:].tobytes()
        eph = header[CONTEXT_LEN:]
        secret = keypair.exchange(X25519PublicKey.from_public_bytes(eph))
        key = hashlib.blake2b(secret + eph + recipient + KDF_LABEL + header[:2],
                              digest_size=32).digest()
        assert key == derive_key(secret, eph, recipient, KDF_LABEL + header[:2])
        plain = ChaCha20Poly1305(key).decrypt(bytes(12), sealed, CTX.job_digest + header)
        assert int.from_bytes(plain[16:18], "big") == 12
        assert plain[18:30] == want.tobytes() and plain[30:] == bytes(8)
        # the fast parse is the public API's key: same secret, same refusals
        assert keypair.exchange(parse_public_key(eph)) == secret
    with pytest.raises(ValueError):
        parse_public_key(b"\x01" * 31)
    with pytest.raises(ValueError):           # a low-order point: the exchange refuses it
        keypair.exchange(parse_public_key(bytes(32)))
