"""The configuration reference ``docs/configuration.md`` is generated from the schema and kept up to
date."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from torchtitan_lite.config import schema
from torchtitan_lite.config.cli import bounded
from torchtitan_lite.config.reference import COMMAND, reference_markdown

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "configuration.md"


def test_docs_configuration_md_is_the_reference_generated_from_the_schema():
    assert PAGE.read_text() == reference_markdown(), (
        f"docs/configuration.md is out of date: run `{COMMAND}`"
    )


def test_the_module_prints_the_reference():
    out = subprocess.run(
        [sys.executable, "-m", "torchtitan_lite.config.reference"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert out == reference_markdown()


def test_every_key_of_the_schema_has_one_row_and_every_section_a_heading():
    page = reference_markdown()
    sections = typing.get_type_hints(schema.JobConfig)
    keys = [f"{name}.{f.name}" for name, cls in sections.items() for f in dataclasses.fields(cls)]
    rows = re.findall(r"^\| `([a-z_0-9]+\.[a-z_0-9]+)` \|", page, flags=re.MULTILINE)
    assert rows == keys
    headings = re.findall(r"^## `\[([a-z_0-9]+)\]`$", page, flags=re.MULTILINE)
    assert headings == list(sections)


@dataclass
class _Section:
    """``[s]``."""

    mode: Literal["a", "b"] | None = None
    """Pick ``a`` or ``b``;
    unset = neither."""
    steps: int = bounded(200, ge=1, le=10)
    """Steps."""


@dataclass
class _Root:
    s: _Section = dataclasses.field(default_factory=_Section)
    """The section."""


def test_a_row_shows_type_bounds_default_and_the_doc_as_markdown():
    page = reference_markdown(_Root)
    assert "## `[s]`\n\nThe section.\n" in page
    assert (
        r'| `s.mode` | `"a" \| "b" \| None` | `none` | Pick `a` or `b`; unset = neither. |' in page
    )
    assert "| `s.steps` | `int` (>= 1, <= 10) | `200` | Steps. |" in page
