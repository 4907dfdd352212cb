"""The house's shape, checked on the source (ast, nothing imported):

- layers import only downward: schemas < clients < producers | streams | consumers < infra, and the
  three middle packages do not import each other;
- no import cycle between modules (lazy imports inside functions count too: they are the same edge);
- no module over 500 lines; no function over 50 lines unless its docstring says why ("Long: ...").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RANK = {"schemas": 0, "clients": 1, "producers": 2, "streams": 2, "consumers": 2, "infra": 3}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 50


def _modules() -> dict[str, Path]:
    out = {}
    for package in RANK:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Project modules imported by one module (absolute and relative, top level and lazy)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from pkg import mod` is an edge to the module, not to pkg
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {_owner(m) for m in found if _owner(m)}


def _owner(dotted: str) -> str | None:
    """The project module a dotted import name refers to (a module, or the package of a name)."""
    while dotted:
        if dotted in MODULES:
            return dotted
        dotted = dotted.rpartition(".")[0]
    return None


GRAPH = {name: _imports(name, path) - {name} for name, path in MODULES.items()}


def test_layers_import_only_downward():
    bad = []
    for name, targets in GRAPH.items():
        top = name.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            if other != top and RANK[other] >= RANK[top]:
                bad.append(f"{name} -> {target}")
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(bad))


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    cycles = _cycles()
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_at_most_500_lines(name):
    lines = MODULES[name].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_MODULE_LINES, f"{MODULES[name].relative_to(REPO)} has {lines} lines"


def test_long_functions_say_why():
    long = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            length = node.end_lineno - node.lineno + 1
            doc = ast.get_docstring(node) or ""
            if length > MAX_FUNCTION_LINES and "Long:" not in doc:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, "functions over 50 lines without a 'Long: <why>' docstring:\n" + "\n".join(long)
