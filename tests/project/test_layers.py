"""The package's layers (docs/architecture.md): every module belongs to one layer and imports
none above its own, no import circle among blobhouse's modules (imports inside functions and
``TYPE_CHECKING`` ones count), the services beneath the :class:`~blobhouse.Table` facade never
import it, nor Spark or the CLI, and one module names the files blobhouse writes."""

from __future__ import annotations

import ast
import re
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
    "blobhouse.read.table_reader",
)
# the layers, bottom up: a module imports modules of its own layer or of those below
LAYERS = (
    (
        "ground floor",
        (
            "blobhouse.errors",
            "blobhouse.extras",
            "blobhouse.cache",
            "blobhouse.progress",
            "blobhouse.gc_pause",
        ),
    ),
    ("I/O", ("blobhouse.io", "blobhouse.testing")),
    (
        "settings and values",
        (
            "blobhouse.settings",
            "blobhouse.options",
            "blobhouse.placement",
            "blobhouse.values",
            "blobhouse.columns",
            "blobhouse.dedup",
            "blobhouse.properties",
        ),
    ),
    (
        "where files live",
        ("blobhouse.layout", "blobhouse.ownership", "blobhouse.borrowing", "blobhouse.managed"),
    ),
    ("the file format", ("blobhouse.files",)),
    ("the store", ("blobhouse.store", "blobhouse.kept_references")),
    ("a table's state", ("blobhouse.snapshot",)),
    ("commits", ("blobhouse.commit",)),
    ("reads and writes", ("blobhouse.read", "blobhouse.write")),
    ("services", ("blobhouse.changes", "blobhouse.maintenance")),
    ("the facade", ("blobhouse.table",)),
    ("readers and importers", ("blobhouse.loader", "blobhouse.torch", "blobhouse.lerobot")),
    ("Spark", ("blobhouse.spark",)),
    ("the command line", ("blobhouse.cli",)),
    ("the package's names", ("blobhouse",)),
)
ABOVE_SERVICES = (
    "blobhouse.table",
    "blobhouse.lerobot",
    "blobhouse.spark",
    "blobhouse.cli",
    "blobhouse.cli.demo",
)


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def runtime_imports(path: Path, modules: dict[str, Path], typing: bool = True) -> set[str]:
    """The blobhouse modules ``path`` imports (``from a import b`` counts as ``a.b`` when that
    is a module); ``typing=False``: only those it imports when it runs."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if (
                not typing
                and isinstance(child, ast.If)
                and "TYPE_CHECKING" in ast.unparse(child.test)
            ):
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


def import_graph(typing: bool = True) -> dict[str, set[str]]:
    modules = module_names()
    return {name: runtime_imports(path, modules, typing) - {name} for name, path in modules.items()}


def layer_of(module: str) -> int:
    """The index of ``module``'s layer in :data:`LAYERS` (its longest listed prefix)."""
    found = [
        (len(prefix), i)
        for i, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert found, f"{module} is in no layer of tests/project/test_layers.py"
    return max(found)[1]


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


def test_no_import_circle_among_blobhouse_modules_type_only_imports_included():
    assert circles(import_graph()) == []


def test_no_module_imports_one_of_a_layer_above_its_own():
    upward = sorted(
        f"{name} ({LAYERS[layer_of(name)][0]}) imports {imported} ({LAYERS[layer_of(imported)][0]})"
        for name, imports in import_graph().items()
        for imported in imports
        if layer_of(imported) > layer_of(name)
    )
    assert upward == []


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


# what a file name blobhouse writes or recognizes looks like, in a string of the code
FILE_NAME_PART = re.compile(
    r"\.(?:lance|blob|pack|txn|bloom|run)(?:$|[/#])"
    r"|(?:^|/)(?:_leases|_blobs|_versions|_transactions|_refs|_filters|_runs|tombstones|claims|packs"
    r"|\.blobhouse-owner)(?:/|$)"
    r"|/(?:managed|registry|unreferenced|doomed)(?:/|$)|^(?:managed|registry|unreferenced|doomed)/"
    r"|-claims|^aborted-"
)
# strings that look like one and are not a name blobhouse gives: Lance's error text
NOT_NAMES = {("blobhouse/errors.py", ".lance")}


def name_strings(path: Path) -> list[tuple[int, str]]:
    """The strings of ``path``'s code (docstrings and text with spaces, which messages are,
    left out) that look like a file name blobhouse writes."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and " " not in node.value
        and FILE_NAME_PART.search(node.value)
    ]


def test_file_names_are_decided_in_layout_alone():
    """Data files, sidecars, packs, claims, leases, locks, owner markers, the registry and what
    a failed create leaves are named in blobhouse/layout.py; writers, gc and verify use it."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE.parent))
        if relative == "blobhouse/layout.py":
            continue
        found += [
            f"{relative}:{line}: {text!r}"
            for line, text in name_strings(path)
            if (relative, text) not in NOT_NAMES
        ]
    assert found == []


def test_the_name_finder_finds_names(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(
        'PACKS = "packs"\nx = f"{root}/_leases/{w}"\ny = "data file {x}.lance is gone"\n'
        'z = {"managed": 1, "blob": "lance.blob.v2"}\nw = f"{name}.lance"\n'
    )
    assert [text for _, text in name_strings(path)] == ["packs", "/_leases/", ".lance"]
