"""The secure path draws only from ChaCha20 (keyed by a client secret or the OS) and the OS.

Two checks, as the protocol-hardening issue asks:
1. the generators actually created: every non-cryptographic numpy bit generator and the
   legacy global RNG are replaced by tripwires while a round of every mechanism runs
   (client step with credentials, server admission, opening, release; shuffler); the
   only generator built is ChaCha;
2. the imports: no module on the secure path names Philox, PCG, MT19937, SFC64,
   default_rng or RandomState (``rknn_ray/rng.py`` may name PCG64 in its seeded
   simulation generator only).
"""
import ast
import pathlib

import numpy as np
import pytest
import randomgen

from actors.server import ServerImpl
from actors.shuffler import ShufflerImpl
from rknn_ray.client_step import RoundSpec, client_step, sealed_width
from rknn_ray.mechanisms import available, build
from rknn_ray.mechanisms.base import MechanismParams
# scipy.stats (the amplification bounds) builds a default_rng when first imported: an
# import-time object of scipy's, never used for a randomizer; load it before the tripwires
import rknn_ray.accounting.bounds  # noqa: E402,F401
from sealing.credentials import CredentialIssuer
from sealing.envelope import RoundContext
from server.keys import ServerKeyPair
from tests.ast_parse import parse as parse_source

try:                     # imported lazily by pyarrow; load it before the tripwires go up
    import pandas  # noqa: F401
except ImportError:
    pass

ROOT = pathlib.Path(__file__).resolve().parents[1]
BANNED = {"Philox", "PCG64", "PCG64DXSM", "MT19937", "SFC64", "default_rng", "RandomState"}
SECURE_PATH = ["rknn_ray/client_step.py", "rknn_ray/rng.py", "rknn_ray/labeling/rknn.py",
               "rknn_ray/mechanisms", "sealing", "shuffler", "server", "actors"]
ALLOWED = {("rknn_ray/rng.py", "seeded_generator", "PCG64")}


def _py_files():
    for entry in SECURE_PATH:
        path = ROOT / entry
        yield from ([path] if path.suffix == ".py" else sorted(path.rglob("*.py")))


def test_no_module_on_the_secure_path_names_a_non_cryptographic_generator():
    found = []
    for path in _py_files():
        rel = str(path.relative_to(ROOT))
        tree = parse_source(path.read_text())
        for func in [None, *[n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]]:
            nodes = ast.walk(func) if func else [n for n in ast.walk(tree)]
            for node in nodes:
                name = node.attr if isinstance(node, ast.Attribute) else \
                    node.id if isinstance(node, ast.Name) else None
                if name in BANNED and (rel, func.name if func else None, name) not in ALLOWED:
                    if func is None and any(node in set(ast.walk(f)) for f in ast.walk(tree)
                                            if isinstance(f, ast.FunctionDef)
                                            and (rel, f.name, name) in ALLOWED):
                        continue
                    found.append(f"{rel}: {name}")
    assert not found, f"non-cryptographic generators on the secure path: {sorted(set(found))}"


@pytest.fixture
def tripwires(monkeypatch):
    """Every non-ChaCha generator raises; ChaCha constructions are counted."""
    def trip(name):
        def boom(*a, **k):
            raise AssertionError(f"np.random.{name} used on the secure path")
        if isinstance(getattr(np.random, name), type):     # stays a class (type hints use it)
            return type(name, (object,), {"__init__": boom})
        return boom
    for name in BANNED | {"random", "integers", "randint", "normal", "laplace", "geometric",
                          "negative_binomial", "poisson", "choice", "permutation", "shuffle"}:
        if hasattr(np.random, name):
            monkeypatch.setattr(np.random, name, trip(name))
    made = []
    real = randomgen.ChaCha

    class CountingChaCha(real):
        def __init__(self, *a, **k):
            made.append(k.get("rounds"))
            super().__init__(*a, **k)
    monkeypatch.setattr("rknn_ray.rng.ChaCha", CountingChaCha)
    return made


def _cases():
    out = []
    for model, names in available().items():
        out += [(model, name) for name in names]
    return out


@pytest.mark.parametrize("model,name", _cases())
def test_a_secure_round_creates_only_chacha_generators(tmp_path, tripwires, model, name):
    s, y, k, n = 5, 3, 2, 30
    feats = np.linspace(-1, 1, n * 4, dtype=np.float32).reshape(n, 4)
    labels = np.arange(n) % y
    queries = np.linspace(-1, 1, s * 4, dtype=np.float32).reshape(s, 4)

    class Identity:
        def transform(self, x):
            return x

    params = MechanismParams(s, y, k, eps=2.0, delta=1e-4 if model == "shuffle" else 0.0,
                             num_clients=n)
    mech = build(model, name, params)
    key = tmp_path / "k.pem"
    ServerKeyPair.generate().save(key)
    server = ServerImpl("job-rng", str(key), 0, 2)
    ctx = RoundContext("job-rng", 0)
    spec = RoundSpec(ctx, mech, Identity(), queries, k, y, server.public_key())
    issuer = CredentialIssuer("job-rng")
    cred = issuer.shard_credential(0, 0, n)
    batch = client_step(spec, b"\x01" * 32, 0, feats, labels, np.arange(n), credential=cred)
    admission = (issuer.verifier([(0, n)]), ctx, mech.messages_per_sender(), sealed_width(spec))
    if model == "shuffle":
        hop = ShufflerImpl(0)
        hop.start_round(0, 0, False, admission)
        hop.submit(batch)
        server.begin_round(ctx, mech, None)
        for out in hop.release():
            server.submit(out)
    else:
        server.begin_round(ctx, mech, admission)
        server.submit(batch)
    release = server.finish("secure")
    server.shutdown()
    assert release["messages"] >= n and np.isfinite(release["counts"]).all()
    assert tripwires and set(tripwires) == {20}          # ChaCha20, and nothing else, was built
