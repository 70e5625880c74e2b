"""The report format every party shares: round context, envelope, onion wrapping, keyless opening core.

* :mod:`sealing.envelope` - round context, wire format, sealing to a public key, Arrow batches
* :mod:`sealing.onion`    - wrapping a sealed report once per shuffler hop
* :mod:`sealing.unseal`   - opening given a key holder's ``exchange`` function (holds no key)

No private key lives here; clients, shufflers and the server all import this package.
"""
from sealing.envelope import RoundContext, ciphertext_len, from_arrow, seal_batch, to_arrow

__all__ = ["RoundContext", "ciphertext_len", "from_arrow", "seal_batch", "to_arrow"]
