"""The packages form layers: each imports only the layers below it, and no module imports
itself back through others (no import cycle, not even one held together by an import
inside a function).

Layers, bottom up: ``sealing`` (the report format every party shares) < ``rknn_ray``
(the library) < ``server``, ``shuffler`` and ``holder`` (the parties' own code, which never
import each other: tests/test_import_rules.py) < ``actors`` (thin Ray actors) < ``rknn_ray.job``
(the orchestration layer: session, rounds, release file, Ray start-up, ``run``) < ``jobs``
(the entrypoints) < ``benchmarks``. ``rknn_ray.job`` lives inside the library's folder but
is its own layer: nothing else in ``rknn_ray`` imports it. Every import statement counts,
wherever it stands.
"""
import ast
import functools
import importlib

import pytest

from benchmarks.import_graph import ROOT, cycles, floors, folder, graph, measure, modules
from benchmarks.import_graph import scan as scan_tree
from tests.ast_parse import parse as parse_source


@functools.cache
def scan(root=None):
    """The project's imports, scanned once per session (or the tree at ``root``)."""
    return scan_tree() if root is None else scan_tree(root)

LAYERS = {"sealing": 0, "rknn_ray": 1, "server": 2, "shuffler": 2, "holder": 2, "actors": 3,
          "rknn_ray.job": 4,
          "jobs": 5, "benchmarks": 6}


def layer_of(module: str) -> int:
    """The layer of a module: its longest package prefix in LAYERS (rknn_ray.job before rknn_ray)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    raise KeyError(module)


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports, at any depth (a package's own submodules
    left out; the AST scan is benchmarks/import_graph.py's)."""
    return graph(scan(), nodes=modules())


