"""The model arguments of a run, resolved once from the config.

``[model.overrides]`` (or ``--model.overrides.<field>=value``) replaces fields of the flavor's args
dataclass; :func:`build_model_args` applies them. With ``checkpoint.initial_load_hf`` the family and
the sizes come from the folder's ``config.json`` (``model.flavor`` then defaults to ``hf``; a flavor
or an override that disagrees with the folder is an error naming the field:
``torchtitan_lite/components/hf/args.py``).
"""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any

from torchtitan_lite.components.hf.args import HF_FLAVOR, folder_family, model_args_from_hf
from torchtitan_lite.components.hf.folder import HFError
from torchtitan_lite.config.cli import (
    COMMAND_LINE,
    BadValue,
    ConfigError,
    coerce,
    is_bool,
    suggestion,
)
from torchtitan_lite.config.load import Sources, precedence, where
from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.models import get_model_spec, model_names


def resolve_model(config: JobConfig, sources: Sources) -> Any:
    """Resolve ``[model]`` in place and return the run's model args (:func:`build_model_args`): the
    family and flavor of ``checkpoint.initial_load_hf`` (:func:`_model_from_hf_folder`), then
    :func:`type_overrides` and the args built once.

    Raises:
        ConfigError: one line naming the key.
    """
    _model_from_hf_folder(config, sources)
    fields = type_overrides(config, sources)
    model = config.model
    if model.tie_embeddings is not None and "tie_embeddings" in model.overrides:
        raise ConfigError(
            f"{where(sources, 'model.tie_embeddings')}: also set as "
            "model.overrides.tie_embeddings; set it once"
        )
    if model.tie_embeddings is not None and "tie_embeddings" not in fields:
        raise ConfigError(
            f"{where(sources, 'model.tie_embeddings')}: {model.name} has no tied-embedding option"
        )
    try:
        return build_model_args(config)
    except HFError as err:
        raise ConfigError(f"checkpoint.initial_load_hf: {err}") from None
    except (ValueError, TypeError) as err:
        keys = (
            ", ".join(f"model.overrides.{name}" for name in model.overrides)
            or "model.tie_embeddings"
        )
        raise ConfigError(
            f"{keys}: the {model.name} flavor {model.flavor!r} rejects the result: {err}"
        ) from None


def type_overrides(config: JobConfig, sources: Sources | None = None) -> set[str]:
    """Check ``model.name`` and ``model.flavor`` against the registry and give each
    ``model.overrides`` value the type of its field in the flavor's args dataclass (in place; the
    ``debug`` flavor's dataclass for ``hf``); the field names. ``sources``: where each key was set
    (a value from the command line is text), ``None`` for a resolved config.

    Raises:
        ConfigError: an unknown model, flavor or field, or a value of the wrong type.
    """
    sources = sources or {}
    model = config.model
    if model.name not in model_names():
        raise ConfigError(
            f"{where(sources, 'model.name')}: unknown model {model.name!r}; "
            f"known models: {', '.join(model_names())}"
        )
    flavors = get_model_spec(model.name).flavors
    if model.flavor not in flavors and model.flavor != HF_FLAVOR:
        raise ConfigError(
            f"{where(sources, 'model.flavor')}: {model.name} has no flavor {model.flavor!r}; "
            f"flavors: {', '.join(flavors)}, or hf (the sizes of checkpoint.initial_load_hf)"
        )
    args = flavors.get(model.flavor, flavors["debug"])
    hints = typing.get_type_hints(type(args))
    fields = {f.name for f in dataclasses.fields(args)}
    for name, value in model.overrides.items():
        key = f"model.overrides.{name}"
        if name not in fields:
            raise ConfigError(
                f"{where(sources, key)}: {type(args).__name__} has no field {name!r}"
                f"{suggestion(name, fields)}; fields: {', '.join(sorted(fields))}"
            )
        if sources.get(key) == COMMAND_LINE and value is True and not is_bool(hints[name]):
            raise ConfigError(f"{key} ({COMMAND_LINE}): needs a value, e.g. --{key}=VALUE")
        try:
            model.overrides[name] = coerce(
                value, hints[name], from_cli=sources.get(key) == COMMAND_LINE
            )
        except BadValue as err:
            raise ConfigError(f"{where(sources, key)}: {err}") from None
    return fields


def _model_from_hf_folder(config: JobConfig, sources: Sources) -> None:
    """With ``checkpoint.initial_load_hf``: ``model.name`` becomes the folder's family and
    ``model.flavor`` becomes ``hf`` (every size from the folder), unless they were given where
    ``initial_load_hf`` was or later (in the same file, or on the command line): then a different
    family is an error and the flavor must agree with the folder (so
    ``run_train.sh --checkpoint.initial_load_hf=DIR`` works with any config file)."""
    folder = config.checkpoint.initial_load_hf
    if folder is None:
        if config.model.flavor == HF_FLAVOR:
            raise ConfigError(
                f"{where(sources, 'model.flavor')}: 'hf' takes the sizes from "
                "checkpoint.initial_load_hf, which is not set; set it or pick a flavor"
            )
        return
    try:
        family, _ = folder_family(folder)
    except HFError as err:
        raise ConfigError(f"checkpoint.initial_load_hf: {err}") from None
    level = precedence(sources, "checkpoint.initial_load_hf")
    if precedence(sources, "model.name") >= level and config.model.name != family:
        raise ConfigError(
            f"{where(sources, 'model.name')}: {config.model.name!r} but checkpoint.initial_load_hf "
            f"{folder} holds a {family} model (config.json model_type); drop model.name or use "
            f"{family}"
        )
    config.model.name = family
    if precedence(sources, "model.flavor") < level:
        config.model.flavor = HF_FLAVOR


def build_model_args(config: JobConfig) -> Any:
    """The flavor's args dataclass with ``model.overrides`` and ``model.tie_embeddings`` (if set)
    applied; with ``checkpoint.initial_load_hf``, the folder's ``config.json`` values on top of the
    flavor, then the changes (``components/hf/args.py``).

    Raises:
        ValueError/TypeError: from the args dataclass's own checks (:func:`resolve_model` turns them
        into a
            :class:`ConfigError`).
        HFError: the folder's config cannot be read or disagrees with the flavor or an override.
    """
    model = config.model
    changes = dict(model.overrides)
    if model.tie_embeddings is not None:
        changes["tie_embeddings"] = model.tie_embeddings
    if config.checkpoint.initial_load_hf is not None:
        return model_args_from_hf(
            config.checkpoint.initial_load_hf, model.name, model.flavor, changes
        )
    return dataclasses.replace(get_model_spec(model.name).flavors[model.flavor], **changes)


def tokenizer_path(config: JobConfig) -> str | None:
    """The run's ``tokenizer.json``: the one in ``checkpoint.initial_load_hf`` when the folder has
    one, else ``model.tokenizer_path`` (``None``: the bundled tokenizer)."""
    folder = config.checkpoint.initial_load_hf
    if folder is not None and os.path.isfile(os.path.join(folder, "tokenizer.json")):
        return os.path.join(folder, "tokenizer.json")
    return config.model.tokenizer_path
