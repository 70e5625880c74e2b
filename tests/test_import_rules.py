"""The code layout is the trust boundary: each party's package imports only what that party may hold.

Parties: the client (``rknn_ray`` library + ``actors.client_shard``), the shuffler
(``shuffler/`` + ``actors.shuffler``), the server (``server/`` + ``actors.server``);
``sealing/`` is the format all of them share and holds no key. Checked two ways:
statically (every import statement in every file, including those inside functions)
and dynamically (what a fresh interpreter has loaded after importing the package).
"""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ast_parse import parse as parse_source

ROOT = Path(__file__).resolve().parents[1]


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it (top level or inside functions)."""
    found = set()
    for node in ast.walk(parse_source(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def package_imports(*paths: str) -> dict[str, set[str]]:
    out = {}
    for p in paths:
        path = ROOT / p
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            out[str(f.relative_to(ROOT))] = imports_of(f)
    return out


def offenders(imports: dict[str, set[str]], forbidden: tuple[str, ...]) -> dict[str, set[str]]:
    bad = {f: {m for m in mods if m == p or m.startswith(p + ".")} for f, mods in imports.items()
           for p in forbidden}
    return {f: m for f, m in bad.items() if m}


def loaded_after(statement: str, prefixes: tuple[str, ...]) -> set[str]:
    code = (f"import sys; {statement}; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {prefixes!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return set(eval(out.stdout.strip().splitlines()[-1]))   # noqa: S307 - our own repr of a list


def test_sealing_holds_no_key_and_imports_no_party():
    """The shared format: no party package, and no long-lived private key anywhere in it."""
    imports = package_imports("sealing")
    assert not offenders(imports, ("server", "shuffler", "actors", "ray", "jobs"))
    for f in (ROOT / "sealing").rglob("*.py"):
        text = f.read_text()
        assert "load_pem_private_key" not in text and "private_bytes" not in text, f


def test_shuffler_cannot_reach_server_code():
    """The untrusted middle: never the server package (whose key opens reports)."""
    imports = package_imports("shuffler", "actors/shuffler.py")
    assert not offenders(imports, ("server", "actors.server", "actors.client_shard", "jobs"))
    loaded = loaded_after("import shuffler, shuffler.pool, actors.shuffler",
                          ("server", "shuffler", "sealing"))
    assert not {m for m in loaded if m.split(".")[0] == "server"}
    # the opening core is loaded only by an onion hop, lazily, to peel its *own* layer
    assert "sealing.unseal" not in loaded and "shuffler.layers" not in loaded
    assert "sealing.hpke_open" not in loaded and "shuffler.hpke_peel" not in loaded


def test_shuffler_service_process_loads_no_ray_and_no_server():
    """``rknn-ray shuffler serve`` runs apart from the cluster: its command, the service and
    the upload protocol never import Ray or the server (tests/test_shuffler_service.py also
    runs it with both unimportable)."""
    files = ["jobs/shuffler_service.py", "sealing/upload_wire.py", "sealing/upload_client.py"]
    imports = package_imports(*files, "shuffler")
    assert not offenders(imports, ("ray", "server", "actors", "rknn_ray.job", "torch"))
    loaded = loaded_after("import jobs.cli, jobs.shuffler_service, shuffler.service, "
                          "shuffler.intake, shuffler.store, shuffler.certs, shuffler.service_files, "
                          "sealing.upload_client", ("ray", "server", "actors", "torch"))
    assert not loaded


def test_holder_process_loads_no_ray_no_other_party_and_no_job_layer():
    """``rknn-ray holder`` runs on a holder's own machine: it never imports Ray, the server
    or the shuffler (whose keys open reports), the actors, the job layer or torch
    (tests/test_holder.py also runs it with those unimportable)."""
    imports = package_imports("holder", "jobs/holder.py", "rknn_ray/published_encoder.py")
    forbidden = ("ray", "server", "shuffler", "actors", "rknn_ray.job", "torch",
                 "sealing.unseal", "sealing.hpke_open")
    assert not offenders(imports, forbidden)
    loaded = loaded_after("import jobs.cli, jobs.holder, holder.join, holder.identity, "
                          "holder.ledger, holder.answer, holder.accountant, holder.many",
                          ("ray", "server", "shuffler", "actors", "torch"))
    assert not loaded
    assert "rknn_ray.job" not in loaded_after("import holder.join", ("rknn_ray",))


def test_server_never_imports_the_shuffler_or_client_code():
    imports = package_imports("server", "actors/server.py")
    assert not offenders(imports, ("shuffler", "actors.shuffler", "actors.client_shard", "jobs"))
    loaded = loaded_after("import server.keys, server.opening, actors.server",
                          ("shuffler", "actors"))
    assert not {m for m in loaded if m.split(".")[0] == "shuffler"}


def test_client_code_cannot_open_reports():
    """Clients seal with public keys only: no server package, no shuffler layer keys."""
    files = ["actors/client_shard.py", "rknn_ray"]
    # rknn_ray/job is the driver's orchestration layer (above the actors), not client code
    imports = {f: m for f, m in package_imports(*files).items()
               if not f.startswith("rknn_ray/job/")}
    assert not offenders(imports, ("server", "shuffler", "actors.server", "actors.shuffler",
                                   "sealing.unseal", "sealing.hpke_open"))
    loaded = loaded_after("import actors.client_shard", ("server", "shuffler", "sealing"))
    assert not {m for m in loaded if m.split(".")[0] in ("server", "shuffler")}
    assert "sealing.unseal" not in loaded and "sealing.hpke_open" not in loaded


@pytest.mark.parametrize("package", ["sealing", "shuffler", "server", "holder"])
def test_each_party_package_is_documented(package):
    doc = ast.get_docstring(parse_source((ROOT / package / "__init__.py").read_text()))
    assert doc and len(doc) > 80