def package_graph() -> dict[str, set[str]]:
    """:func:`import_graph` with each package's imports of its own submodules put back: a
    cycle inside a package (its ``__init__`` and a submodule importing each other) shows."""
    g = import_graph()
    for name, path in modules().items():
        if path.name != "__init__.py":
            continue
        for node in ast.walk(parse_source(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            g[name] |= {t for t in targets if t.startswith(name + ".") and t in g}
    return g


#: What each folder of the library may import of the project (imports at any depth). A
#: stage package imports the stages below it; nothing here imports ``rknn_ray.job`` (it is
#: a layer of its own, above ``actors``), and ``accounting`` imports no mechanism.
ALLOWED = {
    "rknn_ray": [],
    "rknn_ray.errors": [],
    "rknn_ray.interrupts": [],
    "rknn_ray.moved": [],
    "rknn_ray.paper_numbers": [],
    "rknn_ray.rng": ["rknn_ray.errors"],
    "rknn_ray.runio": ["rknn_ray.errors"],
    "rknn_ray.keyspec": ["rknn_ray.errors"],
    "rknn_ray.shard_secrets": ["rknn_ray.errors", "rknn_ray.rng"],
    "rknn_ray.plots": ["rknn_ray.runio"],
    # the pickle-free published encoder: the run's predictor and a holder off the cluster
    "rknn_ray.published_encoder": ["rknn_ray.data", "rknn_ray.errors", "rknn_ray.representation"],
    # a run's predictor (predict, RunResult.predict): outside the job layer, so `rknn-ray
    # predict` loads neither Ray nor the accountants
    "rknn_ray.predictor": ["rknn_ray.errors", "rknn_ray.predictor_check",
                           "rknn_ray.published_encoder", "rknn_ray.runio", "rknn_ray.student"],
    "rknn_ray.predictor_check": ["rknn_ray.errors"],
    "rknn_ray.accounting": ["rknn_ray.errors", "rknn_ray.runio"],
    "rknn_ray.training": ["rknn_ray", "rknn_ray.errors", "rknn_ray.interrupts"],
    "rknn_ray.report_row": [],
    "rknn_ray.representation": ["rknn_ray.errors", "rknn_ray.keyspec", "rknn_ray.runio",
                                "rknn_ray.training"],
    "rknn_ray.student": ["rknn_ray.errors", "rknn_ray.keyspec", "rknn_ray.representation",
                         "rknn_ray.runio", "rknn_ray.training"],
    "rknn_ray.labeling": ["rknn_ray.errors", "rknn_ray.keyspec", "rknn_ray.student"],
    "rknn_ray.data": ["rknn_ray.accounting", "rknn_ray.errors", "rknn_ray.keyspec",
                      "rknn_ray.rng"],
    "rknn_ray.mechanisms": ["rknn_ray.accounting", "rknn_ray.errors", "rknn_ray.keyspec",
                            "rknn_ray.labeling", "rknn_ray.rng"],
    "rknn_ray.client_step": ["rknn_ray.labeling", "rknn_ray.mechanisms", "rknn_ray.rng",
                             "sealing"],
    # the baselines' shared setup is the job layer's (rknn_ray.job.baselines.prepare_baseline)
    "rknn_ray.baselines": ["rknn_ray.accounting", "rknn_ray.labeling", "rknn_ray.report_row",
                           "rknn_ray.rng", "rknn_ray.student"],
    # config.py composes the sections each package declares (rknn_ray/<package>/config.py)
    "rknn_ray.config_names": ["rknn_ray.errors"],     # finds jobs/configs by spec, no import
    "rknn_ray.config": ["rknn_ray.data", "rknn_ray.errors", "rknn_ray.keyspec",
                        "rknn_ray.labeling", "rknn_ray.mechanisms", "rknn_ray.remote",
                        "rknn_ray.representation", "rknn_ray.student"],
    # the operator's side of holders off the cluster: its keys, registry, a party's process,
    # and the check that reaches the service before Ray starts (sealing's client)
    "rknn_ray.remote": ["rknn_ray.accounting", "rknn_ray.errors", "rknn_ray.keyspec",
                        "rknn_ray.runio", "sealing"],
    # the job reaches the parties (server, shuffler) through their actors only; a remote
    # round checks its specification with the holder program's own accountant
    "rknn_ray.job": ["actors", "holder", "rknn_ray", "rknn_ray.accounting", "rknn_ray.baselines",
                     "rknn_ray.client_step", "rknn_ray.config", "rknn_ray.config_names",
                     "rknn_ray.data",
                     "rknn_ray.errors", "rknn_ray.interrupts", "rknn_ray.labeling",
                     "rknn_ray.mechanisms", "rknn_ray.plots", "rknn_ray.predictor",
                     "rknn_ray.published_encoder", "rknn_ray.remote", "rknn_ray.representation",
                     "rknn_ray.rng", "rknn_ray.runio", "rknn_ray.shard_secrets",
                     "rknn_ray.student", "rknn_ray.training", "sealing"],
}
#: folder cycles tolerated (none: config.py composes the sections, data never imports it)
KNOWN_FOLDER_CYCLES: list = []
#: library files whose imports inside functions are exempt from giving a reason (none)
REWRITTEN_ELSEWHERE: tuple = ()


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_cycle_inside_a_package():
    """A package's ``__init__`` and its submodules do not import each other both ways."""
    assert cycles(package_graph()) == []


def test_no_folder_level_cycle():
    """The library's folders (subpackages and top-level modules) and the other packages form
    no cycle, imports inside functions included."""
    assert cycles(graph(scan(), folder, nodes=modules())) == KNOWN_FOLDER_CYCLES


def test_every_library_folder_imports_only_what_it_is_allowed():
    folders = {folder(m) for m in modules() if m.startswith("rknn_ray")}
    assert sorted(folders) == sorted(ALLOWED)           # every subpackage and module has its list
    outside = sorted({(folder(i.importer), folder(i.target), i.importer) for i in scan()
                      if folder(i.importer) in ALLOWED and folder(i.target) != folder(i.importer)
                      and folder(i.target) not in ALLOWED[folder(i.importer)]})
    assert outside == []


def test_each_allowed_list_is_exactly_what_its_folder_imports():
    """No stale entry: an arrow that is gone leaves the map too, so the map stays the
    drawing of the library's imports (at any depth), not a list of permissions."""
    imported = {f: set() for f in ALLOWED}
    for i in scan():
        if folder(i.importer) in ALLOWED and folder(i.target) != folder(i.importer):
            imported[folder(i.importer)].add(folder(i.target))
    stale = {f: sorted(set(ALLOWED[f]) - imported[f]) for f in ALLOWED
             if set(ALLOWED[f]) - imported[f]}
    assert stale == {}


def test_no_library_folder_imports_one_on_its_floor_or_above():
    """The floors of benchmarks/import_graph.py (drawn from module-level imports) have no
    upward arrow inside the library: a function-level import never reaches a folder on the
    importer's floor or above (which would tie the layers together where no reader looks)."""
    assert [u for u in measure()["upward"] if u[0].startswith("rknn_ray")] == []


def test_imports_inside_library_functions_say_what_they_defer():
    """An import inside a function is there to defer a heavy package (torch, ray, scipy,
    faiss, ...) and says so in a comment on its line or the line above (a run of imports
    under one reason: on the first); any other import stands at the top of its module."""
    bare = []
    for name, path in modules().items():
        if not name.startswith("rknn_ray") or name.startswith(REWRITTEN_ELSEWHERE):
            continue
        lines = path.read_text().splitlines()

        def visit(node, in_function):
            said = False        # a run of imports shares the reason its first one gives
            for child in ast.iter_child_nodes(node):
                if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                    here, above = lines[child.lineno - 1], lines[child.lineno - 2].strip()
                    said = said or "#" in here or above.startswith("#")
                    if not said:
                        bare.append(f"{path.relative_to(ROOT)}:{child.lineno}: "
                                    f"{ast.unparse(child)}")
                    continue
                said = False
                visit(child, in_function or isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
        visit(parse_source("\n".join(lines)), False)
    assert bare == []


def test_layer_scan_sees_imports_inside_functions_and_folder_cycles(tmp_path):
    """The scan on a made-up tree: an import inside a function closes a folder cycle."""
    for pkg in ("sealing", "server", "shuffler", "actors", "jobs", "benchmarks"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    lib = tmp_path / "rknn_ray"
    (lib / "a").mkdir(parents=True)
    (lib / "b").mkdir()
    for f in ("__init__.py", "a/__init__.py", "b/__init__.py"):
        (lib / f).write_text("")
    (lib / "a" / "x.py").write_text("from rknn_ray.b.y import f\n")
    (lib / "b" / "y.py").write_text("def f():\n    from rknn_ray.a import x  # deferred\n")
    imports = scan(tmp_path)
    inside = [i for i in imports if i.in_function]
    assert [(i.importer, i.target, i.comment) for i in inside] == [
        ("rknn_ray.b.y", "rknn_ray.a", "deferred"), ("rknn_ray.b.y", "rknn_ray.a.x", "deferred")]
    g = graph(imports, folder, nodes=modules(tmp_path))
    assert cycles(g) == [["rknn_ray.a", "rknn_ray.b"]]
    assert floors(graph(imports, folder, module_level_only=True, nodes=modules(tmp_path)))[
        "rknn_ray.a"] == 1


def test_run_is_a_plain_import_of_the_job_package():
    """``rknn_ray.job.run`` is an ordinary module-level import (no module ``__getattr__``
    hides it from readers and tools), and the Ray worker hook lives where importing it
    loads nothing of the library."""
    init = modules()["rknn_ray.job"]
    tree = parse_source(init.read_text())
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body)
    assert any(isinstance(n, ast.ImportFrom) and n.module == "rknn_ray.job.runner"
               and {a.name for a in n.names} >= {"run", "RunResult"} for n in tree.body)
    hook_env = parse_source(modules()["rknn_ray.job.ray_env"].read_text())
    (hook,) = [n.value for n in ast.walk(hook_env) if isinstance(n, ast.Constant)
               and str(n.value).endswith(".pin_ray_address")]
    assert hook.startswith("actors.") and not import_graph()[hook.rpartition(".")[0]]


def test_importing_the_library_loads_neither_ray_nor_the_job_layer():
    """``rknn_ray.run`` is reached on first use: a process that imports the library (a Ray
    worker, an opener) does not pay for Ray and the job layer, and ``rknn_ray.run`` is the
    job layer's ``run``."""
    import subprocess
    import sys
    code = ("import sys, rknn_ray, rknn_ray.labeling.stage; "
            "print(sorted(m for m in ('ray', 'rknn_ray.job') if m in sys.modules)); "
            "from rknn_ray.job.api import run; print(rknn_ray.run is run)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split("\n")
    assert out[:2] == ["[]", "True"]


def test_accounting_imports_no_mechanism():
    """Guarantees are the accountant's (rknn_ray.accounting.guarantee); mechanisms give
    their events. The empirical audit, which runs mechanisms, sits in benchmarks."""
    assert not any(i.importer.startswith("rknn_ray.accounting")
                   and i.target.startswith("rknn_ray.mechanisms") for i in scan())
    assert not hasattr(importlib.import_module("rknn_ray.mechanisms.base"), "Guarantee")


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_package_imports_a_layer_above_it():
    upward = sorted((a, b) for a, deps in import_graph().items() for b in deps
                    if layer_of(b) > layer_of(a))
    assert upward == []


def test_orchestration_layer_sits_between_actors_and_jobs():
    """rknn_ray.job is its own layer: above actors, below jobs; no other rknn_ray module
    (and no party package) imports it, and the CLIs reach the actors through it."""
    assert layer_of("actors.server") < layer_of("rknn_ray.job.session") < layer_of("jobs.distill")
    assert layer_of("rknn_ray.job") > layer_of("rknn_ray.labeling.stage")
    graph = import_graph()
    assert "rknn_ray.job.session" in graph and "rknn_ray.job.runner" in graph
    into_job = sorted(a for a, deps in graph.items() for b in deps
                      if b.startswith("rknn_ray.job") and not a.startswith("rknn_ray.job")
                      and layer_of(a) < LAYERS["rknn_ray.job"])
    assert into_job == []
    # the protocol session and the run are the layer's, not the CLI's
    assert not any(m in graph for m in ("jobs.protocol", "jobs.release_file", "jobs.ray_env"))
    assert any(b.startswith("rknn_ray.job") for b in graph["jobs.distill"])


def test_layer_rule_catches_the_library_importing_the_orchestration_layer():
    assert layer_of("rknn_ray.job.session") > layer_of("rknn_ray.labeling.stage")
    assert layer_of("rknn_ray.jobless") == LAYERS["rknn_ray"]   # a prefix, not a substring


@pytest.mark.parametrize("stage", ["rknn_ray.representation", "rknn_ray.labeling"])
def test_each_stage_package_imports_only_what_its_init_allows(stage):
    """A stage package's ``__init__`` says what it may import (``MAY_IMPORT``); every import
    of its modules, wherever it stands, is that, the package itself, or nothing of ours."""
    allowed = importlib.import_module(stage).MAY_IMPORT
    graph = import_graph()
    outside = sorted((m, d) for m, deps in graph.items() if m == stage or m.startswith(stage + ".")
                     for d in deps
                     if not (d == stage or d.startswith(stage + "."))
                     and not any(d == a or d.startswith(a + ".") for a in allowed))
    assert outside == []


def test_a_pickle_made_under_an_old_module_name_still_loads():
    """encoder.pkl files written before the stage packages name e.g. rknn_ray.represent."""
    import pickle

    import numpy as np

    from rknn_ray.representation.represent import RawEncoder
    enc = RawEncoder()
    blob = pickle.dumps(enc, protocol=0)     # text opcodes: the module name can be edited
    old = blob.replace(b"rknn_ray.representation.represent", b"rknn_ray.represent")
    assert old != blob
    back = pickle.loads(old)
    assert type(back) is RawEncoder
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(back.transform(x), enc.transform(x))
