"""The import graph keeps its layers: no labkit module imports one of a higher layer, and no
group of modules imports itself round in a circle.

Read with the stdlib's `ast`, without importing anything: every ``import`` and ``from ... import``
of a labkit module counts, at module level or inside a function (an import inside a function is
still a dependency; only ``if TYPE_CHECKING:`` blocks are left out). A unit is a top-level
module or sub-package of labkit; LAYERS lists them bottom up, and a unit may import only units
of strictly lower layers (so the units cannot form a cycle). Within a unit, the modules' own
imports must not form a cycle either."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import labkit

ROOT = Path(labkit.__file__).parent

# Bottom up. A unit imports only units of lower layers.
LAYERS: list[tuple[str, ...]] = [
    ("__init__", "paths", "presets", "plots", "report", "book", "stats", "knee", "dtypes",
     "scheduling", "ragged"),                # no labkit imports
    ("device", "tokenizer", "roofline", "exercise", "notebooks"),
    ("timing", "session", "data", "passages", "doctor"),
    ("bench", "model"),                      # microbenchmarks; the decoder
    ("phases", "pipeline", "train", "quant", "fusion", "sim", "shipped"),
    ("prune",),
    ("distill",),                            # distil, then prune, then quantize
    ("serve",),                              # the engine and server
    ("loadgen",),                            # drives the server over HTTP
    ("ledger",),                             # predicts, judges, runs the claims' experiments
    ("benches",),                            # the programs
    ("cli",),
    ("__main__",),
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}

def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports(module: str, source: str) -> set[str]:
    """The labkit modules `module` imports (the deepest existing module each import names)."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = module if MODULES.get(module, Path()).name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        if _type_checking_only(node, parents):
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != "labkit" and name != module:
                found.add(name)
    return found


MAX_FUNCTION_LEVEL_IMPORTS = 139

GRAPH = {m: imports(m, p.read_text()) for m, p in MODULES.items()}


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in MODULES}
    assert not units - set(LAYER), f"add these to LAYERS: {sorted(units - set(LAYER))}"
    assert not set(LAYER) - units, f"gone from labkit, remove from LAYERS: {sorted(set(LAYER) - units)}"


def test_no_import_points_up_or_sideways():
    bad = [f"{m} -> {t} ({_unit(m)} is layer {LAYER[_unit(m)]}, {_unit(t)} is layer {LAYER[_unit(t)]})"
           for m, targets in sorted(GRAPH.items()) for t in sorted(targets) if _unit(t) != _unit(m) and LAYER[_unit(t)] >= LAYER[_unit(m)]]
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def test_cycles_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_reader_sees_relative_function_level_imports():
    src = "import os\nfrom labkit.model import config\n\ndef f():\n    from .cost import LinearCost\n"
    assert imports("labkit.sim.engine", src) == {"labkit.model.config", "labkit.sim.cost"}


def test_no_module_cycles():
    # a package's own modules importing the package (its __init__ re-exports) is not a cycle
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in GRAPH.items()}
    assert cycles(graph) == []


@pytest.mark.parametrize("layer", range(len(LAYERS)))
def test_layers_are_disjoint(layer):
    assert not set(LAYERS[layer]) & {u for i, us in enumerate(LAYERS) if i != layer for u in us}


def count_function_level_imports() -> int:
    """Import statements inside a function body, over all of labkit."""
    n = 0
    for p in MODULES.values():
        tree = ast.parse(p.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                up = node
                while up in parents and not isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    up = parents[up]
                n += isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef))
    return n


def test_function_level_imports_do_not_grow():
    """Imports inside functions hide dependencies from a reader; they stay for heavy or optional
    dependencies (matplotlib, transformers, FastAPI, torch where a process must start without
    it). The bound only falls."""
    n = count_function_level_imports()
    assert n <= MAX_FUNCTION_LEVEL_IMPORTS, f"{n} imports inside functions; at most {MAX_FUNCTION_LEVEL_IMPORTS}"
