"""The untrusted middle: collects sealed reports, forgets who sent them, and permutes them.

* :mod:`shuffler.pool`   - :class:`ShufflePool` and the CSPRNG permutation (one process)
* :mod:`shuffler.layers` - onion mode: a hop's key for its *own* layer, and peeling it
* :mod:`shuffler.hpke_peel` - peeling a hop's layer of HPKE reports (docs/wire-format.md)
* :mod:`shuffler.service` - the HTTPS shuffler service run apart (``rknn-ray shuffler serve``;
  no Ray in its process): :mod:`shuffler.intake` (what is accepted), :mod:`shuffler.store`
  (SQLite, committed before answering), :mod:`shuffler.service_files`, :mod:`shuffler.certs`

The Ray actor is :mod:`actors.shuffler`. This package imports :mod:`sealing` (the
shared format) and never :mod:`server`: nothing here can open a server-layer report
(tests/test_import_rules.py).
"""
