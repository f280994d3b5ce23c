"""The checks of ``checkpoint.export_hf`` and ``checkpoint.initial_load_hf`` before any work starts
(``preflight/checks.py`` calls them; one :class:`ConfigError` line naming the key). They read only
headers."""

from __future__ import annotations

from typing import Any

from torchtitan_lite.components.hf.folder import HFError
from torchtitan_lite.components.hf.load import check_hf_folder
from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.paths import check_writable
from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.models import get_model_spec


def check_export(config: JobConfig) -> None:
    """``checkpoint.export_hf`` (if set) can be created, and the family has a state-dict adapter to
    export with."""
    export = config.checkpoint.export_hf
    if export is None:
        return
    check_writable("checkpoint.export_hf", export)
    if get_model_spec(config.model.name).state_dict_adapter is None:
        raise ConfigError(
            f"checkpoint.export_hf: model {config.model.name} has no Hugging Face state-dict "
            "adapter (ModelSpec.state_dict_adapter); unset checkpoint.export_hf"
        )


def check_import(config: JobConfig, args: Any) -> None:
    """``checkpoint.initial_load_hf`` (if set) holds, with the right shapes, every tensor the model
    ``args`` needs (:func:`~torchtitan_lite.components.hf.load.check_hf_folder`)."""
    cp = config.checkpoint
    if cp.initial_load_hf is None:
        return
    try:
        check_hf_folder(
            cp.initial_load_hf,
            config.model.name,
            args,
            allow_unexpected=cp.initial_load_hf_allow_unexpected,
        )
    except HFError as err:
        raise ConfigError(f"checkpoint.initial_load_hf: {err}") from None
