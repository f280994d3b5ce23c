"""The share of a package's lines that are docstrings, counted with ``ast``.

A docstring is the first string-expression statement of a module, class or function body, or an
attribute docstring: a string-expression statement right after an assignment in a module or class
body. Lines are physical lines of the ``.py`` files, blank ones included.

Usage: ``python scripts/docstring_share.py torchtitan_lite models`` prints one line per folder.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _is_string(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def docstring_lines(source: str) -> int:
    """Lines of ``source`` (Python text) inside module, class, function and attribute docstrings."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if body and _is_string(body[0]):
            count += body[0].end_lineno - body[0].lineno + 1
        if isinstance(node, (ast.Module, ast.ClassDef)):
            for prev, stmt in zip(body, body[1:], strict=False):
                if isinstance(prev, (ast.Assign, ast.AnnAssign)) and _is_string(stmt):
                    count += stmt.end_lineno - stmt.lineno + 1
    return count


def share(folder: Path) -> tuple[int, int]:
    """(docstring lines, all lines) over the ``.py`` files under ``folder``."""
    docs = total = 0
    for path in sorted(folder.rglob("*.py")):
        source = path.read_text()
        docs += docstring_lines(source)
        total += len(source.splitlines())
    return docs, total


def main(folders: list[str]) -> int:
    for folder in folders:
        docs, total = share(Path(folder))
        print(f"{folder}: {docs:,} of {total:,} lines are docstrings ({docs / total:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["torchtitan_lite", "models"]))
