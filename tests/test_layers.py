"""Each layer keeps its room: the import graph of eventlog < projections < sync < ops.

Every module of the four packages is parsed with ``ast`` (nothing is imported: the test
takes a fraction of a second) and every import statement in it counts: at module level,
inside functions, and under ``if TYPE_CHECKING:``. Imports inside functions count
because they run all the same, only later; imports for the type checker count because
an annotation that names a higher layer's type is a dependency on that layer, and a
cycle of annotations is still a cycle a reader has to untangle. The rules:

- no module imports a module of a higher layer (``eventlog`` < ``projections`` <
  ``sync`` < ``ops``);
- nothing above ``projections`` imports DuckDB, FAISS or tantivy: SQL, export and the
  state lock are the engine's and the store's calls (``Engine.sql``, ``Engine.export``,
  ``projections.projection.holding_state``);
- no two modules import each other, directly or through others (a strongly connected
  component of more than one module).

An exception is allowed below by name, with the reason it stays; an entry that is no
longer needed fails the test too, so that the lists only shrink.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("eventlog", "projections", "sync", "ops")  # bottom to top
ENGINES = frozenset({"duckdb", "faiss", "tantivy"})  # the projections' own

# -- what is allowed, and why (an entry no longer needed fails the test) ---------------------

# (importer, imported) -> the owner who removes it
UPWARD_ALLOWED: dict[tuple[str, str], str] = {}

# (importer, engine) -> the owner who removes it, or why it stays
ENGINES_ALLOWED: dict[tuple[str, str], str] = {
    # permanent: the engine benchmark's peer is FAISS itself, which it is compared with
    # (STYLE: benchmarks compare against a peer in the same run)
    ("ops.bench.engine", "faiss"): "a benchmark's peer",
    ("ops.bench.scale", "faiss"): "a benchmark's peer",
    ("ops.bench.graph_build", "faiss"): "a benchmark's peer",
    # the parts' floor: each component alone, with no Pulse code around it
    ("ops.bench.parts", "duckdb"): "a benchmark's peer",
    ("ops.bench.parts", "faiss"): "a benchmark's peer",
    ("ops.bench.parts", "tantivy"): "a benchmark's peer",
}

# modules that import each other -> the owner who removes the cycle
CYCLES_ALLOWED: dict[frozenset[str], str] = {}


# -- the graph -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str  # a module of the packages, or the top-level name of another
    line: int


def modules(root: Path, packages: tuple[str, ...] = LAYERS) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, by dotted name."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(root: Path, packages: tuple[str, ...] = LAYERS) -> list[Import]:
    """Every import statement of every module: of another module of the packages
    (``from a import b`` is of ``a.b`` when that is a module, else of ``a``), or of an
    outside package by its top-level name."""
    known = modules(root, packages)
    found: list[Import] = []
    for name, path in known.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package, known):
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    found.append(Import(name, target, node.lineno))  # type: ignore[attr-defined]
    return found


def _targets(node: ast.AST, package: list[str], known: Mapping[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:  # relative: from the module's package, up level - 1
            base = package[: len(package) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        for alias in node.names:
            submodule = f"{module}.{alias.name}"
            yield submodule if submodule in known else module


def layer(module: str) -> int | None:
    top = module.split(".")[0]
    return LAYERS.index(top) if top in LAYERS else None


def cycles(edges: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def graph(found: list[Import]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for i in found:
        if layer(i.imported) is not None:
            edges.setdefault(i.importer, set()).add(i.imported)
    return edges


def _stale(allowed: Mapping[object, str], seen: set[object]) -> list[str]:
    return [f"{key!r} ({owner}): no longer needed, remove it" for key, owner in allowed.items()
            if key not in seen]  # fmt: skip


# -- the rules -------------------------------------------------------------------------------

ALL = imports(ROOT)


def test_no_module_imports_a_higher_layer() -> None:
    upward = {
        (i.importer, i.imported): i.line
        for i in ALL
        if (to := layer(i.imported)) is not None and to > (layer(i.importer) or 0)
    }
    wrong = [
        f"{importer} (line {line}) imports {imported}, a higher layer"
        for (importer, imported), line in sorted(upward.items())
        if (importer, imported) not in UPWARD_ALLOWED
    ]
    assert wrong + _stale(UPWARD_ALLOWED, set(upward)) == []


def test_nothing_above_projections_imports_duckdb_faiss_or_tantivy() -> None:
    above = LAYERS.index("projections")
    used = {
        (i.importer, i.imported): i.line
        for i in ALL
        if i.imported in ENGINES and (layer(i.importer) or 0) > above
    }
    wrong = [
        f"{importer} (line {line}) imports {engine}: ask projections/ instead"
        for (importer, engine), line in sorted(used.items())
        if (importer, engine) not in ENGINES_ALLOWED
    ]
    assert wrong + _stale(ENGINES_ALLOWED, set(used)) == []


def test_no_import_cycle() -> None:
    edges = graph(ALL)
    found = cycles(edges)
    wrong = [
        "import cycle: " + ", ".join(
            f"{a} -> {b}" for a in sorted(component) for b in sorted(edges[a] & component)
        )
        for component in found
        if component not in CYCLES_ALLOWED
    ]  # fmt: skip
    assert wrong + _stale(CYCLES_ALLOWED, set(found)) == []


# -- ops/ goes through the facade ----------------------------------------------------------

# The parts an instance is wired from (``PulseDB.__init__``): ops/ uses the facade's
# operations, ``health()``, ``status()`` and ``last_seq()``, never these. (Names that are
# also common elsewhere, such as ``log`` or ``server``, are left out: the walker sees
# names, not types.)
WIRING = frozenset({"engine", "replication", "writer", "sealer", "follower", "owed", "gate"})
# (file, attribute) -> why ops/ may read another object's private member: a library's
PRIVATE_ALLOWED: dict[tuple[str, str], str] = {
    ("ops/cli/reference.py", name): "argparse has no public API for its parsed tree"
    for name in ("_actions", "_get_formatter", "_format_action_invocation", "_HelpAction",
                 "_SubParsersAction", "_expand_help")
} | {("ops/serving.py", "_server_instances"): "the MCP SDK's sessions, to cap them",
     ("ops/serving.py", "_start_asgi_task"): "uvicorn's httptools protocol, whose request "
     "task the edge's override starts for every request that Front does not take",
     ("ops/bench/scale.py", "_debugmallocstats"): "CPython's only report of its arenas",
     ("ops/bench/scale.py", "engine"): "the memory breakdown by structure: a diagnosis "
     "of the engine's insides, which no facade should offer",
     ("ops/bench/parts.py", "writer"): "tantivy's own index writer (the parts' floor), "
     "not an instance's"}  # fmt: skip


def reached_into(root: Path) -> dict[tuple[str, str], int]:
    """(file, attribute) -> line, for every attribute read in ops/ on something other than
    ``self``/``cls`` that is a private member or one of the instance's wired parts."""
    found: dict[tuple[str, str], int] = {}
    for path in sorted((root / "ops").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Attribute):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            private = node.attr.startswith("_") and not node.attr.startswith("__")
            if private or node.attr in WIRING:
                found.setdefault((path.relative_to(root).as_posix(), node.attr), node.lineno)
    return found


