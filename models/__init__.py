"""Model registry: a name maps to a :class:`~torchtitan_lite.protocols.model_spec.ModelSpec` of
plain callables.

The contract a family implements lives in the engine (``torchtitan_lite/protocols``); ``models/``
imports the engine, and the engine imports from here only the registry lookup below
(``get_model_spec``, ``model_names``, ``hf_family``; ``tests/test_import_boundary.py`` checks both
directions). Adding a family: a folder ``models/<family>/`` whose ``__init__.py`` defines
``model_spec``, and its name in ``_FAMILIES`` below (``docs/models.md``).
"""

from __future__ import annotations

import importlib

from torchtitan_lite.protocols.model_spec import ModelSpec

__all__ = ["get_model_spec", "hf_family", "model_names"]

_FAMILIES = ("qwen3", "qwen3_moe", "gpt_oss", "deepseek_v3", "llama3")


def get_model_spec(name: str) -> ModelSpec:
    """The :class:`ModelSpec` registered under ``name`` (``models.<name>.model_spec``).

    Raises:
        ValueError: ``name`` is not a known model family (the message lists the known ones).
    """
    if name not in _FAMILIES:
        raise ValueError(f"unknown model '{name}'; known models: {', '.join(_FAMILIES)}")
    return importlib.import_module(f"torchtitan_lite.models.{name}").model_spec


def hf_family(model_type: str | None, architectures: list[str] | None) -> str | None:
    """The family whose state-dict adapter reads a ``config.json`` of ``model_type`` (or, without
    one, whose architecture is the first of ``architectures``); ``None`` when none does."""
    for name in _FAMILIES:
        adapter = get_model_spec(name).state_dict_adapter
        if adapter is not None and (
            adapter.model_type == model_type
            if model_type
            else bool(architectures) and adapter.architecture == architectures[0]
        ):
            return name
    return None


def model_names() -> tuple[str, ...]:
    """Names of all registered model families."""
    return _FAMILIES
