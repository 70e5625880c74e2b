"""Onion mode: a chain of shufflers, each peeling only its own layer.

Hop ``i`` (0-based) holds a :class:`LayerKeyPair` for layer ``i + 1`` only,
generated inside its actor; it peels that layer, re-shuffles and forwards.
Clients wrap with :func:`sealing.onion.seal_onion`. Anonymity then holds if any
one shuffler is honest.

A layer key can never open the server layer: the server layer is sealed to a
different key, its header says layer 0 (which a peeler rejects before any
cryptography), and the layer number is part of both the key derivation's info and the
AEAD associated data. Nothing in this package imports :mod:`server`.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from sealing.envelope import RoundContext
from sealing.hpke_report import SUITE as HPKE_SUITE
from sealing.replay import ReplayGuard
from sealing.unseal import empty_rejects, open_rows


class LayerKeyPair:
    """One shuffler's key pair for its own onion layer (``layer >= 1``) of one job."""

    def __init__(self, private_key: X25519PrivateKey, layer: int):
        if not 1 <= int(layer) <= 255:
            raise ValueError(f"a shuffler layer is 1..255 (hop index + 1); got {layer}. "
                             "Layer 0 is the server's and no shuffler key may claim it")
        self._private, self.layer = private_key, int(layer)
        self._public = private_key.public_key().public_bytes_raw()

    @classmethod
    def generate(cls, layer: int) -> "LayerKeyPair":
        return cls(X25519PrivateKey.generate(), layer)

    def public_bytes(self) -> bytes:
        return self._public

    def exchange(self, peer_public):
        return self._private.exchange(peer_public)

    def hpke_open(self, sealed: bytes, info: bytes) -> bytes:
        """RFC 9180 OpenBase (empty aad) with this hop's key: peels its own layer of an HPKE
        report (:mod:`shuffler.hpke_peel`); the private key never leaves this object."""
        return HPKE_SUITE.decrypt(sealed, self._private, info=info)

    def __repr__(self) -> str:
        return f"LayerKeyPair(layer={self.layer}, public={self._public.hex()[:16]}...)"

    def __reduce__(self):
        raise TypeError("LayerKeyPair must not be pickled: it stays inside its Shuffler actor; "
                        "share public_bytes() instead")


class LayerPeeler:
    """Removes one onion layer from a batch, rejecting and counting bad reports like the server.

    Replays (the same outer ephemeral key twice in the job) are dropped here too, so
    a replay never reaches the next hop.
    """

    def __init__(self, keypair: LayerKeyPair, ctx: RoundContext):
        self.keypair, self.ctx = keypair, ctx
        self._replays = ReplayGuard()
        self._inner_len: int | None = None
        self.totals = empty_rejects()

    def start_round(self, round_id: int) -> None:
        self.ctx = RoundContext(self.ctx.job_id, round_id, self.ctx.version)

    def peel(self, ciphertexts: np.ndarray) -> tuple[np.ndarray, np.ndarray, Counter]:
        """``(inner reports (M_ok, L_inner), kept row indices, rejects)``."""
        inner, _ids, eph, kept, rejects = open_rows(self.keypair.exchange, self.keypair.public_bytes(),
                                              ciphertexts, self.ctx, self.keypair.layer,
                                              self._inner_len)
        fresh = self._replays.fresh(eph)
        rejects["replayed"] += int((~fresh).sum())
        inner, kept = inner[fresh], kept[fresh]
        if self._inner_len is None and len(inner):
            self._inner_len = inner.shape[1]
        self.totals.update(rejects)
        return inner, kept, rejects
