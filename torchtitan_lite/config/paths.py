"""Probes of the paths a run reads and writes, before any work starts; they create nothing."""

from __future__ import annotations

import os

from torchtitan_lite.config.cli import ConfigError

DEFAULT_CONFIG = "train_configs/qwen3_debug.toml"
"""run_train.sh's config when ``CONFIG_FILE`` is unset (the launcher and tools.simulate)."""


def check_exists(key: str, path: str | None) -> None:
    """``path`` (the value of ``key``; ``None``: unset) is an existing file or folder.

    Raises:
        ConfigError: ``<key>: no such file or folder '<path>'``.
    """
    if path is not None and not os.path.exists(path):
        raise ConfigError(f"{key}: no such file or folder {path!r}")


def check_writable(key: str, path: str) -> None:
    """``path`` (the value of ``key``) is a folder or can be created as one under a writable folder.

    Raises:
        ConfigError: ``path`` is a file, or its nearest existing parent is not a writable folder.
    """
    target = os.path.abspath(path)
    if os.path.exists(target) and not os.path.isdir(target):
        raise ConfigError(f"{key}: {path!r} is a file, not a folder")
    parent = target
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not (os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK)):
        raise ConfigError(f"{key}: cannot create {path!r}: {parent} is not a writable folder")
