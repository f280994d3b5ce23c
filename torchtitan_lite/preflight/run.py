"""One run, resolved once: what every later phase reads instead of resolving the config again.

Built by :func:`~torchtitan_lite.preflight.checks.parse_run` (and ``load_run``) from the command
line, or by :func:`~torchtitan_lite.preflight.resolved.read_resolved` from the launcher's file; the
Trainer, ``inference.py`` and ``tools/inspect_init.py`` take it. See docs/design.md, "Note: one
resolved run".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.models import get_model_spec
from torchtitan_lite.preflight.model_args import tokenizer_path
from torchtitan_lite.protocols import ModelSpec


@dataclass(frozen=True)
class ResolvedRun:
    """A checked run.

    Attributes:
        config: the checked config, ``[model]`` resolved (family and flavor of an HF folder, typed
            overrides); read it, never change it.
        spec: the family's :class:`ModelSpec` (``config.model.name``).
        model_args: the family's args dataclass, built once (``preflight/model_args.py``).
        tokenizer_path: the ``tokenizer.json`` the run reads; ``None``: the bundled tokenizer.
    """

    config: JobConfig
    spec: ModelSpec
    model_args: Any
    tokenizer_path: str | None


def resolved_run(config: JobConfig, model_args: Any) -> ResolvedRun:
    """The :class:`ResolvedRun` of a config resolved into ``model_args`` (no file is read but the
    tokenizer's folder listing)."""
    spec = get_model_spec(config.model.name)
    return ResolvedRun(config, spec, model_args, tokenizer_path(config))
