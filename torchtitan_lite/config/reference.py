"""The configuration reference in Markdown, generated from the schema (``config/schema.py``): one
table per section, one row per key with its type, bounds, default and the documentation under the
field.

``python -m torchtitan_lite.config.reference > docs/configuration.md`` writes the page; a test fails
when the page and the schema disagree.
"""

from __future__ import annotations

import dataclasses
import re
import typing

from torchtitan_lite.config.cli import _toml_value, bounds_text, field_docs, type_name
from torchtitan_lite.config.schema import JobConfig

COMMAND = "python -m torchtitan_lite.config.reference > docs/configuration.md"
"""The command that writes ``docs/configuration.md``."""

_INTRO = f"""\
# Configuration reference

<!-- Generated from torchtitan_lite/config/schema.py by `{COMMAND}`; do not edit by hand. -->

Every key of a run's configuration, from the schema `torchtitan_lite/config/schema.py`. Set a key in
the TOML file (`CONFIG_FILE=my.toml ./run_train.sh`, sections as `[training]`, keys as `steps =
400`) or on the command line (`./run_train.sh --training.steps=400`), which wins over the file; a
key set nowhere takes the default below. On the command line `--section.key value` works too, a bare
`--flag` means true, `none` or `null` unsets an optional key and a list is comma-separated
(`--compile.components=model,loss`).

`./run_train.sh --help` prints the same, and under each key that a config file or the command line
sets, the value this run will use and where it comes from. `./run_train.sh --job.print_config`
prints the resolved configuration as TOML and exits. A key, type or bound that is wrong stops the
run before anything starts: one `config error: ...` line, exit 2.
"""


def _markdown(doc: str) -> str:
    """A field doc as one Markdown table cell: reST ``literals`` as code spans, lines joined, ``|``
    escaped."""
    return _cell(re.sub(r"``(.+?)``", r"`\1`", " ".join(doc.split())))


def _cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell (GitHub's tables split at an unescaped ``|``)."""
    return text.replace("|", r"\|")


def reference_markdown(root: type = JobConfig) -> str:
    """The reference page for the sectioned dataclass ``root``: an introduction, links to the
    sections, then per section its doc and a table ``key | type | default | description``."""
    sections = dataclasses.fields(root)
    section_docs = field_docs(root)
    lines = [_INTRO, "Sections: " + " · ".join(f"[`[{s.name}]`](#{s.name})" for s in sections), ""]
    for section in sections:
        cls = typing.get_type_hints(root)[section.name]
        hints, docs, defaults = typing.get_type_hints(cls), field_docs(cls), cls()
        lines += [
            f"## `[{section.name}]`",
            "",
            _markdown(section_docs[section.name]),
            "",
            "| key | type | default | description |",
            "|---|---|---|---|",
        ]
        for f in dataclasses.fields(cls):
            default = getattr(defaults, f.name)
            shown = "{}" if isinstance(default, dict) else _toml_value(default)
            limits = bounds_text(f.metadata)
            kind = f"`{_cell(type_name(hints[f.name]))}`" + (f" ({limits})" if limits else "")
            lines.append(
                f"| `{section.name}.{f.name}` | {kind} | `{_cell(shown)}` | "
                f"{_markdown(docs[f.name])} |"
            )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_markdown(), end="")
