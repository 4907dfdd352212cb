"""The house's shape, checked on the source (ast, nothing imported):

- layers import only downward: schemas < clients < producers | streams | consumers < infra, and the
  three middle packages do not import each other;
- floors inside `infra/`: each room (a direct child, sub-package or module) has a floor in
  INFRA_RANK and imports only rooms on lower floors;
- no import cycle between modules, and none between the rooms of any package or folder (lazy
  imports inside functions count too: they are the same edge);
- no import strings (`import_module(...)`, `__import__(...)`) in product code, and children started
  by module name (`python -m ...`) only through `infra.runtime.python_module_argv`;
- no Kafka consumer, producer or admin client built outside `clients/` (everything else takes one
  from the factory in `clients.kafka`, with its one set of limits); tests may build raw ones;
- product code never imports the tests (nor starts a tests module as a child);
- every name has one home, and importers (product and tests) import it from there: an `__all__`
  lists only names its module defines (def, class, assignment); a package `__init__` imports no
  project name that its own code does not use (a docstring-only `__init__`, or one whose code uses
  what it imports, is fine) and has no `__getattr__`; `from M import name` needs `name` defined in
  M (or to be a submodule of M). Only PUBLIC_FACES, the documented user APIs, re-export;
- no module over 500 lines; no function over 50 lines unless its docstring says why ("Long: ...").

The checkers are functions of a graph, so the last tests run them on a small tree with a deliberate
back-edge and show that they catch it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RANK = {"schemas": 0, "clients": 1, "producers": 2, "streams": 2, "consumers": 2, "infra": 3}
# Floors of infra/, low to high. A room imports only rooms on a lower floor (never the same one).
INFRA_RANK = {
    "errors": 0,  # the exception root
    "terminal": 1,  # say / lines / tables: what a person at the terminal sees
    "options": 1,  # the option kit: env-backed options, options generated from config dataclasses
    "runtime": 1,  # how processes run: `python -m` child command lines, gc settings
    "broker": 2,  # the embedded Kafka broker: schemas, clients and infra.errors only
    "supervisor": 2,  # child processes of the stack, stopped by PID
    "clickhouse": 2,  # the query layer (no commands, no printing)
    "evaluation": 2,  # pure evaluation statistics and the paired comparison of policies
    "status": 2,
    "replay": 2,
    "stack": 3,  # the supervised stack: supervisor + migrations through the query layer
    "training_group": 3,  # `train --nproc`: the ranks, launched and restarted as one group
    "lineage": 3,
    "export": 3,
    "docker_engine": 4,
    "sandbox_engine": 4,  # the private dockerd of the Docker sandbox and its image
    "console": 4,  # the read-side apps over the query layer
    "mcp": 4,
    "demo": 5,  # the guided tour and the learning loop, over the stack
    "learn": 5,
    "bench": 6,  # the benchmark lab, over everything it measures
    "training_gate": 6,  # `train --gate`'s in-process held-out evaluator, over learn's evaluation
    "commands": 7,  # the `agentstream` subcommands
    "cli": 8,  # the parser and `main`: nothing imports it
}
MODULE_FLAG_HOME = "infra.runtime"  # the one module that writes `"-m"` (python_module_argv)
KAFKA_CLIENTS = (
    "KafkaConsumer",
    "AIOKafkaConsumer",
    "KafkaProducer",
    "AIOKafkaProducer",
    "KafkaAdminClient",
    "AIOKafkaAdminClient",
    "KafkaClient",  # the bare network clients (a reachability probe builds one)
    "AIOKafkaClient",
)
KAFKA_CLIENT_HOME = "clients"  # the one package that builds them (clients.kafka's factory)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 50
# The documented user APIs (README.md, producers/README.md, docs/): the only modules that re-export
# names from their parts. Everything else is imported from the module that defines it.
PUBLIC_FACES = {
    "schemas",  # `from schemas import StepRecorded, encode, ...` (docs/architecture.md)
    "schemas.events",  # the event models by family (docs/reward-definitions.md)
    "producers",  # `from producers import AgentRecorder, ...` (README.md, producers/README.md)
    "producers.envs",  # the env registry: `producers.envs.make("calc")` (docs/operations.md)
}


def modules_under(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `packages` under `root`."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
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
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {_owner(m, modules) for m in found if _owner(m, modules)}


def _owner(dotted: str, modules: dict[str, Path]) -> str | None:
    """The project module a dotted import name refers to (a module, or the package of a name)."""
    while dotted:
        if dotted in modules:
            return dotted
        dotted = dotted.rpartition(".")[0]
    return None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    return {name: _imports(name, path, modules) - {name} for name, path in modules.items()}


MODULES = modules_under(REPO, RANK)
GRAPH = import_graph(MODULES)


def room_of(module: str, folder: str) -> str | None:
    """The direct child of package `folder` that `module` lives in (None outside it, or for
    the package itself).

    >>> room_of("infra.cli.main", "infra"), room_of("infra.errors", "infra"), room_of("infra", "infra")
    ('cli', 'errors', None)
    """
    if not module.startswith(folder + "."):
        return None
    return module[len(folder) + 1 :].split(".")[0]


def room_edges(graph: dict[str, set[str]], folder: str) -> dict[str, set[str]]:
    """Room -> rooms it imports, among the direct children of `folder`."""
    edges: dict[str, set[str]] = {}
    for name, targets in graph.items():
        source = room_of(name, folder)
        for target in targets:
            room = room_of(target, folder)
            if source is not None and room is not None and room != source:
                edges.setdefault(source, set()).add(room)
    return edges


def floor_violations(graph: dict[str, set[str]], folder: str, rank: dict[str, int]) -> list[str]:
    """Imports from a room to one on the same or a higher floor, and rooms without a floor."""
    rooms = {room_of(name, folder) for name in graph} - {None}
    bad = [f"{folder}.{room}: no floor in the rank table" for room in sorted(rooms - set(rank))]
    for name, targets in sorted(graph.items()):
        source = room_of(name, folder)
        for target in sorted(targets):
            room = room_of(target, folder)
            if source in rank and room in rank and room != source and rank[room] >= rank[source]:
                bad.append(f"{name} -> {target}")
    return bad


def strong_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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

    for v in sorted(set(graph) | {w for targets in graph.values() for w in targets}):
        if v not in index:
            visit(v)
    return out


def folder_cycles(graph: dict[str, set[str]], modules: dict[str, Path]) -> list[str]:
    """Loops among the rooms of every package and every folder nested inside one."""
    folders = sorted(name for name, path in modules.items() if path.name == "__init__.py")
    return [
        f"{folder}/: " + " <-> ".join(loop)
        for folder in folders
        for loop in strong_components(room_edges(graph, folder))
    ]


def import_strings(modules: dict[str, Path]) -> list[str]:
    """Calls that import a module named by a string: `import_module(...)` or `__import__(...)`."""
    found = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called in ("import_module", "__import__"):
                    found.append(f"{name}:{node.lineno} {called}(...)")
    return found


def module_flags(modules: dict[str, Path], package: str, home: str) -> list[str]:
    """`"-m"` literals of `package` outside `home`: a child started by module name elsewhere."""
    found = []
    for name, path in modules.items():
        if name.split(".")[0] != package or name == home:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value == "-m":
                found.append(f"{name}:{node.lineno}")
    return found


def kafka_clients_built(modules: dict[str, Path], home: str) -> list[str]:
    """Calls that build a Kafka consumer, producer or admin client (`KafkaConsumer(...)`,
    `aiokafka.AIOKafkaProducer(...)`, `admin.KafkaAdminClient(...)`) outside the package `home`."""
    found = []
    for name, path in modules.items():
        if name.split(".")[0] == home:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called in KAFKA_CLIENTS:
                    found.append(f"{name}:{node.lineno} {called}(...)")
    return found


def uses_of_tests(modules: dict[str, Path]) -> list[str]:
    """Product modules that use the tests: `import tests...`, `from tests... import ...`, or a child
    started from a tests module (`python_module_argv("tests....")`). Tests may import the product,
    never the other way round: an installed product has no tests package."""
    found = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            found += [f"{name}:{node.lineno} {used}" for used in _tests_named(node)]
    return found


def _tests_named(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level:
        names = [node.module or ""]
    elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        names = [str(node.args[0].value)] if called == "python_module_argv" else []
    else:
        return []
    return [n for n in names if n == "tests" or n.startswith("tests.")]


def _top_level_names(tree: ast.Module) -> tuple[set[str], dict[str, ast.Import | ast.ImportFrom]]:
    """Names a module defines at its top level (def, class, assignment; inside `if`/`try` too) and the
    names it binds by import (name -> the import statement)."""
    defined: set[str] = set()
    imported: dict[str, ast.Import | ast.ImportFrom] = {}
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If | ast.Try):
            body += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            body += [s for handler in getattr(node, "handlers", []) for s in handler.body]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            imported |= {a.asname or a.name.split(".")[0]: node for a in node.names}
    return defined, imported


def _source_of(node: ast.ImportFrom, importer: str, path: Path) -> str:
    """The absolute module name a `from ... import` reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join([*anchor, node.module] if node.module else anchor)


