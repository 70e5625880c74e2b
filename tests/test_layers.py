"""The packages form layers: each imports only the layers below it, and no module imports
itself back through others (no import cycle, not even one held together by an import
inside a function).

Layers, bottom up: ``sealing`` (the report format every party shares) < ``rknn_ray``
(the library) < ``server`` and ``shuffler`` (the parties' own code, which never import
each other: tests/test_import_rules.py) < ``actors`` (thin Ray actors) < ``rknn_ray.job``
(the orchestration layer: session, rounds, release file, Ray start-up, ``run``) < ``jobs``
(the entrypoints) < ``benchmarks``. ``rknn_ray.job`` lives inside the library's folder but
is its own layer: nothing else in ``rknn_ray`` imports it. Every import statement counts,
wherever it stands.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"sealing": 0, "rknn_ray": 1, "server": 2, "shuffler": 2, "actors": 3, "rknn_ray.job": 4,
          "jobs": 5, "benchmarks": 6}


def layer_of(module: str) -> int:
    """The layer of a module: its longest package prefix in LAYERS (rknn_ray.job before rknn_ray)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    raise KeyError(module)


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in (p for p in LAYERS if "." not in p):
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (a package's own submodules left out)."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            deps |= {r for r in map(resolve, targets) if r}
        graph[name] = {d for d in deps if d != name and not d.startswith(name + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycles():
    assert cycles(import_graph()) == []


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
    assert layer_of("rknn_ray.job") > layer_of("rknn_ray.pipeline")
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
    assert layer_of("rknn_ray.job.session") > layer_of("rknn_ray.pipeline")
    assert layer_of("rknn_ray.jobless") == LAYERS["rknn_ray"]   # a prefix, not a substring


@pytest.mark.parametrize("stage", ["rknn_ray.representation", "rknn_ray.labeling"])
def test_each_stage_package_imports_only_what_its_init_allows(stage):
    """A stage package's ``__init__`` says what it may import (``MAY_IMPORT``); every import
    of its modules, wherever it stands, is that, the package itself, or nothing of ours."""
    import importlib
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
