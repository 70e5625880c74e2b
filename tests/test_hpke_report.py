"""HPKE reports (sealing.hpke_report): what binds, what is refused, and who can open what."""
import numpy as np
import pytest

from sealing.hpke_open import Refused, open_record
from sealing.hpke_report import (ENC_LEN, HEADER_LEN, LAYER_OVERHEAD, pack_header, record_len,
                                 seal_layer, seal_report, seal_reports, unpack_header)
from server.hpke_opening import HpkeReportOpener
from server.keys import ServerKeyPair
from shuffler.hpke_peel import HpkeLayerPeeler
from shuffler.layers import LayerKeyPair

SPEC = b"\x11" * 32
OTHER_SPEC = b"\x22" * 32
RID = b"\x07" * 16


@pytest.fixture(scope="module")
def keys():
    return ServerKeyPair.generate(), LayerKeyPair.generate(1)


def payloads(m=6, length=5, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (m, length), dtype=np.uint8)


def test_round_trip_and_lengths(keys):
    server, _ = keys
    p = payloads()
    rows = seal_reports(server.public_bytes(), p, SPEC)
    assert rows.shape == (6, record_len(5)) == (6, 5 + LAYER_OVERHEAD)
    out = HpkeReportOpener(server, SPEC, 5).open_batch(rows)
    np.testing.assert_array_equal(out.plaintexts, p)
    assert out.kept.tolist() == list(range(6)) and len(set(out.report_ids.tolist())) == 6


def test_header_is_clear_and_ids_are_the_senders(keys):
    server, _ = keys
    ids = np.arange(16 * 3, dtype=np.uint8).reshape(3, 16)
    rows = seal_reports(server.public_bytes(), payloads(3), SPEC, ids)
    for row, rid in zip(rows, ids):
        head = unpack_header(row.tobytes())
        assert (head.version, head.layer, head.spec_hash, head.report_id) == (3, 0, SPEC, rid.tobytes())
    out = HpkeReportOpener(server, SPEC, 5).open_batch(rows)
    assert out.report_ids.tolist() == [r.tobytes() for r in ids]


def test_each_sealing_is_fresh(keys):
    """A retry re-sends the same id under a fresh ephemeral key (HPKE never reuses one)."""
    server, _ = keys
    a, b = (seal_report(server.public_bytes(), b"x", SPEC, RID) for _ in range(2))
    assert a[:HEADER_LEN] == b[:HEADER_LEN] and a[HEADER_LEN:] != b[HEADER_LEN:]


def test_a_report_for_another_specification_does_not_open(keys):
    server, _ = keys
    rec = seal_report(server.public_bytes(), b"hello", OTHER_SPEC, RID)
    with pytest.raises(Refused) as err:
        open_record(server.hpke_open, rec, SPEC, 0, 5)
    assert err.value.kind == "wrong_spec"
    # relabelling its clear hash does not help: the hash is in HPKE's info
    forged = rec[:2] + SPEC + rec[34:]
    with pytest.raises(Refused) as err:
        open_record(server.hpke_open, forged, SPEC, 0, 5)
    assert err.value.kind == "tampered"


@pytest.mark.parametrize("offset", [34, 49, HEADER_LEN, HEADER_LEN + ENC_LEN - 1,
                                    HEADER_LEN + ENC_LEN, -1])
def test_any_changed_byte_is_tampered(keys, offset):
    """Report id bytes (34..49), enc, ciphertext, tag: each flip makes the layer unopenable."""
    server, _ = keys
    rec = bytearray(seal_report(server.public_bytes(), b"hello", SPEC, RID))
    rec[offset] ^= 1
    with pytest.raises(Refused) as err:
        open_record(server.hpke_open, bytes(rec), SPEC, 0, 5)
    assert err.value.kind == "tampered"


@pytest.mark.parametrize("offset,value", [(0, 2), (1, 1)])
def test_wrong_version_or_layer_is_malformed(keys, offset, value):
    server, _ = keys
    rec = bytearray(seal_report(server.public_bytes(), b"hello", SPEC, RID))
    rec[offset] = value
    with pytest.raises(Refused) as err:
        open_record(server.hpke_open, bytes(rec), SPEC, 0, 5)
    assert err.value.kind == "malformed"