def foreign_exports(modules: dict[str, Path], faces: Iterable[str]) -> list[str]:
    """Names in a module's `__all__` that the module does not define (it only imported them), outside
    the public faces."""
    found = []
    for name, path in modules.items():
        if name in faces:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined, _ = _top_level_names(tree)
        for node in tree.body:
            if not isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                listed = [c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)]
                found += [f"{name}:{node.lineno} {n}" for n in listed if n not in defined]
    return found


def package_reexports(modules: dict[str, Path], faces: Iterable[str]) -> list[str]:
    """Names a package `__init__` (outside the public faces) imports from the project and never uses
    itself, and `__getattr__` hooks there (the lazy form of the same)."""
    found = []
    for name, path in modules.items():
        if path.name != "__init__.py" or name in faces:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        defined, imported = _top_level_names(tree)
        for bound, node in imported.items():
            source = _source_of(node, name, path) if isinstance(node, ast.ImportFrom) else bound
            if _owner(source, modules) and bound not in used:
                found.append(f"{name}:{node.lineno} {bound}")
        if "__getattr__" in defined:
            found.append(f"{name}: __getattr__")
    return found


def imports_through_other_modules(
    importers: dict[str, Path], modules: dict[str, Path], faces: Iterable[str]
) -> list[str]:
    """`from M import name` (any depth, tests included) where project module M is not a public face
    and does not define `name` (nor is `name` a submodule of M): the name has a home elsewhere."""
    bindings = {m: _top_level_names(ast.parse(p.read_text(encoding="utf-8"))) for m, p in modules.items()}
    found = []
    for importer, path in importers.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _source_of(node, importer, path)
            if source not in modules or source in faces:
                continue
            for alias in node.names:
                if f"{source}.{alias.name}" not in modules and alias.name not in bindings[source][0]:
                    home = _home(source, alias.name, modules, bindings)
                    found.append(f"{importer}:{node.lineno} {source}.{alias.name} (defined in {home})")
    return found


