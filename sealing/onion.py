"""Onion wrapping: seal for the server, then once per shuffler hop (public keys only).

A client seals for the server first (layer 0), then wraps that report once per
shuffler in the chain, innermost hop first, so the first hop's layer is
outermost. Peeling a layer is the shuffler's job (:mod:`shuffler.layers`), opening
the server layer the server's (:mod:`server.opening`); nothing here opens anything.
"""
from __future__ import annotations

import numpy as np

from sealing.envelope import SERVER_LAYER, RoundContext, seal_batch


def seal_onion(server_public_key: bytes, shuffler_public_keys: list[bytes], payloads: np.ndarray,
               ctx: RoundContext, pad_to: int | None = None, *,
               report_ids: np.ndarray | None = None, pool=None) -> np.ndarray:
    """Seal for the server, then wrap once per shuffler (``shuffler_public_keys[0]`` = first hop);
    every layer takes its encapsulations from ``pool`` when it has them (see ``seal_batch``)."""
    sealed = seal_batch(server_public_key, payloads, ctx, pad_to, layer=SERVER_LAYER,
                        report_ids=report_ids, pool=pool)
    for hop in reversed(range(len(shuffler_public_keys))):
        sealed = seal_batch(shuffler_public_keys[hop], sealed, ctx, layer=hop + 1, pool=pool)
    return sealed
