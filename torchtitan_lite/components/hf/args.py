"""Model args from an HF folder: ``--checkpoint.initial_load_hf=DIR`` alone picks the family and
every size.

The family comes from ``config.json``'s ``model_type`` (:func:`~.folder.family_of`), the args fields
it sets from the family's ``args_from_hf_config`` (every key honoured or refused, transformers'
defaults for keys left out). Fields no ``config.json`` holds (training knobs such as
``aux_loss_coeff``) come from ``model.flavor``, or from the family's ``debug`` flavor when the
flavor is :data:`HF_FLAVOR` (the debug flavors carry the published knobs). A flavor that was given,
and ``model.overrides``, must agree with the folder on every field it sets, except the adapter's
``free_fields`` (``max_seq_len``: the RoPE table length).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from torchtitan_lite.components.hf.folder import (
    HFError,
    family_of,
    folder_quantization,
    read_config,
)
from torchtitan_lite.models import get_model_spec

HF_FLAVOR = "hf"
"""``model.flavor`` of a model whose sizes all come from ``checkpoint.initial_load_hf`` (the default
then)."""


def folder_family(folder: str) -> tuple[str, dict[str, Any]]:
    """``(family, config.json dict)`` of an HF folder.

    Raises:
        HFError: see :func:`~.folder.read_config`, :func:`~.folder.family_of`,
            :func:`~.folder.folder_quantization`.
    """
    config = read_config(folder)
    family = family_of(config, folder)
    folder_quantization(config, folder)
    return family, config


def hf_args_values(folder: str, family: str, config: dict[str, Any]) -> dict[str, Any]:
    """Args field -> value that ``config.json`` of ``folder`` sets (the family's
    ``args_from_hf_config``).

    Raises:
        HFError: a key the model does not implement (the message names the file, the key and its
            value).
    """
    try:
        return get_model_spec(family).state_dict_adapter.args_from_hf_config(config)
    except ValueError as err:
        raise HFError(
            f"{os.path.join(folder, 'config.json')}: {str(err).removeprefix('config.json ')}"
        ) from None


def model_args_from_hf(folder: str, family: str, flavor: str, changes: dict[str, Any]) -> Any:
    """The model args of ``family`` for the HF folder: its ``config.json`` values on top of
    ``flavor``'s args (or the ``debug`` flavor's for :data:`HF_FLAVOR`), then ``changes``
    (``model.overrides``, ``model.tie_embeddings``).

    Raises:
        HFError: a given flavor or a change that disagrees with the folder on a field it sets (named
            with both values), or see :func:`folder_family` and :func:`hf_args_values`.
        ValueError, TypeError: from the args dataclass's own checks.
    """
    spec = get_model_spec(family)
    _, config = folder_family(folder)
    values = hf_args_values(folder, family, config)
    free = spec.state_dict_adapter.free_fields
    config_path = os.path.join(folder, "config.json")
    base = spec.flavors["debug" if flavor == HF_FLAVOR else flavor]
    for name, value in values.items():
        if flavor != HF_FLAVOR and name not in free and getattr(base, name) != value:
            raise HFError(
                f"{config_path} has {name} = {value!r} but model.flavor {flavor!r} has "
                f"{getattr(base, name)!r}; drop model.flavor to take every size from the folder"
            )
        if name in changes and name not in free and changes[name] != value:
            raise HFError(
                f"{config_path} has {name} = {value!r} but model.overrides.{name} = "
                f"{changes[name]!r}; drop the override (the folder's weights have its value)"
            )
    return dataclasses.replace(base, **{**values, **changes})


def state_dict_adapter(model_name: str, args: Any, hf_config: dict[str, Any] | None = None):
    """The family's HF state-dict adapter for ``args`` (``hf_config``: the ``config.json`` of a
    folder to import).

    Raises:
        HFError: the family has none.
    """
    build = get_model_spec(model_name).state_dict_adapter
    if build is None:
        raise HFError(
            f"model {model_name} has no Hugging Face state-dict adapter "
            "(ModelSpec.state_dict_adapter); HF import/export is not available for it"
        )
    return build(args, hf_config)
