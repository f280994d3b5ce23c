"""The checks of ``[checkpoint]``'s folder and the checkpoint a run would resume, before any work
starts (``preflight/checks.py`` calls them; one :class:`ConfigError` line naming the folder or
file). They read only."""

from __future__ import annotations

from typing import Any

from torchtitan_lite.components.checkpoint.integrity import read_meta
from torchtitan_lite.components.checkpoint.lock import check_unlocked
from torchtitan_lite.components.checkpoint.meta import (
    check_compatible,
    check_data_parallel_degree,
    model_args_json,
)
from torchtitan_lite.components.checkpoint.storage import (
    CheckpointError,
    check_leftovers,
    checkpoint_folder,
    find_checkpoint,
)
from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.paths import check_writable
from torchtitan_lite.config.schema import JobConfig


def check_resume(config: JobConfig, args: Any, dp_degree: int | None = None) -> str | None:
    """The checkpoint folder can be written (with ``checkpoint.enable``), and the checkpoint this
    run would resume (``checkpoint.load_path``, ``load_step`` or the latest) is complete, intact
    (sizes and ``meta.json``; the data files' checksums are verified when it is loaded) and of the
    same model ``args``; with ``dp_degree`` (known once the world size is) and a streaming dataset
    whose loader state is to be loaded, saved by that data-parallel degree. Its path, or ``None``.

    Raises:
        ConfigError: the first problem.
    """
    cp = config.checkpoint
    folder = checkpoint_folder(config.job.dump_folder, cp.folder)
    if cp.enable:
        check_writable("checkpoint.folder", folder)
    try:
        path = (
            find_checkpoint(folder, cp.load_step, cp.load_path)
            if cp.enable or cp.load_path
            else None
        )
        if path is not None:
            meta = read_meta(path)
            check_compatible(
                meta, path, config.model.name, config.model.flavor, model_args_json(args)
            )
            if (
                dp_degree is not None
                and config.training.streaming
                and "dataloader" not in config.checkpoint.exclude_from_loading
            ):
                check_data_parallel_degree(meta, path, dp_degree)
    except CheckpointError as err:
        raise ConfigError(str(err)) from None
    return path


def check_checkpoint_folder(config: JobConfig) -> None:
    """For a run that will write its checkpoint folder (``checkpoint.enable``): no other run holds
    the folder's lock, and no ``step-N`` in it is anything but a complete checkpoint (a save of step
    N would fail on it after training).

    Raises:
        ConfigError: one line naming the folder and the holder or the entry.
    """
    if not config.checkpoint.enable:
        return
    folder = checkpoint_folder(config.job.dump_folder, config.checkpoint.folder)
    try:
        check_unlocked(folder)
        check_leftovers(folder)
    except CheckpointError as err:
        raise ConfigError(str(err)) from None