def test_ops_never_reaches_inside_an_instance() -> None:
    found = reached_into(ROOT)
    wrong = [
        f"{file} (line {line}) reads .{attr}: use the PulseDB facade"
        for (file, attr), line in sorted(found.items())
        if (file, attr) not in PRIVATE_ALLOWED
    ]
    assert wrong + _stale(PRIVATE_ALLOWED, set(found)) == []


def test_the_facade_rule_sees_a_reach_inside(tmp_path: Path) -> None:
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "x.py").write_text(
        "def f(db, self):\n    db.engine.directory\n    db._failure\n    self._own\n"
    )
    assert reached_into(tmp_path) == {("ops/x.py", "engine"): 2, ("ops/x.py", "_failure"): 3}


# -- the walker sees every kind of import ---------------------------------------------------


def test_the_walker_finds_imports_in_functions_under_type_checking_and_relative(
    tmp_path: Path,
) -> None:
    files = {
        "eventlog/__init__.py": "",
        "eventlog/low.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from sync.top import Thing\n"
            "def later():\n    import projections.mid\n"
        ),
        "projections/__init__.py": "",
        "projections/mid.py": "from . import other\nimport duckdb\n",
        "projections/other.py": "from .mid import x\n",
        "sync/__init__.py": "",
        "sync/top.py": "from eventlog import low\nimport tantivy\n",
        "ops/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = {(i.importer, i.imported) for i in imports(tmp_path)}
    assert {
        ("eventlog.low", "sync.top"),  # under TYPE_CHECKING
        ("eventlog.low", "projections.mid"),  # inside a function
        ("projections.mid", "projections.other"),  # relative, of a module
        ("projections.other", "projections.mid"),  # relative, of a name
        ("sync.top", "eventlog.low"),
        ("projections.mid", "duckdb"),
        ("sync.top", "tantivy"),
    } <= found
    assert sorted(map(sorted, cycles(graph(imports(tmp_path))))) == [
        ["eventlog.low", "sync.top"],
        ["projections.mid", "projections.other"],
    ]


@pytest.mark.parametrize(
    ("importer", "imported"),
    [  # a few edges known to exist today: the walker reads the real tree
        ("sync.access", "eventlog.access"),
        ("projections.queries", "eventlog.access"),
        ("projections.rebuild", "projections.engine"),
        ("projections.queries", "projections.past"),  # inside functions
        ("projections.queries", "projections.projection"),  # under TYPE_CHECKING
    ],
)
def test_the_walker_reads_the_tree(importer: str, imported: str) -> None:
    assert any(i.importer == importer and i.imported == imported for i in ALL)
