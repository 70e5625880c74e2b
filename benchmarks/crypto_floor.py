"""The floor of a shuffle round: CPU seconds of every primitive the protocol cannot skip.

Per message, whatever the implementation: the client makes an ephemeral X25519 key pair
(private scalar and the public key it sends), does
the exchange with the server's key, derives the AEAD key (HKDF-SHA256), seals
(ChaCha20-Poly1305), derives its credential key and tags the report (HMAC-SHA256 twice);
the shuffler, which sees senders, derives the same credential key and recomputes the tag;
the server does the exchange, HKDF and AEAD open. Each primitive is timed on its own over
``sample`` messages of this round's sizes (this thread's CPU clock, so other load does not
inflate it) and scaled to ``num_messages``. Message layout as in sealing/envelope.py and
sealing/credentials.py; the sum is the floor any implementation pays on one core.
"""
from __future__ import annotations

import hmac
import os
import time

PARTS = ("client_keygen", "client_exchange", "client_hkdf", "client_seal", "client_hmac_key",
         "client_hmac_tag", "shuffler_hmac_key", "shuffler_hmac_tag", "server_exchange",
         "server_hkdf", "server_open")
#: the parts a client can do before the round (sealing.encapsulation): they need no data
AHEAD_PARTS = ("client_keygen", "client_exchange", "client_hkdf")
#: the parts done once per client and job, then kept for later rounds (ClientKeyTable)
KEPT_PARTS = ("client_hmac_key", "shuffler_hmac_key")


def _timed(fn, items) -> tuple[float, list]:
    out = []
    t0 = time.thread_time()
    for item in items:
        out.append(fn(item))
    return time.thread_time() - t0, out


def floor_parts(num_messages: int, payload_len: int, sample: int = 2000) -> dict[str, float]:
    """CPU seconds per primitive for ``num_messages`` sealed, tagged reports (see module doc)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    from sealing.credentials import TAG_LEN
    from sealing.envelope import HEADER_LEN, HKDF_LABEL, KEY_LEN, NONCE, PLAIN_HEAD
    if num_messages <= 0:
        return {part: 0.0 for part in PARTS}
    n = max(1, min(int(sample), int(num_messages)))
    server = X25519PrivateKey.generate()
    server_pub, server_raw = server.public_key(), server.public_key().public_bytes_raw()
    plain = os.urandom(PLAIN_HEAD + payload_len)
    aad = bytes(KEY_LEN + HEADER_LEN)
    shard_key, prefix = os.urandom(32), os.urandom(40)
    senders = [int(c).to_bytes(8, "big") for c in range(n)]

    def hkdf(salt, shared):
        return HKDF(hashes.SHA256(), KEY_LEN, salt=salt, info=HKDF_LABEL).derive(shared)

    t = {}
    def keypair(_):      # the public half is part of key generation: it goes on the wire
        e = X25519PrivateKey.generate()
        return e, e.public_key().public_bytes_raw()

    t["client_keygen"], pairs = _timed(keypair, range(n))
    ephs, pubs = [e for e, _ in pairs], [p for _, p in pairs]
    t["client_exchange"], shared = _timed(lambda e: e.exchange(server_pub), ephs)
    t["client_hkdf"], keys = _timed(lambda i: hkdf(pubs[i] + server_raw, shared[i]), range(n))
    t["client_seal"], cts = _timed(lambda k: ChaCha20Poly1305(k).encrypt(NONCE, plain, aad), keys)
    for side in ("client", "shuffler"):
        t[f"{side}_hmac_key"], ckeys = _timed(
            lambda c: hmac.digest(shard_key, b"client" + c, "sha256"), senders)
        t[f"{side}_hmac_tag"], _ = _timed(
            lambda i: hmac.digest(ckeys[i], prefix + senders[i] + bytes(4) + cts[i],
                                  "sha256")[:TAG_LEN], range(n))
    t["server_exchange"], shared2 = _timed(
        lambda p: server.exchange(X25519PublicKey.from_public_bytes(p)), pubs)
    t["server_hkdf"], keys2 = _timed(lambda i: hkdf(pubs[i] + server_raw, shared2[i]), range(n))
    t["server_open"], _ = _timed(
        lambda i: ChaCha20Poly1305(keys2[i]).decrypt(NONCE, cts[i], aad), range(n))
    scale = num_messages / n
    return {part: t[part] * scale for part in PARTS}
