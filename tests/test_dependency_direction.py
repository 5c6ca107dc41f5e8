"""The dependency direction of docs/architecture.md, checked on the source: no package imports
one above it (function-level imports count too), nothing in the product imports `bench/` or
`tests/`, and no module imports itself back through others (no import cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each product package and the packages of ours it may import (docs/architecture.md).
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "sapiens": {"core"},
    "storage": {"core"},
    "schemas": {"core", "storage"},
    "tasks": {"core", "sapiens", "storage", "schemas"},
    "publish": {"core", "tasks", "schemas", "storage"},
    "flows": {"core", "publish", "tasks", "schemas", "storage"},
    "api": {"core", "flows", "publish", "tasks", "schemas", "storage"},
    "cli": {"core", "api", "flows", "publish", "tasks", "schemas", "storage"},
}
OURS = set(ALLOWED) | {"bench", "tests"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> set[str]:
    """Every module of ours that ``path`` imports, anywhere in it, as dotted names (for
    ``from package import name`` the submodule when ``name`` is one)."""
    this = module_name(path, root)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                is_module = (root / Path(*candidate.split("."))).with_suffix(".py").exists() or (
                    root / Path(*candidate.split(".")) / "__init__.py"
                ).exists()
                found.add(candidate if is_module else base)
    return {name for name in found if name.split(".")[0] in OURS}


def product_modules(root: Path) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for package in ALLOWED:
        for path in sorted((root / package).rglob("*.py")):
            graph[module_name(path, root)] = imports_of(path, root)
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, imported in sorted(graph.items()):
        package = module.split(".")[0]
        for name in sorted(imported):
            target = name.split(".")[0]
            if target != package and target not in ALLOWED[package]:
                wrong.append(f"{module} imports {name}")
    return wrong


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles among the modules of ``graph`` (each found once, by depth-first search)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for name in sorted(graph.get(module, ())):
            if name not in graph or name == module:
                continue
            if state.get(name) == 1:
                found.append([*path[path.index(name) :], name])
            elif name not in state:
                visit(name)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def test_no_package_imports_one_above_it() -> None:
    wrong = upward_imports(product_modules(ROOT))
    assert not wrong, "imports against docs/architecture.md:\n" + "\n".join(wrong)


def test_no_import_cycle() -> None:
    found = cycles(product_modules(ROOT))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_stabiliser_room_is_entered_from_tasks_by_the_chunk_worker_only() -> None:
    """`tasks/stabilise/` is a room inside `tasks/`: the rest of `tasks/` reaches it through
    the chunk worker (which runs a stabilised version's chunks), and it imports nothing that
    does (the cycle check)."""
    graph = product_modules(ROOT)

    def inside(name: str) -> bool:
        return name == "tasks.stabilise" or name.startswith("tasks.stabilise.")

    users = sorted(
        module
        for module, imported in graph.items()
        if module.startswith("tasks.") and not inside(module) and any(map(inside, imported))
    )
    assert users == ["tasks.chunk_worker"]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small tree laid out like the project, for the checks to be checked on."""
    for package in ALLOWED:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    return tmp_path


def test_the_checks_see_an_upward_import_even_inside_a_function(tree: Path) -> None:
    (tree / "storage" / "reader.py").write_text("def f():\n    from tasks import chunk\n")
    (tree / "tasks" / "chunk.py").write_text("from storage import reader\n")
    (tree / "flows" / "run.py").write_text("import api.app\nfrom bench import io\n")
    assert upward_imports(product_modules(tree)) == [
        "flows.run imports api.app",
        "flows.run imports bench",
        "storage.reader imports tasks.chunk",
    ]


def test_the_checks_see_a_cycle_through_relative_imports(tree: Path) -> None:
    catalog = tree / "schemas" / "catalog"
    catalog.mkdir()
    (catalog / "__init__.py").write_text("")
    (catalog / "writer.py").write_text("from .queries import jobs\n")
    (catalog / "queries.py").write_text("from . import engine\n")
    (catalog / "engine.py").write_text("def open():\n    from schemas.catalog.writer import W\n")
    assert cycles(product_modules(tree)) == [
        [
            "schemas.catalog.engine",
            "schemas.catalog.writer",
            "schemas.catalog.queries",
            "schemas.catalog.engine",
        ]
    ]
