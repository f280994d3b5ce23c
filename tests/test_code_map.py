"""docs/design.md describes this house: its code map ("Where the code is") names every package and
module under ``torchtitan_lite/`` and ``models/`` and nothing that is gone, and train.py's docstring
gives the same start-up order as design.md, the order the Trainer prints its phases in.

How the map is read (the rules design.md states above it): the map is the first fenced block after
the heading. A line indented less than :data:`COLUMN` is an entry: its head (the text before the
first run of two spaces) is one or more paths (``name/`` a folder, ``name.py`` a module), indented
two spaces per folder level; a line indented :data:`COLUMN` or more continues the description of the
entry above. A folder's description, parenthesized text removed, is a list of module names separated
by ``,`` or ``;``, each after an optional label ending in ``:``. A package is a folder holding an
``__init__.py``; a module is a ``.py`` file but a package's ``__init__.py`` (which may be named, as
models' registry is).
"""

from __future__ import annotations

import re
from pathlib import Path

from import_graph import FLOORS

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"
TRAIN = REPO / "torchtitan_lite" / "train.py"
ROOTS = ("torchtitan_lite", "models")
COLUMN = 20
"""Continuation lines are indented at least this far; entry lines less."""


def code_map(markdown: str) -> str:
    """The first fenced block after ``## Where the code is``."""
    section = markdown[markdown.index("## Where the code is") :]
    return section.split("```\n")[1]


def without_parentheses(text: str) -> str:
    """``text`` with every parenthesized span (nested ones too) removed."""
    while True:
        shorter = re.sub(r"\([^()]*\)", " ", text)
        if shorter == text:
            return text
        text = shorter


def listed_names(description: str) -> list[str]:
    """The module names of a folder's description (module docstring's rule); a word that is no
    identifier is returned as it stands, so that a stale or mistyped entry fails as a name that is
    not in the tree."""
    names = []
    for item in re.split(r"[,;]", without_parentheses(description)):
        words = item.rsplit(":", 1)[-1].split()
        if words:
            names.append(words[0])
    return names


def mapped(block: str) -> set[str]:
    """The paths the map names, relative to the repository: ``a/b/`` for a folder, ``a/b/c.py`` for
    a module (named by an entry line or in its folder's description)."""
    entries: list[tuple[int, list[str], str]] = []  # (depth, paths of the head, description)
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if not line.strip():
            continue
        if indent >= COLUMN:
            depth, head, description = entries[-1]
            entries[-1] = (depth, head, f"{description} {line.strip()}")
            continue
        head, _, description = line.strip().partition("  ")
        entries.append((indent // 2, head.replace(",", " ").split(), description.strip()))
    paths, parents = set(), {}
    for depth, head, description in entries:
        parent = parents.get(depth - 1, "") if depth else ""
        for path in head:
            paths.add(parent + path)
            if path.endswith("/"):
                parents[depth] = parent + path
                paths.update(f"{parent}{path}{name}.py" for name in listed_names(description))
    return paths


def in_tree() -> set[str]:
    """Every package (``a/b/``) and module (``a/b/c.py``, no ``__init__.py``) under
    :data:`ROOTS`."""
    found = set()
    for root in ROOTS:
        for path in (REPO / root).rglob("*.py"):
            relative = path.relative_to(REPO).as_posix()
            if path.name == "__init__.py":
                found.add(relative.removesuffix("__init__.py"))
            elif "__pycache__" not in relative:
                found.add(relative)
    return found


def mismatch(markdown: str) -> tuple[list[str], list[str]]:
    """``(missing, stale)``: what the tree has that the map does not name, and what the map names
    under :data:`ROOTS` that the tree does not have (a named ``__init__.py`` counts if it
    exists)."""
    names = {p for p in mapped(code_map(markdown)) if p.startswith(tuple(f"{r}/" for r in ROOTS))}
    tree = in_tree()
    stale = sorted(
        p for p in names - tree if not (p.endswith("/__init__.py") and (REPO / p).is_file())
    )
    return sorted(tree - names), stale


def test_the_code_map_names_every_package_and_module_and_nothing_gone():
    assert mismatch(DESIGN.read_text(encoding="utf-8")) == ([], [])


def test_the_map_reading_fails_on_a_missing_and_a_stale_entry():
    text = DESIGN.read_text(encoding="utf-8")
    assert ", mixing (sources by" in text and "\n  tools/" in text
    dropped = text.replace(", mixing (sources by", ", (sources by", 1)
    assert mismatch(dropped) == (["torchtitan_lite/data/mixing.py"], [])
    gone = text.replace("inspect_init, compare_runs", "inspect_init, compare_runs, plot_runs", 1)
    assert mismatch(gone) == ([], ["torchtitan_lite/tools/plot_runs.py"])
    no_folder = text.replace("\n  tools/ ", "\n  tool/  ", 1)
    missing, stale = mismatch(no_folder)
    assert "torchtitan_lite/tools/" in missing and "torchtitan_lite/tool/" in stale


def test_listed_names_drop_parentheses_and_labels():
    description = "the floor: schema (one (nested) dataclass, per key), cli; MoE: routers, experts"
    assert listed_names(description) == ["schema", "cli", "routers", "experts"]


def start_up_order(text: str, opening: str) -> list[str]:
    """The ``a -> b -> c.`` chain after ``opening`` in ``text`` (whitespace and comment marks
    folded)."""
    chain = re.split(r"\.(?:\s|$)", text[text.index(opening) + len(opening) :], maxsplit=1)[0]
    return [" ".join(step.split()) for step in chain.split("->")]


def test_train_py_and_design_md_give_one_start_up_order_the_order_of_the_printed_phases():
    design = start_up_order(DESIGN.read_text(encoding="utf-8"), "A run starts in this order:")
    train = start_up_order(TRAIN.read_text(encoding="utf-8"), "It starts in this order:")
    assert train == design and len(train) > 10
    printed = ["process group", "data", "model", "parallelize", "init"]  # tests/test_run_lines.py
    steps = [next(i for i, step in enumerate(train) if step.startswith(phase)) for phase in printed]
    assert steps == sorted(steps)


def stated_floors(markdown: str) -> tuple[tuple[str, ...], ...]:
    """The floors of "The packages stand on floors, bottom up: a | b, c | ...": ``|`` between
    floors, ``,`` between the packages of one floor."""
    line = markdown.split("bottom up: ", 1)[1].split(".", 1)[0]
    return tuple(tuple(name.strip() for name in part.split(",")) for part in line.split("|"))


def test_design_md_states_the_floors_that_the_import_test_checks():
    assert stated_floors(DESIGN.read_text(encoding="utf-8")) == FLOORS
    tops = {p.split("/")[1].removesuffix(".py") for p in in_tree() if p.startswith(ROOTS[0])}
    assert tops - {""} | {"models"} == {name for names in FLOORS for name in names}
