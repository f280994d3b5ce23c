"""Distributed checkpoints (DCP): see :mod:`.checkpointer` for the layout of a step folder and the save/load cycle."""

from torchtitan_lite.components.checkpoint.checkpointer import (
    EXCLUDABLE,
    FORMAT_VERSION,
    META_FILE,
    Checkpointer,
    CheckpointError,
    LoadResult,
    TrainState,
    check_compatible,
    checkpoint_folder,
    complete_steps,
    find_checkpoint,
    model_args_json,
    read_meta,
)

__all__ = ["EXCLUDABLE", "FORMAT_VERSION", "META_FILE", "CheckpointError", "Checkpointer", "LoadResult", "TrainState",
           "check_compatible", "checkpoint_folder", "complete_steps", "find_checkpoint", "model_args_json", "read_meta"]
