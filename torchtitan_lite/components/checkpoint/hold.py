"""Taking the checkpoint folder for this run, before anything is read from it or written to it."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from torchtitan_lite.components.checkpoint.checkpointer import expected_bytes
from torchtitan_lite.components.checkpoint.lock import FolderLock
from torchtitan_lite.components.checkpoint.storage import (
    CheckpointError,
    check_leftovers,
    free_bytes,
    remove_leftovers,
)


def hold_checkpoint_folder(
    folder: str, model: nn.Module, rank: int
) -> tuple[FolderLock | None, list[str]]:
    """Rank 0 takes ``folder``'s lock, refuses a ``step-N`` that is not a complete checkpoint,
    removes the ``*.tmp`` leftovers of killed runs and warns when fewer than two checkpoints of
    ``model`` fit in the free space; the ranks agree (one broadcast).
    ``(the lock on rank 0, else None; lines to print)``.

    Raises:
        CheckpointError: on every rank, the folder is in use by another run, holds a bad ``step-N``
            or cannot be written.
    """
    lock, lines = None, []
    outcome: list = [None]
    if rank == 0:
        try:
            lock = FolderLock(folder)
            lock.acquire()
            check_leftovers(folder)
            lines = [
                f"removed {name} from {folder}: left by an interrupted save or deletion"
                for name in remove_leftovers(folder)
            ]
            need, free = expected_bytes(model), free_bytes(folder)
            if free < 2 * need:
                lines.append(
                    f"warning: {free:,} bytes free in {folder} but a checkpoint takes about "
                    f"{need:,} "
                    "(parameters and AdamW moments): fewer than two fit; free space or set "
                    "checkpoint.folder to a larger disk"
                )
        except (CheckpointError, OSError) as err:
            if lock is not None:
                lock.release()
                lock = None
            outcome[0] = (
                err
                if isinstance(err, CheckpointError)
                else CheckpointError(
                    f"checkpoint folder {folder}: {err}; make it a writable folder or set "
                    "checkpoint.folder"
                )
            )
    dist.broadcast_object_list(outcome, src=0)
    if outcome[0] is not None:
        raise outcome[0]
    return lock, lines
