"""One run per checkpoint folder: an advisory ``flock`` on ``<checkpoint folder>/.lock``, held by
rank 0 of a run for its whole life.

The kernel drops a ``flock`` when the last descriptor of the open file closes, which includes the
death of the process by any signal (SIGKILL too), so no stale lock survives a crash and the lock
file itself is never deleted (deleting it would let two runs lock two different files). The holder
writes its host, PID and start time into the file, so a second run can say who holds the folder.
``flock`` works on local file systems and on NFS (Linux emulates it with byte-range locks there).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time

from torchtitan_lite.components.checkpoint.storage import CheckpointError

LOCK_FILE = ".lock"
"""Name of the lock file in the checkpoint folder."""
# a probe of check_unlocked holds the lock for microseconds: retry this long before giving up
_RETRY_S = 1.0


def _holder(path: str) -> str:
    """``host H, PID P, since T`` from the lock file ``path`` (what its holder wrote), or
    ``unknown``."""
    try:
        with open(path, encoding="utf-8") as handle:
            info = json.load(handle)
        return f"host {info['host']}, PID {info['pid']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def _busy(folder: str, path: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint folder {folder} is in use by another run ({_holder(path)}); wait for it to "
        "end, or give this run another checkpoint.folder or job.dump_folder"
    )


class FolderLock:
    """The lock of the checkpoint ``folder``: :meth:`acquire` (creates the folder and lock file if
    needed), :meth:`release`; also released when the process ends."""

    def __init__(self, folder: str):
        self.folder = folder
        self.path = os.path.join(folder, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock and record this process in the lock file.

        Raises:
            CheckpointError: another process holds it (one line naming the folder and the holder's
                host and PID).
        """
        os.makedirs(self.folder, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + _RETRY_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise _busy(self.folder, self.path) from None
                time.sleep(0.05)
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (idempotent); the lock file stays."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        self.release()


def check_unlocked(folder: str) -> None:
    """Refuse a checkpoint ``folder`` whose lock another process holds (a probe for the check before
    launch: a shared lock taken and dropped at once; the lock file is only read, and not created).

    Raises:
        CheckpointError: as :meth:`FolderLock.acquire`.
    """
    path = os.path.join(folder, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _busy(folder, path) from None
    finally:
        os.close(fd)
