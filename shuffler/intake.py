"""Deciding each uploaded report's fate (the shuffler service's rules, no HTTP here).

Checks run in the order of :data:`sealing.upload_wire.CODES`, and the first that applies
is the answer: a malformed entry; a key id not in the holder registry; a signature that
does not verify; a report whose header is not this hop's layer of this round's length; a
report for another specification; a report id already kept (``duplicate``: idempotent
success, so a retry after the deadline still reads as done); before the window opens;
at or after the deadline (or the operator's early close); over the holder's allowance (the specification's ``allowance``
distinct reports per key); and finally this hop's HPKE layer must open to the next
layer of the same report (``tampered`` otherwise). Only then is the inner record kept.
A request's answers and counts are committed in one transaction before it is answered.

Signatures are verified by libsodium (PyNaCl): half the CPU of OpenSSL's Ed25519 verify
here (about 60 us against 120 us), and the check every upload pays first. It is the same
Ed25519 (RFC 8032) and stricter only where a signature or key is not canonical or of small
order, which no honest holder's key makes.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from nacl.bindings import crypto_sign_open
from nacl.exceptions import BadSignatureError

from sealing.hpke_open import Refused
from sealing.hpke_report import HEADER_LEN, VERSION, record_len, unpack_header
from sealing.round_spec import RoundSpec
from sealing.upload_wire import KEY_ID_LEN, SIGNATURE_LEN, Entry, signed_message
from shuffler.hpke_peel import HpkeLayerPeeler
from shuffler.layers import LayerKeyPair
from shuffler.store import ReportStore

HOP = 1          # holders upload to the first hop; it peels layer 1


class Intake:
    """The service's acceptance rules over one store (see the module docstring)."""

    def __init__(self, spec: RoundSpec, holders: dict[bytes, Ed25519PublicKey],
                 keypair: LayerKeyPair | None, store: ReportStore,
                 clock: Callable[[], float] = time.time):
        """``keypair`` None: a relay (local and central models: the specification names no
        shuffler). It keeps each report as uploaded (sealed for the server only), checks
        everything but the HPKE layer it has no key for (the server counts a tampered
        report), and promises no anonymity: the guarantee does not rest on it."""
        if spec.shuffler_keys and (keypair is None or keypair.layer != HOP
                                   or keypair.public_bytes() != spec.shuffler_keys[0]):
            raise ValueError("this shuffler's key is not the specification's first shuffler key "
                             "(shuffler_keys[0]): start the service with the key the operator "
                             "published, or publish this key's public half")
        if not spec.shuffler_keys and keypair is not None:
            raise ValueError(f"the {spec.model}-model specification names no shuffler: serve it "
                             "as a relay (rknn-ray shuffler serve --relay)")
        self.spec, self.spec_hash = spec, spec.content_hash()
        self.holders, self.keypair, self.store, self.clock = holders, keypair, store, clock
        hops = len(spec.shuffler_keys)          # under hop 1: hops 2..H, then the server's layer
        self.hop = HOP if hops else 0           # the layer holders upload: 0 to a relay
        self.upload_len = record_len(spec.payload_len, hops + 1)
        if hops:
            self.inner_len = record_len(spec.payload_len, hops)
            self.peeler = HpkeLayerPeeler(keypair, self.spec_hash, self.inner_len, hops)
            self.inner_layer = self.peeler.inner_layer
        else:
            self.inner_len, self.peeler, self.inner_layer = self.upload_len, None, 0

    def submit(self, entries: list[Entry]) -> list[str]:
        """Each entry's code, kept and counted in one committed transaction."""
        return self.submit_many([entries])[0]

    def submit_many(self, requests: list[list[Entry]]) -> list[list[str]]:
        """Several requests' entries judged in order and committed in one transaction (one
        fsync: group commit); each request's codes. None is answered before the commit."""
        out, counts = [], Counter()
        with self.store.transaction():
            # every report id of the group looked up in one statement, not one per report
            self.store.prefetch(e[2][34:HEADER_LEN] for entries in requests for e in entries
                                if len(e[2]) >= HEADER_LEN)
            now = self.clock()
            for entries in requests:
                codes = [self._one(entry, now) for entry in entries]
                counts.update(codes)
                out.append(codes)
            self.store.count_answers(counts)
        return out

    def _one(self, entry: Entry, now: float) -> str:
        key_id, signature, report = entry
        if len(key_id) != KEY_ID_LEN or len(signature) != SIGNATURE_LEN:
            return "malformed"
        if key_id not in self.holders:
            return "unknown_key"
        if len(report) < HEADER_LEN:
            return "malformed"
        try:                # the key id is the holder's raw public key (the registry's key)
            crypto_sign_open(signature + signed_message(report), key_id)
        except BadSignatureError:
            return "bad_signature"
        head = unpack_header(report)
        if len(report) != self.upload_len or head.version != VERSION or head.layer != self.hop:
            return "malformed"
        if head.spec_hash != self.spec_hash:
            return "wrong_spec"
        if self.store.has(head.report_id):
            return "duplicate"
        if now < self.spec.opens_at:
            return "too_early"
        if now >= self.deadline:
            return "too_late"
        if self.store.sent(key_id) >= self.spec.allowance:
            return "over_allowance"
        if self.peeler is None:     # a relay: kept as sealed for the server
            inner = bytes(report)
        else:
            try:
                inner = self.peeler.peel_one(report)
            except Refused:         # malformed inner, or HPKE refused: this layer is not intact
                return "tampered"
        self.store.add(head.report_id, inner, key_id)
        return "accepted"

    @property
    def deadline(self) -> float:
        """The specification's deadline, or earlier where the operator closed the window."""
        closed = self.store.closed_at()
        return self.spec.deadline if closed is None else min(float(self.spec.deadline), closed)

    def close_early(self) -> float:
        """The operator closes the window now (no report is accepted after it); the new deadline."""
        return min(float(self.spec.deadline), self.store.close_window(self.clock()))

    def released(self, now: float | None = None) -> tuple[bool, str]:
        """``(True, "")`` once the batch may leave, else ``(False, one line why not)``."""
        now = self.clock() if now is None else now
        if now < self.deadline:
            return False, (f"batch not released: the upload window closes at unix time "
                           f"{self.deadline:.0f} (in {self.deadline - now:.0f} s); fetch after it")
        holders = self.store.distinct_holders()
        if holders < self.spec.min_senders:
            return False, (f"batch not released: {holders} distinct holders reported, below the "
                           f"specification's floor of {self.spec.min_senders} (min_senders); it "
                           "will never be released for this specification")
        return True, ""
