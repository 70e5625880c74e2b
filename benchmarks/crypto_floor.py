"""The floor of a shuffle round: CPU seconds of every primitive the protocol cannot skip.

Per message, whatever the implementation: the client makes an ephemeral X25519 key pair
(private scalar and the public key it sends), does
the exchange with the server's key, derives the AEAD key (BLAKE2b, sealing.encapsulation),
seals (ChaCha20-Poly1305), derives its credential key and tags the report (keyed BLAKE2b
twice, sealing.credentials); the shuffler, which sees senders, derives the same credential
key and recomputes the tag; the server parses the ephemeral key, does the exchange, the key
derivation and the AEAD open. Each primitive is timed on its own over
``sample`` messages of this round's sizes (this thread's CPU clock, so other load does not
inflate it) and scaled to ``num_messages``. Message layout as in sealing/envelope.py and
sealing/credentials.py; the sum is the floor any implementation pays on one core.
"""
from __future__ import annotations

import os
import time
from hashlib import blake2b

PARTS = ("client_keygen", "client_exchange", "client_kdf", "client_seal", "client_mac_key",
         "client_mac_tag", "shuffler_mac_key", "shuffler_mac_tag", "server_exchange",
         "server_kdf", "server_open")
#: the parts a client can do before the round (sealing.encapsulation): they need no data
AHEAD_PARTS = ("client_keygen", "client_exchange", "client_kdf")
#: the parts done once per client and job, then kept for later rounds (ClientKeyTable)
KEPT_PARTS = ("client_mac_key", "shuffler_mac_key")


def _timed(fn, items) -> tuple[float, list]:
    out = []
    t0 = time.thread_time()
    for item in items:
        out.append(fn(item))
    return time.thread_time() - t0, out


def floor_parts(num_messages: int, payload_len: int, sample: int = 2000) -> dict[str, float]:
    """CPU seconds per primitive for ``num_messages`` sealed, tagged reports (see module doc)."""
    # defers cryptography
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    from sealing.credentials import TAG_LEN  # defers cryptography, pyarrow
    from sealing.encapsulation import derive_key, parse_public_key
    # defers cryptography, pyarrow
    from sealing.envelope import HEADER_LEN, KDF_LABEL, KEY_LEN, NONCE, PLAIN_HEAD
    if num_messages <= 0:
        return {part: 0.0 for part in PARTS}
    n = max(1, min(int(sample), int(num_messages)))
    server = X25519PrivateKey.generate()
    server_pub, server_raw = server.public_key(), server.public_key().public_bytes_raw()
    plain = os.urandom(PLAIN_HEAD + payload_len)
    aad = bytes(KEY_LEN + HEADER_LEN)
    shard_key, prefix = os.urandom(32), os.urandom(40)
    senders = [int(c).to_bytes(8, "big") for c in range(n)]

    t = {}
    def keypair(_):      # the public half is part of key generation: it goes on the wire
        e = X25519PrivateKey.generate()
        return e, e.public_key().public_bytes_raw()

    t["client_keygen"], pairs = _timed(keypair, range(n))
    ephs, pubs = [e for e, _ in pairs], [p for _, p in pairs]
    t["client_exchange"], shared = _timed(lambda e: e.exchange(server_pub), ephs)
    t["client_kdf"], keys = _timed(
        lambda i: derive_key(shared[i], pubs[i], server_raw, KDF_LABEL), range(n))
    t["client_seal"], cts = _timed(lambda k: ChaCha20Poly1305(k).encrypt(NONCE, plain, aad), keys)
    for side in ("client", "shuffler"):
        t[f"{side}_mac_key"], ckeys = _timed(
            lambda c: blake2b(b"client" + c, key=shard_key, digest_size=32).digest(), senders)
        t[f"{side}_mac_tag"], _ = _timed(
            lambda i: blake2b(prefix + senders[i] + bytes(4) + cts[i], key=ckeys[i],
                              digest_size=TAG_LEN).digest(), range(n))
    t["server_exchange"], shared2 = _timed(
        lambda p: server.exchange(parse_public_key(p)), pubs)
    t["server_kdf"], keys2 = _timed(
        lambda i: derive_key(shared2[i], pubs[i], server_raw, KDF_LABEL), range(n))
    t["server_open"], _ = _timed(
        lambda i: ChaCha20Poly1305(keys2[i]).decrypt(NONCE, cts[i], aad), range(n))
    scale = num_messages / n
    return {part: t[part] * scale for part in PARTS}
