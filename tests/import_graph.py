"""The engine's import graph as Python runs it: module-level imports of ``torchtitan_lite`` (and of
``models/`` as ``torchtitan_lite.models``), without those under ``if TYPE_CHECKING:`` and inside
functions. ``FLOORS`` orders the engine's packages bottom up (docs/design.md, "Where the code is").
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"torchtitan_lite": REPO / "torchtitan_lite", "torchtitan_lite.models": REPO / "models"}

FLOORS = (
    ("errors", "threads"),
    ("config",),
    ("protocols",),
    ("init",),
    ("distributed", "data"),
    ("models",),
    ("components",),
    ("lifecycle",),
    ("preflight",),
    ("builder",),
    ("inference",),
    ("train", "generate", "evaluate"),
    ("tools",),
    ("launch",),
)
"""Bottom up: a package imports only from floors below its own, never beside or above."""


def modules() -> dict[str, Path]:
    """Every module of the engine and of ``models/`` by its dotted name (a package by its own)."""
    found = {}
    for prefix, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if "__pycache__" in parts or (prefix == "torchtitan_lite" and parts[0] == "models"):
                continue  # torchtitan_lite/models is the symlink to models/, read once as models/
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([prefix, *parts])] = path
    return found


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and ast.unparse(test) in (
        "TYPE_CHECKING",
        "typing.TYPE_CHECKING",
    )


def imported_at_import(source: str) -> list[str]:
    """The dotted names a module imports when it is imported: ``import a.b`` gives ``a.b``, ``from
    a.b import c`` gives ``a.b`` and ``a.b.c``; function bodies and ``if TYPE_CHECKING:`` blocks
    are skipped (class bodies and other ``if``/``try`` blocks run at import and count)."""
    names: list[str] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                names.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.append(node.module)
                names.extend(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _type_checking(node):
                continue
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit([n for n in getattr(node, field, []) if isinstance(n, ast.AST)])

    visit(ast.parse(source).body)
    return names


def graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """``module -> modules it runs on import`` among ``sources`` (name -> text): an imported module
    and the packages above it, but not the packages that hold the importer (already running)."""
    edges: dict[str, set[str]] = {}
    for name, source in sources.items():
        targets = set()
        for imported in imported_at_import(source):
            parts = imported.split(".")
            for end in range(1, len(parts) + 1):
                target = ".".join(parts[:end])
                if target in sources and target != name and not name.startswith(target + "."):
                    targets.add(target)
        edges[name] = targets
    return edges


def engine_graph() -> dict[str, set[str]]:
    """:func:`graph` of the tree."""
    return graph({name: path.read_text(encoding="utf-8") for name, path in modules().items()})


def floor(module: str) -> str | None:
    """``torchtitan_lite.<package>[...]`` -> ``<package>`` (``models`` for all of ``models/``);
    ``None`` for the root package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def arrows_back_up(edges: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import whose target's floor is not below the importer's in
    :data:`FLOORS` (a package missing from ``FLOORS`` is reported as ``a -> ?``)."""
    level = {name: i for i, names in enumerate(FLOORS) for name in names}
    bad = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            a, b = floor(source), floor(target)
            if a is None or b is None or a == b:
                continue
            if a not in level or b not in level:
                bad.append(f"{source} -> {target if b in level else '?'}")
            elif level[b] >= level[a]:
                bad.append(f"{source} -> {target}")
    return bad


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected set of two or more modules, sorted (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return sorted(found)
