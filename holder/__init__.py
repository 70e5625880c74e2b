"""The holder: one data holder's own program, run on its own machine apart from the operator.

It reads only its own files, fetches the operator's signed round specification over
HTTPS, verifies it, featurizes its rows with the published (pickle-free) encoder, votes,
randomizes with a ChaCha20 stream keyed from its own secret, seals for the server and the
shuffler(s) in the standard HPKE format and uploads with its own Ed25519 key. Before it
uploads, its own ledger charges its data at the eps its own accountant computes from the
specification's parameters; it refuses a specification that claims less, or that its
policy does not allow. It imports no Ray, no server, no shuffler and no job layer
(tests/test_import_rules.py); it only makes outgoing connections.
"""
