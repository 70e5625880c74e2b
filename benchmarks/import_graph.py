"""The project's import graph from an AST scan: every import statement, at any depth.

    python -m benchmarks.import_graph [--json OUT]

Says what a reader of the import graph needs to keep the layers honest:

* ``cycles``: strongly connected groups of folders (``rknn_ray``'s subpackages and
  top-level modules, and the other top-level packages) and of files, imports inside
  functions included (an import deferred into a function still ties two modules together);
* ``function_level``: import statements of project modules that stand inside a function,
  per file, in all and in the library;
* ``floors``: each folder's floor in the graph of module-level imports (a folder that
  imports no other folder is on floor 0, else one above the highest folder it imports);
* ``upward``: arrows that point up that drawing: an import (at any depth) of a folder on the
  importer's floor or above it, which only an import inside a function can make.

tests/test_layers.py holds the library to its layers with the same scan.
"""
from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sealing", "rknn_ray", "server", "shuffler", "holder", "actors", "jobs", "benchmarks")


@dataclass(frozen=True)
class Import:
    """One import of a project module: who, what, where, and whether inside a function."""
    importer: str
    target: str
    line: int
    in_function: bool
    comment: str            # on its line, the line above, or its run's first import; or ""


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project's packages."""
    mods = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def _targets(node: ast.AST, importer: str, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:          # relative: resolve against the importer's package
        base = importer.split(".")
        base = base[:len(base) - node.level + (1 if is_pkg else 0)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return [module] + [f"{module}.{a.name}" for a in node.names]


def scan(root: Path = ROOT) -> list[Import]:
    """Every import of a project module by a project module (itself and its own submodules
    left out), with its depth and reason comment."""
    mods = modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    out = []
    for name, path in mods.items():
        text = path.read_text()
        lines = text.splitlines()
        is_pkg = path.name == "__init__.py"

        def visit(node: ast.AST, in_function: bool) -> None:
            said = ""           # a run of imports shares the reason its first one gives
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    found = {resolve(t) for t in _targets(child, name, is_pkg)} - {None}
                    here = lines[child.lineno - 1]
                    above = lines[child.lineno - 2].strip() if child.lineno > 1 else ""
                    said = here.split("#", 1)[1].strip() if "#" in here else \
                        above[1:].strip() if above.startswith("#") else said
                    for t in sorted(found):
                        if t != name and not t.startswith(name + "."):
                            out.append(Import(name, t, child.lineno, in_function, said))
                    continue
                said = ""
                visit(child, in_function or isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(ast.parse(text), False)
    return out


def folder(module: str) -> str:
    """The folder a module counts in: ``rknn_ray.<sub>`` inside the library (a subpackage or a
    top-level module), else its top-level package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "rknn_ray" and len(parts) > 1 else parts[0]


def graph(imports: list[Import], level=lambda m: m, *, module_level_only: bool = False,
          nodes=()) -> dict[str, set[str]]:
    """importer -> imported, with both ends mapped through ``level`` (self-loops dropped);
    ``nodes``: modules that are nodes even when they import nothing of ours."""
    g: dict[str, set[str]] = {}
    for m in nodes:
        g.setdefault(level(m), set())
    for i in imports:
        if module_level_only and i.in_function:
            continue
        a, b = level(i.importer), level(i.target)
        if a != b:
            g.setdefault(a, set()).add(b)
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
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
                    work.append((w, iter(sorted(g.get(w, ())))))
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
    return sorted(out)


def floors(g: dict[str, set[str]]) -> dict[str, int]:
    """Longest import chain below each node (a cycle's members share one floor)."""
    comp_of = {}
    for comp in cycles(g):
        for m in comp:
            comp_of[m] = tuple(comp)
    memo: dict[tuple, int] = {}

    def floor_of(c: tuple) -> int:
        if c not in memo:
            memo[c] = -1                                   # guards a re-entry
            deps = {comp_of.get(d, (d,)) for m in c for d in g.get(m, ())} - {c}
            memo[c] = 1 + max((floor_of(d) for d in deps), default=-1)
        return memo[c]

    return {m: floor_of(comp_of.get(m, (m,))) for m in g}


def measure(root: Path = ROOT) -> dict:
    imports, mods = scan(root), modules(root)
    fl = graph(imports, folder, nodes=mods)
    flo = floors(graph(imports, folder, module_level_only=True, nodes=mods))
    upward = sorted({(folder(i.importer), folder(i.target)) for i in imports
                     if folder(i.importer) != folder(i.target)
                     and flo[folder(i.target)] >= flo[folder(i.importer)]})
    in_fn = {(i.importer, i.line): i for i in imports if i.in_function}   # one per statement
    per_file = Counter(m for m, _ in in_fn)
    lib = Counter(m for m, _ in in_fn if m.startswith("rknn_ray"))
    by_floor: dict[int, list[str]] = {}
    for m, f in sorted(flo.items()):
        by_floor.setdefault(f, []).append(m)
    return {
        "folder_cycles": cycles(fl),
        "file_cycles": cycles(graph(imports, nodes=mods)),
        "function_level": {"statements": len(in_fn), "files": len(per_file),
                           "top": per_file.most_common(5),
                           "library_statements": sum(lib.values()), "library_files": len(lib),
                           "library_top": lib.most_common(5),
                           "without_reason": sum(1 for i in in_fn.values() if not i.comment)},
        "floors": {str(k): v for k, v in sorted(by_floor.items())},
        "upward": [list(u) for u in upward],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the numbers to this file")
    ap.add_argument("--root", default=str(ROOT), help="the project checkout to scan")
    args = ap.parse_args(argv)
    out = measure(Path(args.root))
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
