"""The package's layers (docs/architecture.md): no import circle among blobhouse's modules at
run time (imports inside functions count; ``TYPE_CHECKING`` ones do not), and the services
beneath the :class:`~blobhouse.Table` facade never import it, nor Spark or the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "blobhouse"

# what takes a TableSnapshot and must never reach up into the facade (or above it)
SERVICES = (
    "blobhouse.snapshot",
    "blobhouse.write",
    "blobhouse.commit.transaction",
    "blobhouse.store",
    "blobhouse.write.pipeline",
    "blobhouse.changes.column_rewrite",
    "blobhouse.changes.update",
    "blobhouse.changes.merge_insert",
    "blobhouse.changes.backfill",
    "blobhouse.changes.schema_changes",
    "blobhouse.maintenance",
    "blobhouse.reads",
)
ABOVE_SERVICES = (
    "blobhouse.table",
    "blobhouse.lerobot",
    "blobhouse.spark",
    "blobhouse.cli",
    "blobhouse.demo",
)


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def runtime_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The blobhouse modules ``path`` imports when it runs (``from a import b`` counts as
    ``a.b`` when that is a module)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and child.module and not child.level:
                for alias in child.names:
                    full = f"{child.module}.{alias.name}"
                    found.add(full if full in modules else child.module)
            elif isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: runtime_imports(path, modules) - {name} for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                found.append(sorted([v, *group]))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_no_import_circle_among_blobhouse_modules():
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_services_never_import_the_facade_spark_or_the_cli():
    graph = import_graph()
    upward = {
        (name, imported)
        for name, imports in graph.items()
        if name.startswith(SERVICES)
        for imported in imports
        if imported.startswith(ABOVE_SERVICES)
    }
    assert upward == set()
