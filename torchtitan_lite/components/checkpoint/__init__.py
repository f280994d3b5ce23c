"""Distributed checkpoints (DCP): :mod:`.checkpointer` saves and loads the training state (the layout of a step
folder is in its docstring), :mod:`.storage` keeps the checkpoint folder consistent on disk, :mod:`.integrity`
records and verifies the checksum of every file, :mod:`.lock` lets one run at a time use a checkpoint folder."""

from torchtitan_lite.components.checkpoint.checkpointer import (
    EXCLUDABLE,
    Checkpointer,
    LoadResult,
    TrainState,
    check_compatible,
    expected_bytes,
    model_args_json,
)
from torchtitan_lite.components.checkpoint.integrity import FORMAT_VERSION, read_meta, verify_files
from torchtitan_lite.components.checkpoint.lock import LOCK_FILE, FolderLock, check_unlocked
from torchtitan_lite.components.checkpoint.storage import (
    META_FILE,
    CheckpointError,
    check_leftovers,
    checkpoint_folder,
    complete_steps,
    find_checkpoint,
    free_bytes,
    remove_leftovers,
)

__all__ = ["EXCLUDABLE", "FORMAT_VERSION", "LOCK_FILE", "META_FILE", "CheckpointError", "Checkpointer", "FolderLock",
           "LoadResult", "TrainState", "check_compatible", "check_leftovers", "check_unlocked", "checkpoint_folder",
           "complete_steps", "expected_bytes", "find_checkpoint", "free_bytes", "model_args_json", "read_meta",
           "remove_leftovers", "verify_files"]
