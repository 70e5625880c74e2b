"""The server: the only party holding the private key.

* :mod:`server.keys`        - the job's X25519 key pair (never pickled, never leaves the server)
* :mod:`server.opening`     - opening and checking server-layer reports
* :mod:`server.hpke_opening` - the same for HPKE reports (docs/wire-format.md)
* :mod:`server.accumulator` - the round's additive statistic: accumulate batches in any
  order, then finalize into released counts

Imports only :mod:`sealing` (the shared report format) and the library
(:mod:`rknn_ray`); never :mod:`shuffler` (tests/test_import_rules.py).
"""