def test_batch_counts_every_kind_and_never_raises(keys):
    server, _ = keys
    good = seal_report(server.public_bytes(), b"hello", SPEC, RID)
    other = seal_report(server.public_bytes(), b"hello", OTHER_SPEC, RID)
    short = seal_report(server.public_bytes(), b"hell", SPEC, RID)
    bad = bytearray(good)
    bad[-1] ^= 1
    other_key = seal_report(ServerKeyPair.generate().public_bytes(), b"hello", SPEC, RID)
    opener = HpkeReportOpener(server, SPEC, 5)
    out = opener.open_batch([good, other, short, bytes(bad), other_key, b""])
    assert out.kept.tolist() == [0]
    assert dict(out.rejects) == {"malformed": 2, "wrong_spec": 1, "tampered": 2}
    assert opener.opened == 1 and opener.totals == out.rejects
    junk = opener.open_batch(12345)
    assert junk.rejects["malformed"] == 1 and len(junk.kept) == 0


def test_zero_ephemeral_key_is_refused(keys):
    server, _ = keys
    rec = bytearray(seal_report(server.public_bytes(), b"hello", SPEC, RID))
    rec[HEADER_LEN:HEADER_LEN + ENC_LEN] = bytes(ENC_LEN)     # low-order point
    with pytest.raises(Refused):
        open_record(server.hpke_open, bytes(rec), SPEC, 0, 5)


def test_onion_the_hop_opens_its_layer_only(keys):
    server, hop = keys
    p = payloads(4)
    rows = seal_reports(server.public_bytes(), p, SPEC, shufflers=[hop.public_bytes()])
    assert rows.shape[1] == record_len(5, 2)
    # the server cannot skip the hop, the hop cannot open the server's layer
    assert len(HpkeReportOpener(server, SPEC, 5).open_batch(rows).kept) == 0
    peeler = HpkeLayerPeeler(hop, SPEC, record_len(5))
    inner, kept, rejects = peeler.peel(rows)
    assert kept.tolist() == [0, 1, 2, 3] and sum(rejects.values()) == 0
    with pytest.raises(Refused) as err:
        open_record(hop.hpke_open, inner[0].tobytes(), SPEC, 0, 5)
    assert err.value.kind == "tampered"
    np.testing.assert_array_equal(HpkeReportOpener(server, SPEC, 5).open_batch(inner).plaintexts, p)


def test_peeler_collapses_a_retried_report_id(keys):
    """A retry (same id, fresh sealing) and a byte-identical replay both count once."""
    server, hop = keys
    first = seal_report(server.public_bytes(), b"hello", SPEC, RID, [hop.public_bytes()])
    retry = seal_report(server.public_bytes(), b"hello", SPEC, RID, [hop.public_bytes()])
    peeler = HpkeLayerPeeler(hop, SPEC, record_len(5))
    inner, kept, rejects = peeler.peel([first, retry, first])
    assert kept.tolist() == [0] and rejects["replayed"] == 2
    _, kept, rejects = peeler.peel([retry])                  # across batches too
    assert kept.tolist() == [] and peeler.totals["replayed"] == 3


def test_peeler_keeps_report_ids_that_end_in_zero_bytes(keys):
    """NumPy's 'S16' drops trailing zero bytes from an element; an id ending in 0x00 (1 in
    256 random ids) must still match its inner record (the shuffler service once refused
    such reports as tampered)."""
    server, hop = keys
    ids = [b"\x05" * 15 + b"\x00", b"\x06" * 8 + b"\x00" * 8, b"\x00" * 16]
    rows = [seal_report(server.public_bytes(), b"hello", SPEC, rid, [hop.public_bytes()]) for rid in ids]
    inner, kept, rejects = HpkeLayerPeeler(hop, SPEC, record_len(5)).peel(rows)
    assert kept.tolist() == [0, 1, 2] and sum(rejects.values()) == 0
    assert [unpack_header(r.tobytes()).report_id for r in inner] == ids


