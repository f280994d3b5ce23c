"""Multi-rank tests: launch a worker script under torchrun, read its RESULT lines, end a worker cleanly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]


def torchrun_script(script: str | Path, nproc: int, args: list[str] = (), *,
                    timeout: float = 240) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node=nproc script args`` from the repo root, one thread per rank.

    With torchrun's ``--tee 3``, which writes each rank's lines whole, prefixed ``[default<rank>]:``: the lines of
    several ranks never interleave (a ``RESULT`` line longer than a pipe's atomic write would, on a shared pipe).
    torchrun's log folder is a temporary one, removed after the run (without ``--log-dir`` torchrun leaves a
    ``torchelastic_*`` folder behind).
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory(prefix="torchrun_logs_") as logs:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "--log-dir", logs, "--tee", "3", str(script), *args]
        return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def launcher_copy(folder: Path) -> Path:
    """A copy of the launcher and the packages under ``folder / "repo"`` (``run_train.sh`` run there imports the
    copy first), for tests that change the trainer or a model before launching; returns its path."""
    work = folder / "repo"
    for name in ("torchtitan_lite", "models", "train_configs"):
        shutil.copytree(REPO / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "run_train.sh", work / "run_train.sh")
    return work


def rank_results(proc: subprocess.CompletedProcess) -> list[dict]:
    """The JSON of every ``RESULT {...}`` line of a finished launch, in output order; asserts it succeeded."""
    lines = [line for line in proc.stdout.splitlines() if "RESULT " in line]
    assert proc.returncode == 0 and lines, (f"worker failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                                           f"{proc.stderr[-3000:]}")
    decoder = json.JSONDecoder()  # raw_decode: each object, whatever other output shares its line
    return [decoder.raw_decode(part)[0] for line in lines for part in line.split("RESULT ")[1:]]


def leave_together() -> None:
    """Barrier, destroy the process group, flush, then ``os._exit(0)``.

    The barrier is the trainer's own fix (see "Note: on exiting together" in ``torchtitan_lite.distributed.process_group``).
    ``os._exit`` skips the interpreter's teardown, where torch 2.13 on gloo still aborted once in a CI run
    ("terminate called without an active exception", SIGABRT) after a worker had printed all its results:
    a crash of torch's thread cleanup at exit, which says nothing about what the test checks.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
