"""The report format every party shares: round context, envelope, onion wrapping, keyless opening core.

* :mod:`sealing.envelope` - round context, wire format, sealing to a public key, Arrow batches
* :mod:`sealing.onion`    - wrapping a sealed report once per shuffler hop
* :mod:`sealing.unseal`   - opening given a key holder's ``exchange`` function (holds no key)

For parties that run apart (docs/wire-format.md): :mod:`sealing.hpke_report` (RFC 9180
HPKE reports bound to a round specification's hash), :mod:`sealing.hpke_open` (their keyless
opening core), :mod:`sealing.round_spec` (the signed, pickle-free round specification),
:mod:`sealing.upload_wire` (the upload protocol's bytes) and :mod:`sealing.upload_client`
(a standard-library HTTPS client of the shuffler service, for holders and the operator).

No private key lives here; clients, shufflers and the server all import this package.
"""
from sealing.envelope import RoundContext, ciphertext_len, from_arrow, seal_batch, to_arrow

__all__ = ["RoundContext", "ciphertext_len", "from_arrow", "seal_batch", "to_arrow"]