def test_a_chain_of_two_hops_peels_outside_in_then_the_server_opens(keys):
    """The first hop is outermost (layer 1); under it lies layer 2, under that the server's."""
    server, hop1 = keys
    hop2 = LayerKeyPair.generate(2)
    rows = seal_reports(server.public_bytes(), payloads(3), SPEC,
                        shufflers=[hop1.public_bytes(), hop2.public_bytes()])
    assert unpack_header(rows[0].tobytes()).layer == 1
    first = HpkeLayerPeeler(hop1, SPEC, record_len(5, 2), hops=2)
    middle, kept, _ = first.peel(rows)
    assert kept.tolist() == [0, 1, 2] and unpack_header(middle[0].tobytes()).layer == 2
    assert first.peel_one(rows[0].tobytes())[:2] == bytes([3, 2])
    inner, kept, _ = HpkeLayerPeeler(hop2, SPEC, record_len(5), hops=2).peel(middle)
    assert kept.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(HpkeReportOpener(server, SPEC, 5).open_batch(inner).plaintexts,
                                  payloads(3))
    # a hop told it is the last (the default) refuses the middle layer it does not expect
    assert HpkeLayerPeeler(hop1, SPEC, record_len(5, 2)).peel(rows)[2]["malformed"] == 3
    with pytest.raises(ValueError, match="hop 2 of a chain of 1"):
        HpkeLayerPeeler(hop2, SPEC, record_len(5), hops=1)


def test_peel_one_opens_a_single_report_or_says_why_not(keys):
    """The shuffler service's path: one report at a time, no replay memory (its store has one)."""
    server, hop = keys
    report = seal_report(server.public_bytes(), b"hello", SPEC, RID, [hop.public_bytes()])
    peeler = HpkeLayerPeeler(hop, SPEC, record_len(5))
    assert peeler.peel_one(report) == peeler.peel_one(report)            # no memory: both open
    assert unpack_header(peeler.peel_one(report)) == (3, 0, SPEC, RID)
    changed = bytearray(report)
    changed[-1] ^= 1
    for bad, kind in ((bytes(changed), "tampered"), (report[:-1], "malformed")):
        with pytest.raises(Refused) as err:
            peeler.peel_one(bad)
        assert err.value.kind == kind
    inner = seal_layer(server.public_bytes(), b"hello", SPEC, b"\x08" * 16, 0)
    with pytest.raises(Refused, match="not the next layer"):
        peeler.peel_one(seal_layer(hop.public_bytes(), inner, SPEC, RID, 1))


def test_peeler_refuses_an_inner_record_of_another_report(keys):
    """The inner header must repeat the outer spec hash and id, at the layer below."""
    server, hop = keys
    inner = seal_layer(server.public_bytes(), b"hello", SPEC, b"\x08" * 16, 0)
    outer = seal_layer(hop.public_bytes(), inner, SPEC, RID, 1)
    _, kept, rejects = HpkeLayerPeeler(hop, SPEC, len(inner)).peel([outer])
    assert kept.tolist() == [] and rejects["malformed"] == 1


def test_bad_arguments_are_refused_with_one_line():
    with pytest.raises(ValueError, match="32 raw X25519 bytes"):
        seal_report(b"short", b"x", SPEC, RID)
    with pytest.raises(ValueError, match="spec hash is 32 bytes"):
        pack_header(0, b"x", RID)
    with pytest.raises(ValueError, match="report id is 16 bytes"):
        pack_header(0, SPEC, b"x")
    with pytest.raises(ValueError, match="layer must be"):
        pack_header(256, SPEC, RID)
    with pytest.raises(ValueError, match=r"\(M, L\) uint8"):
        seal_reports(ServerKeyPair.generate().public_bytes(), np.zeros(3, np.uint8), SPEC)
    with pytest.raises(ValueError, match="report_ids must be"):
        seal_reports(ServerKeyPair.generate().public_bytes(), payloads(2), SPEC,
                     np.zeros((3, 16), np.uint8))
    with pytest.raises(ValueError, match="SHA-256"):
        HpkeReportOpener(ServerKeyPair.generate(), b"x", 5)


def test_a_recipient_key_is_parsed_once_and_checked_every_time():
    """public_key() caches the parsed object per raw key (a round has few recipients)."""
    import pytest
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from sealing.hpke_report import public_key
    raw = X25519PrivateKey.generate().public_key().public_bytes_raw()
    assert public_key(raw) is public_key(bytearray(raw))
    assert public_key(raw).public_bytes_raw() == raw
    with pytest.raises(ValueError):
        public_key(raw[:31])
