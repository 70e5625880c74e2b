"""The trust boundary: sealed reports and the Shuffler.

Module map (the layout *is* the boundary; see tests/test_shuffler.py):

* :mod:`shuffler.envelope` - round context, wire format, sealing (public keys only)
* :mod:`shuffler.shuffler` - the shuffle logic and the ``Shuffler`` Ray actor; holds no key
* :mod:`shuffler.onion`    - onion layers: a shuffler's own layer key, never the server's
* :mod:`shuffler.unseal`   - opening given a key holder's exchange function (no key of its own)
* :mod:`shuffler.opening`  - the server's key pair and report opener (Server actor only)

This package imports nothing that can open a report, so ``import shuffler`` is safe anywhere.
"""
from shuffler.envelope import RoundContext, ciphertext_len, from_arrow, seal_batch, to_arrow

__all__ = ["RoundContext", "ciphertext_len", "from_arrow", "seal_batch", "to_arrow"]
