"""Loading the configuration into the :class:`JobConfig` dataclasses: the TOML file, then the
command line on top (keys and types checked, :func:`read_config`).

Every problem is a :class:`ConfigError` whose message is one line naming the key and where it was
set (``train.toml line 12``, ``command line`` or ``default``): :func:`where` writes that part.
"""

from __future__ import annotations

import os
from typing import Any

import tomli

from torchtitan_lite.config.cli import (
    COMMAND_LINE,
    ConfigError,
    field_type,
    flatten_toml,
    is_bool,
    set_value,
    split_cli,
    toml_line,
)
from torchtitan_lite.config.schema import JobConfig

Sources = dict[str, str]
"""Where each key given was set: ``dotted key -> "command line" | "<file> line N"``
(``job.config_file``: also ``"CONFIG_FILE"``, see :data:`CONFIG_FILE_FROM_ENV`)."""

CONFIG_FILE_FROM_ENV = "TORCHTITAN_LITE_CONFIG_FILE_FROM"
"""Environment variable through which ``run_train.sh`` names where the ``--job.config_file`` it
passes came from (``CONFIG_FILE``, or run_train.sh's default of it); it labels that key in messages
and ``--help`` unless the command line gives ``--job.config_file`` again."""


def read_config(argv: list[str]) -> tuple[JobConfig, Sources]:
    """The config the file (``--job.config_file``) and the command line ``argv`` set, and where each
    key given was set; keys and types checked only.

    Raises:
        ConfigError: a bad file, key or value.
    """
    pairs = split_cli(argv, lambda key: is_bool(field_type(JobConfig, key)))
    config, sources = JobConfig(), {}
    given = [value for key, value in pairs if key == "job.config_file"]
    file_from = (
        (os.environ.get(CONFIG_FILE_FROM_ENV) or COMMAND_LINE) if len(given) == 1 else COMMAND_LINE
    )
    for value in given:
        set_value(config, "job.config_file", value, COMMAND_LINE)
    if config.job.config_file is not None:
        for key, value, where_set in _read_toml(config.job.config_file, file_from):
            set_value(config, key, value, where_set)
            sources[key] = where_set
    for key, value in pairs:
        set_value(config, key, value, COMMAND_LINE)
        sources[key] = file_from if key == "job.config_file" else COMMAND_LINE
    return config, sources


def _read_toml(path: str, path_from: str) -> list[tuple[str, Any, str]]:
    """``(dotted_key, value, "file line N")`` for every value in the TOML file ``path`` (given by
    ``path_from``)."""
    if not os.path.isfile(path):
        raise ConfigError(
            f"job.config_file ({path_from}): no such file {path!r}; "
            "pass an existing TOML file, e.g. train_configs/qwen3_debug.toml"
        )
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8")
        data = tomli.loads(text)
    except (UnicodeDecodeError, tomli.TOMLDecodeError) as err:
        raise ConfigError(f"job.config_file: {path} is not valid TOML: {err}") from None
    if not data:
        raise ConfigError(
            f"job.config_file: empty config file {path}; remove CONFIG_FILE to train the defaults "
            "(train_configs/qwen3_debug.toml), or give the file some [section] keys"
        )
    entries = []
    for key, value in flatten_toml(data):
        line = toml_line(text, key)
        where_set = f"{path} line {line}" if line else path
        if key == "job.config_file":
            raise ConfigError(f"{key} ({where_set}): give the config file on the command line only")
        entries.append((key, value, where_set))
    return entries


def where(sources: Sources, key: str) -> str:
    """``key (location)`` for messages: ``training.steps (command line)``, ``... (default)``."""
    return f"{key} ({sources.get(key, 'default')})"


def precedence(sources: Sources, key: str) -> int:
    """Where ``key`` was set: 0 default, 1 the config file, 2 the command line."""
    return 0 if key not in sources else 2 if sources[key] == COMMAND_LINE else 1
