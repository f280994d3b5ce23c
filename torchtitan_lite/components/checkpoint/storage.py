"""The checkpoint folder on disk: discovery, the cheap checks of a step folder, leftovers, atomic
publish and delete, free space.

Every change to the folder is a rename: a save is written to ``step-N.tmp`` and renamed to
``step-N`` when complete (:func:`publish`); a checkpoint is deleted by renaming it to
``step-N.deleting.tmp`` first (:func:`remove_step`). A process killed at any moment therefore leaves
complete ``step-N`` folders and ``*.tmp`` leftovers, never a half-deleted ``step-N``; the run that
next holds the folder's lock removes the leftovers before it trains (:func:`remove_leftovers`).
Anything else named ``step-N`` that is not a complete checkpoint (a file, a folder without
``meta.json``) is refused before training (:func:`check_leftovers`), so no save fails on it
afterwards.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from typing import Any

from torchtitan_lite.errors import UserError

META_FILE = "meta.json"
"""Per-checkpoint description, written last by rank 0."""
_STEP_RE = re.compile(r"^step-(\d+)$")
_LEFTOVER_RE = re.compile(r"^step-\d+(\.[a-z]+)?\.tmp$")


class CheckpointError(UserError, ValueError):
    """A checkpoint or checkpoint folder that cannot be used, or a save that failed: one line naming
    the file."""


def checkpoint_folder(dump_folder: str, folder: str) -> str:
    """Absolute path of the checkpoint folder: ``folder`` under ``dump_folder`` (an absolute
    ``folder`` wins)."""
    return os.path.abspath(os.path.join(dump_folder, folder))


def complete_steps(folder: str) -> list[int]:
    """Steps of the complete checkpoints in ``folder`` (``step-N`` folders with ``meta.json``),
    ascending."""
    if not os.path.isdir(folder):
        return []
    steps = []
    for name in os.listdir(folder):
        match = _STEP_RE.match(name)
        if match and os.path.isfile(os.path.join(folder, name, META_FILE)):
            steps.append(int(match.group(1)))
    return sorted(steps)


def others_hint(path: str) -> str:
    """``load another step with --checkpoint.load_step=K (complete: step-2, step-4) or delete this
    folder``: what to do about the bad checkpoint at ``path``, naming the other complete checkpoints
    of its folder."""
    folder, name = os.path.split(os.path.normpath(path))
    others = [f"step-{s}" for s in complete_steps(folder) if f"step-{s}" != name]
    if not others:
        return "delete this folder to start fresh (no other complete checkpoint in its folder)"
    return (
        f"load another step with --checkpoint.load_step={others[-1].removeprefix('step-')} "
        f"(complete: {', '.join(others)}) or delete this folder"
    )


def find_checkpoint(folder: str, load_step: int = -1, load_path: str | None = None) -> str | None:
    """The checkpoint to resume from, or ``None`` for a fresh start: ``load_path`` (a ``step-N``
    folder anywhere) if given, else in ``folder`` the latest complete one (``load_step = -1``) or
    ``step-<load_step>``.

    Raises:
        CheckpointError: ``load_path`` or the requested step does not exist (message lists what
            exists).
    """
    if load_path is not None:
        if not os.path.isdir(load_path):
            raise CheckpointError(
                f"checkpoint.load_path: no such folder {load_path!r}; point it at a step-N "
                "checkpoint folder"
            )
        return os.path.abspath(load_path)
    steps = complete_steps(folder)
    if load_step == -1:
        return os.path.join(folder, f"step-{steps[-1]}") if steps else None
    if load_step not in steps:
        raise CheckpointError(
            f"checkpoint.load_step: no complete checkpoint step-{load_step} in {folder} "
            f"(complete: {', '.join(f'step-{s}' for s in steps) or 'none'}); "
            "pick one of these or -1 for the latest"
        )
    return os.path.join(folder, f"step-{load_step}")


def check_leftovers(folder: str) -> None:
    """Refuse a ``step-N`` in ``folder`` that is not a complete checkpoint (a file, a link, a folder
    without ``meta.json``): a save of step N would fail on it after the steps were trained.
    ``*.tmp`` leftovers are not refused (:func:`remove_leftovers` removes them). Reads only.

    Raises:
        CheckpointError: naming the entry and what to do.
    """
    if not os.path.isdir(folder):
        return
    for name in sorted(os.listdir(folder)):
        if not _STEP_RE.match(name):
            continue
        path = os.path.join(folder, name)
        if os.path.islink(path) or not os.path.isdir(path):
            what = "a link" if os.path.islink(path) else "a file"
            raise CheckpointError(
                f"checkpoint folder {folder}: {name} is {what}, not a checkpoint folder; move it "
                "out of the checkpoint folder or delete it, then run again"
            )
        if not os.path.isfile(os.path.join(path, META_FILE)):
            raise CheckpointError(
                f"checkpoint folder {folder}: {name} has no {META_FILE}, so it is not a complete "
                "checkpoint of this trainer; move it out of the checkpoint folder or delete it, "
                "then run again"
            )


def remove_leftovers(folder: str) -> list[str]:
    """Delete the ``step-N.tmp`` / ``step-N.<word>.tmp`` files and folders in ``folder`` (saves and
    deletions that a killed run left); the names removed. Only for the holder of the folder's lock
    (no other run writes)."""
    if not os.path.isdir(folder):
        return []
    removed = []
    for name in sorted(os.listdir(folder)):
        if _LEFTOVER_RE.match(name):
            path = os.path.join(folder, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
            removed.append(name)
    return removed


def _fsync_folder(folder: str) -> None:
    """Make a rename in ``folder`` durable (POSIX: the directory entry is flushed with the
    directory)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: str, final: str) -> None:
    """Rename the complete save ``tmp`` to ``final``. An existing ``final`` (a newer step of an
    earlier run, saved again after resuming from an older one) is renamed aside first and deleted
    after, so ``final`` is always either the old or the new checkpoint, never a mix."""
    replaced = None
    if os.path.exists(final):
        replaced = final + ".replaced.tmp"
        os.rename(final, replaced)
    os.rename(tmp, final)
    _fsync_folder(os.path.dirname(final))
    if replaced is not None:
        shutil.rmtree(replaced)


def remove_step(folder: str, step: int) -> None:
    """Delete the checkpoint ``step-<step>``: renamed to ``step-<step>.deleting.tmp`` (atomic), then
    deleted."""
    path = os.path.join(folder, f"step-{step}")
    doomed = path + ".deleting.tmp"
    os.rename(path, doomed)
    shutil.rmtree(doomed)


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path``, flushed to disk before returning."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


def free_bytes(path: str) -> int:
    """Bytes free for this user on the file system that holds ``path`` (or its nearest existing
    ancestor)."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    return shutil.disk_usage(existing).free


def is_no_space(error: BaseException, free_now: int, needed: int) -> bool:
    """Whether a save that failed with ``error`` (a DCP ``CheckpointException`` holding per-rank
    failures, or any exception) failed for lack of space: ``ENOSPC``/``EDQUOT`` in it or in what it
    was raised from, or fewer than ``needed`` bytes left free now (``free_now``: torch's zip writer
    reports a short write as ``unexpected pos``, with no errno)."""
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:
        err = pending.pop()
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        failures = getattr(err, "failures", None)
        if isinstance(failures, dict):
            pending.extend(exc for exc, _ in failures.values() if isinstance(exc, BaseException))
        pending.extend(e for e in (err.__cause__, err.__context__) if e is not None)
    return free_now < needed
