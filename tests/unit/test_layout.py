"""The package tree is the flow: the node side loads nothing of the login side, and no two packages import each
other, directly or around a circle.

A "unit" of the graph is a subpackage of swiftslurm (planning, rundir, ckpt, engines, ...) or a top-level module
(plan, render, slurm, ...). Imports under `if TYPE_CHECKING:` are annotations, not dependencies.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "swiftslurm"
# What the node side may load of swiftslurm: the wrapper and what both sides share.
NODE_MAY_LOAD = {"", "node", "plan", "errors", "signals", "secrets", "tiny", "render", "container", "slurm",
                 "slurm_env", "rundir", "ckpt", "engines", "storage", "preflight"}  # fmt: skip
LOGIN_ONLY = {"planning", "submit", "sweep", "ops", "cli", "launch", "__main__"}
THIRD_PARTY_LOGIN = ("hydra", "omegaconf", "submitit")
# submitit pickles the node's entry point by its name: the login side names it (imported where the job is built,
# never at module level), and only the node runs it.
HANDOFF = {("swiftslurm.submit.jobs", "swiftslurm.node.supervise")}


def unit_of(module: str) -> str:
    """swiftslurm.rundir.layout -> rundir; swiftslurm.plan -> plan."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _runtime_imports(tree: ast.AST, module: str) -> Iterator[str]:
    """Every swiftslurm module imported by ``tree`` at any depth, except under `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (i for n in node.orelse for i in _runtime_imports(n, module))
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative
                base = ".".join(module.split(".")[: -node.level] + ([base] if base else []))
            if base.startswith("swiftslurm"):
                yield base
                yield from (f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("swiftslurm"))
        else:
            yield from _runtime_imports(node, module)


def module_graph() -> dict[str, set[str]]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported = set(_runtime_imports(ast.parse(path.read_text()), name))
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def unit_graph() -> dict[str, set[str]]:
    units: dict[str, set[str]] = defaultdict(set)
    for module, imported in module_graph().items():
        for other in imported:
            if unit_of(other) and unit_of(other) != unit_of(module):
                units[unit_of(module)].add(unit_of(other))
    return units


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_two_packages_import_each_other() -> None:
    graph = unit_graph()
    assert "node" in graph["submit"]  # the handoff: the graph sees function-level imports
    assert circles(graph) == []


def test_no_modules_import_each_other() -> None:
    assert circles(module_graph()) == []


def test_the_node_side_reaches_no_login_side_module_even_lazily() -> None:
    graph = module_graph()
    reached, todo = set(), ["swiftslurm.node.supervise", "swiftslurm.node.__main__"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph.get(module, ()))
    assert sorted(m for m in reached if unit_of(m) not in NODE_MAY_LOAD) == []


def test_the_login_side_reaches_no_node_module() -> None:
    graph = module_graph()
    login = [m for m in graph if unit_of(m) in LOGIN_ONLY]
    assert sorted((m, o) for m in login for o in graph[m] if unit_of(o) == "node" and (m, o) not in HANDOFF) == []


@contextmanager
def fresh_modules(*prefixes: str) -> Iterator[None]:
    """Forget every loaded module under ``prefixes`` for the block, then put the originals back."""
    saved = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] in prefixes}
    for name in saved:
        del sys.modules[name]
    try:
        yield
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] in prefixes]:
            del sys.modules[name]
        sys.modules.update(saved)


def loaded_by(module: str) -> list[str]:
    with fresh_modules("swiftslurm", *THIRD_PARTY_LOGIN):
        __import__(module)
        return sorted(m for m in sys.modules if m.split(".")[0] in ("swiftslurm", *THIRD_PARTY_LOGIN))


def test_importing_the_node_wrapper_loads_no_login_side_module() -> None:
    loaded = loaded_by("swiftslurm.node.supervise")
    assert "swiftslurm.node.supervise" in loaded
    assert [m for m in loaded if unit_of(m) not in NODE_MAY_LOAD or m.split(".")[0] != "swiftslurm"] == []


@pytest.mark.parametrize("module", ["swiftslurm.planning.make", "swiftslurm.ops.status", "swiftslurm.submit.jobs"])
def test_importing_the_login_side_loads_no_node_module(module: str) -> None:
    assert [m for m in loaded_by(module) if unit_of(m) == "node"] == []


if __name__ == "__main__":  # python tests/unit/test_layout.py: what swiftslurm.node.supervise loads, and the graph
    print("\n".join(loaded_by(sys.argv[1] if len(sys.argv) > 1 else "swiftslurm.node.supervise")))
    print("circles:", circles(unit_graph()), circles(module_graph()))
