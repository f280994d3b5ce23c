"""Launching ``./run_train.sh`` for fault injection: a run whose output is read as it comes (wait
for a line, with a timeout, instead of sleeping), its process tree, and the checksums that show a
resumed run's state is bitwise the uninterrupted one's."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import threading
import time
from pathlib import Path

from ckpt_helpers import TINY_MODEL, TINY_RUN
from dist_helpers import REPO, env

FAST = [*TINY_MODEL, *TINY_RUN, "--checkpoint.keep_latest_k=0"]
"""The tiny 4-step run of the checkpoint tests, all checkpoints kept."""
HANG_S = 300
"""``parallelism.comm_timeout_seconds``'s default: a rank left waiting in a collective ends only
then. A test that a failure stops every rank bounds the time below it (the order of events), not by
this machine's speed."""
ALONE_S = 60
"""How long a test waits for a worker left alone (its launcher killed; it would train or sleep for
hours) to exit: the watchdog polls every second, and a loaded machine needs seconds more to tear a
process down."""
CONSTANT_LR = ["--lr_scheduler.warmup_steps=0", "--lr_scheduler.decay_ratio=0"]
"""A schedule that does not depend on ``training.steps``: a run stopped at step K and resumed with
``--training.steps=K+1`` ends in the state of an uninterrupted ``--training.steps=K+1`` run."""


class Run:
    """``./run_train.sh args`` in its own session (its process group is the launcher's), stdout and
    stderr merged and read by a thread."""

    def __init__(
        self, args: list[str], *, nproc: int = 1, cwd: Path = REPO, extra_env: dict | None = None
    ):
        self.proc = subprocess.Popen(
            ["./run_train.sh", *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env=env(NGPU=str(nproc), **(extra_env or {})),
        )
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = 240) -> re.Match:
        """The first output line (from now on) matching ``pattern``; fails after ``timeout`` seconds
        or at the end."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no line matching {pattern!r} within {timeout} s:\n" + self.tail()
                ) from None
            if line is None:
                self._queue.put(None)
                raise AssertionError(
                    f"the run ended without a line matching {pattern!r}:\n" + self.tail()
                )
            self.lines.append(line)
            if match := re.search(pattern, line):
                return match

    def tail(self) -> str:
        """The last 30 lines read so far."""
        return "\n".join(self.lines[-30:])

    def finish(self, timeout: float = 240) -> tuple[int, list[str]]:
        """Wait for the end: ``(exit status, every output line)``."""
        code = self.proc.wait(timeout=timeout)
        while (line := self._queue.get(timeout=timeout)) is not None:
            self.lines.append(line)
        return code, self.lines

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the launcher only (``kill <pid of run_train.sh>``)."""
        os.kill(self.proc.pid, sig)


def run(args: list[str], nproc: int = 1, **kw) -> tuple[int, list[str]]:
    """``./run_train.sh args`` to the end."""
    return Run(args, nproc=nproc, **kw).finish()


def last_line(lines: list[str]) -> str:
    """The last output line; fails if any line shows a traceback (a one-line outcome has none)."""
    text = "\n".join(lines)
    assert "Traceback" not in text and "ChildFailedError" not in text, text[-3000:]
    return lines[-1]


def descendants(pid: int) -> set[int]:
    """PIDs of every process below ``pid`` (from ``/proc``: parents only, no names matched)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as handle:
                    ppid = int(handle.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def worker_pid(launcher_pid: int, local_rank: int) -> int:
    """The PID of the trainer worker of ``local_rank`` below the launcher (from its environment)."""
    for pid in descendants(launcher_pid):
        with open(f"/proc/{pid}/environ", "rb") as handle:
            if f"LOCAL_RANK={local_rank}".encode() in handle.read().split(b"\0"):
                return pid
    raise AssertionError(f"no worker of local rank {local_rank} below {launcher_pid}")


def alive(pids: set[int]) -> set[int]:
    """The PIDs of ``pids`` that still run (not gone, not zombies)."""
    running = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
                if handle.read().rpartition(")")[2].split()[0] != "Z":
                    running.add(pid)
        except OSError:
            pass
    return running


def shard_digests(step_folder: Path) -> dict[str, str]:
    """Checksum of each DCP data file of a checkpoint, from its ``meta.json`` (model, optimizer,
    scheduler, data position, RNG states and counters are all in these files: equal digests = a
    bitwise equal training state)."""
    files = json.loads((step_folder / "meta.json").read_text())["files"]
    return {name: info["xxh3_128"] for name, info in files.items() if name.endswith(".distcp")}