def _home(module: str, name: str, modules: dict[str, Path], bindings: dict) -> str:
    """Where `name`, as seen from `module`, is defined: followed through the imports that bind it."""
    for _ in range(len(modules)):  # at most one hop per module
        defined, imported = bindings[module]
        node = imported.get(name)
        if name in defined or not isinstance(node, ast.ImportFrom):
            return module if name in defined else f"nowhere: {module} does not bind it"
        source = _source_of(node, module, modules[module])
        name = next(a.name for a in node.names if (a.asname or a.name) == name)
        if source not in modules:
            return source
        module = source
    return "?"


def test_layers_import_only_downward():
    bad = []
    for name, targets in GRAPH.items():
        top = name.split(".")[0]
        for target in targets:
            other = target.split(".")[0]
            if other != top and RANK[other] >= RANK[top]:
                bad.append(f"{name} -> {target}")
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(bad))


def test_infra_rooms_import_only_lower_floors():
    bad = floor_violations(GRAPH, "infra", INFRA_RANK)
    assert not bad, "imports against the floors of infra/ (INFRA_RANK):\n" + "\n".join(bad)


def test_no_import_cycles():
    cycles = strong_components(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_folder_level_cycles():
    loops = folder_cycles(GRAPH, MODULES)
    assert not loops, "rooms of a folder in one loop:\n" + "\n".join(loops)


def test_no_import_strings_in_product_code():
    found = import_strings(MODULES)
    assert not found, "modules imported by a string (import them directly):\n" + "\n".join(found)


def test_children_started_by_module_name_go_through_one_helper():
    found = module_flags(MODULES, "infra", MODULE_FLAG_HOME)
    assert not found, "`-m` outside infra.runtime (use python_module_argv / agentstream_argv):\n" + "\n".join(
        found
    )


def test_kafka_clients_are_built_only_in_clients():
    found = kafka_clients_built(MODULES, KAFKA_CLIENT_HOME)
    assert not found, "Kafka clients built outside clients/ (use clients.kafka.make_*):\n" + "\n".join(found)


def test_product_code_does_not_import_the_tests():
    found = uses_of_tests(MODULES)
    assert not found, "product modules using tests/ (move what they need into the product):\n" + "\n".join(
        found
    )


def test_all_lists_only_names_the_module_defines():
    found = foreign_exports(MODULES, PUBLIC_FACES)
    assert not found, "`__all__` naming what its module only imported (import from the home):\n" + "\n".join(
        found
    )


def test_package_inits_do_not_re_export():
    found = package_reexports(MODULES, PUBLIC_FACES)
    assert not found, "package __init__s re-exporting names of their parts (or PUBLIC_FACES):\n" + "\n".join(
        found
    )


def test_names_are_imported_from_the_module_that_defines_them():
    importers = modules_under(REPO, [*RANK, "tests"])
    found = imports_through_other_modules(importers, MODULES, PUBLIC_FACES)
    assert not found, "names imported through a module that only imported them:\n" + "\n".join(found)


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


# The checkers on a small tree: clean, then with one deliberate back-edge (a lazy import, which
# counts like any other), an import string and a `-m` child outside the helper.
_TREE = {
    "infra/__init__.py": "",
    "infra/errors.py": "class InfraError(Exception): ...\n",
    "infra/terminal/__init__.py": "",
    "infra/terminal/output.py": "from infra.errors import InfraError\n\n\ndef say(text): ...\n",
    "infra/commands/__init__.py": "",
    "infra/commands/sql.py": "from infra.terminal.output import say\n",
    "infra/cli/__init__.py": '"""The command line."""\n',
    "infra/cli/main.py": "from infra.commands import sql\n\n\ndef main(): ...\n",
}
_FAKE_RANK = {"errors": 0, "terminal": 1, "commands": 2, "cli": 3}


def _fake_tree(root: Path, extra: dict[str, str]) -> dict[str, Path]:
    for relative, text in {**_TREE, **extra}.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return modules_under(root, ["infra"])


def test_the_checks_pass_a_tree_without_back_edges(tmp_path):
    modules = _fake_tree(tmp_path, {})
    graph = import_graph(modules)
    assert graph["infra.cli.main"] == {"infra.commands.sql"}
    assert floor_violations(graph, "infra", _FAKE_RANK) == []
    assert folder_cycles(graph, modules) == []
    assert import_strings(modules) == []
    assert module_flags(modules, "infra", "infra.runtime") == []
    assert foreign_exports(modules, set()) == []
    assert package_reexports(modules, set()) == []
    assert imports_through_other_modules(modules, modules, set()) == []


def test_the_checks_report_a_deliberate_back_edge(tmp_path):
    back_edge = "from infra.errors import InfraError\n\n\ndef say(text):\n    from infra.cli import main\n"
    modules = _fake_tree(tmp_path, {"infra/terminal/output.py": back_edge})
    graph = import_graph(modules)
    assert floor_violations(graph, "infra", _FAKE_RANK) == ["infra.terminal.output -> infra.cli.main"]
    assert folder_cycles(graph, modules) == ["infra/: cli <-> commands <-> terminal"]


def test_the_checks_report_a_nested_folder_loop_and_a_room_without_a_floor(tmp_path):
    nested = {
        "infra/commands/parts/__init__.py": "",
        "infra/commands/parts/a.py": "from infra.commands.parts import b\n",
        "infra/commands/parts/b.py": "import infra.commands.parts.c\n",
        "infra/commands/parts/c.py": "from infra.commands.parts.a import x\n",
        "infra/lab.py": "",
    }
    modules = _fake_tree(tmp_path, nested)
    graph = import_graph(modules)
    assert folder_cycles(graph, modules) == ["infra.commands.parts/: a <-> b <-> c"]
    assert floor_violations(graph, "infra", _FAKE_RANK) == ["infra.lab: no floor in the rank table"]


def test_the_checks_report_import_strings_and_module_children(tmp_path):
    extra = {
        "infra/commands/sql.py": "import importlib\n\nimportlib.import_module('infra.errors')\n",
        "infra/errors.py": "x = __import__('os')\n",
        "infra/cli/main.py": "import sys\n\nARGV = [sys.executable, '-m', 'infra.cli']\n",
    }
    modules = _fake_tree(tmp_path, extra)
    assert sorted(import_strings(modules)) == [
        "infra.commands.sql:3 import_module(...)",
        "infra.errors:1 __import__(...)",
    ]
    assert module_flags(modules, "infra", "infra.runtime") == ["infra.cli.main:3"]


def test_the_check_reports_kafka_clients_built_outside_clients(tmp_path):
    extra = {
        "clients/__init__.py": "",
        "clients/kafka.py": "from kafka import KafkaConsumer\n\n\ndef make():\n    return KafkaConsumer()\n",
        "infra/commands/sql.py": "from kafka import KafkaConsumer\n\nc = KafkaConsumer('x')\n",
        "infra/errors.py": "import aiokafka\n\n\ndef p():\n    return aiokafka.AIOKafkaProducer()\n",
        "infra/status.py": "from kafka import admin\n\nA = admin.KafkaAdminClient(bootstrap_servers='x')\n",
        "infra/bench/__init__.py": "",
        "infra/bench/broker.py": "from aiokafka import admin\n\na = admin.AIOKafkaAdminClient()\n",
        "infra/probe.py": "from aiokafka.client import AIOKafkaClient\n\nc = AIOKafkaClient()\n",
        "infra/wire.py": "from kafka import client_async\n\nk = client_async.KafkaClient()\n",
    }
    _fake_tree(tmp_path, extra)
    modules = modules_under(tmp_path, ["clients", "infra"])
    assert "clients.kafka" in modules
    assert sorted(kafka_clients_built(modules, "clients")) == [
        "infra.bench.broker:3 AIOKafkaAdminClient(...)",
        "infra.commands.sql:3 KafkaConsumer(...)",
        "infra.errors:5 AIOKafkaProducer(...)",
        "infra.probe:3 AIOKafkaClient(...)",
        "infra.status:3 KafkaAdminClient(...)",
        "infra.wire:3 KafkaClient(...)",
    ]
    assert kafka_clients_built(_fake_tree(tmp_path / "clean", {}), "clients") == []


def test_the_check_reports_product_code_that_uses_the_tests(tmp_path):
    extra = {
        "infra/commands/sql.py": "from tests.support.servers import Fake\nimport tests.support.db as db\n",
        "infra/cli/main.py": "from infra.runtime import python_module_argv\n\n"
        "ARGV = python_module_argv('tests.support.servers', '--port', '0')\n",
        "infra/errors.py": "from .terminal import output\n\nNAME = 'tests.support.servers'\n",
    }
    modules = _fake_tree(tmp_path, extra)
    assert sorted(uses_of_tests(modules)) == [
        "infra.cli.main:3 tests.support.servers",
        "infra.commands.sql:1 tests.support.servers",
        "infra.commands.sql:2 tests.support.db",
    ]
    assert uses_of_tests(_fake_tree(tmp_path / "clean", {})) == []


def test_the_checks_report_re_export_shims(tmp_path):
    extra = {
        "infra/cli/__init__.py": "from infra.cli.main import main\n",  # a shim: nothing here uses `main`
        "infra/commands/__init__.py": "from infra.commands.sql import run\n\nRUNNERS = {'sql': run}\n",
        "infra/commands/sql.py": "from infra.errors import InfraError\n\n__all__ = ['InfraError', 'run']\n"
        "\n\ndef run():\n    raise InfraError('x')\n",
        "infra/cli/main.py": "def main():\n    from infra.commands.sql import InfraError, run\n",
        "infra/terminal/__init__.py": "from .output import say\n\n__all__ = ['say']\n",  # a public face
    }
    modules = _fake_tree(tmp_path, extra)
    faces = {"infra.terminal"}
    assert foreign_exports(modules, faces) == ["infra.commands.sql:3 InfraError"]
    assert package_reexports(modules, faces) == ["infra.cli:1 main"]
    assert imports_through_other_modules(modules, modules, faces) == [
        "infra.cli.main:2 infra.commands.sql.InfraError (defined in infra.errors)"
    ]
    without_faces = sorted(foreign_exports(modules, set()))
    assert without_faces == ["infra.commands.sql:3 InfraError", "infra.terminal:3 say"]
    assert "infra.terminal:1 say" in package_reexports(modules, set())
    lazy = {"infra/commands/__init__.py": "def __getattr__(name):\n    from infra.commands import sql\n"}
    assert package_reexports(_fake_tree(tmp_path / "lazy", lazy), faces) == ["infra.commands: __getattr__"]
