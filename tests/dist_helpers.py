"""Launched processes: their environment, ``./run_train.sh``, a test worker under torchrun (or as
one plain process) and the results its ranks return through files, and a worker's clean end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
RESULTS_ENV = "TORCHTITAN_LITE_TEST_RESULTS"
"""The environment variable naming the folder where a launched worker's ranks write their
results."""


def env(**extra: str) -> dict[str, str]:
    """Environment of launched processes: one thread, the repo importable, this interpreter for
    ``run_train.sh``, then ``extra``."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
        **extra,
    }


def run_train(
    args: list[str], *, nproc: int = 1, cwd: Path = REPO, timeout: float = 240, **extra_env: str
) -> subprocess.CompletedProcess:
    """``NGPU=nproc ./run_train.sh args`` in ``cwd`` to the end, its output captured; ``extra_env``
    is added to :func:`env`."""
    return subprocess.run(
        ["./run_train.sh", *args],
        cwd=cwd,
        env=env(NGPU=str(nproc), **extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_result(value: Any) -> None:
    """Return ``value`` (tensors, or dicts, lists and scalars of them) to the test that launched
    this worker: ``torch.save`` to ``rank<RANK>.pt`` in the folder of :data:`RESULTS_ENV`, through a
    temporary file renamed into place, so the test reads a whole file or none (a worker killed while
    writing leaves no result)."""
    if RESULTS_ENV not in os.environ:
        raise RuntimeError(
            f"{RESULTS_ENV} names no folder for the results: launch this worker with "
            "dist_helpers.launch, or set it to an existing folder"
        )
    folder = Path(os.environ[RESULTS_ENV])
    rank = int(os.environ.get("RANK", "0"))
    partial = folder / f".rank{rank}.pt.partial"
    torch.save(value, partial)
    os.replace(partial, folder / f"rank{rank}.pt")


@dataclass
class Launch:
    """A finished launch of a worker script: its process and what each rank wrote with
    :func:`write_result`."""

    script: str
    nproc: int | None
    proc: subprocess.CompletedProcess
    written: dict[int, Any]

    def result(self, rank: int = 0) -> Any:
        """What ``rank`` wrote (see :meth:`results`)."""
        return self.results([rank])[0]

    def results(self, ranks: Iterable[int] | None = None) -> list[Any]:
        """What each of ``ranks`` (default: every rank) wrote, in that order. Fails unless the
        launch exited 0 and each of them wrote a result, showing the last output lines of the ranks
        without one (of every rank when none is missing)."""
        ranks = list(range(self.nproc or 1) if ranks is None else ranks)
        missing = [rank for rank in ranks if rank not in self.written]
        if self.proc.returncode != 0 or missing:
            raise AssertionError(self._failure(missing))
        return [self.written[rank] for rank in ranks]

    def output(self, rank: int | None = None) -> list[str]:
        """The output lines (stdout, then stderr) of ``rank`` without torchrun's
        ``[default<rank>]:`` prefix, or torchrun's own for ``None``; of a plain process, all of
        them."""
        lines = (self.proc.stdout + self.proc.stderr).splitlines()
        if self.nproc is None:
            return lines
        if rank is None:
            return [line for line in lines if not line.startswith("[default")]
        prefix = f"[default{rank}]:"
        return [line.removeprefix(prefix) for line in lines if line.startswith(prefix)]

    def _failure(self, missing: list[int]) -> str:
        parts = [
            f"{self.script} exited with status {self.proc.returncode}"
            + (f"; no result from rank {', '.join(map(str, missing))}" if missing else "")
        ]
        if self.nproc is None:
            return "\n".join([*parts, *self.output()[-40:]])
        for rank in missing or range(self.nproc):
            parts += [f"--- rank {rank}, last lines:", *self.output(rank)[-40:]]
        return "\n".join([*parts, "--- torchrun, last lines:", *self.output(None)[-15:]])


def launch(
    script: str | Path, args: list[str] = (), *, nproc: int | None = None, timeout: float = 240
) -> Launch:
    """Run ``script args`` from the repo root with :func:`env` under
    ``torchrun --standalone --nproc_per_node=nproc`` (as one plain process for ``nproc=None``); its
    ranks' :func:`write_result` go to a fresh folder, read back when the launch has ended, then
    removed.

    torchrun runs with ``--tee 3``: each rank's lines come whole, prefixed ``[default<rank>]:``, so
    a failure shows
    the lines of the rank that failed (:meth:`Launch.output`); its log folder is a temporary one
    (without ``--log-dir`` torchrun leaves a ``torchelastic_*`` folder behind).
    """
    with (
        tempfile.TemporaryDirectory(prefix="test_results_") as results,
        tempfile.TemporaryDirectory(prefix="torchrun_logs_") as logs,
    ):
        torchrun = [
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "--log-dir",
            logs,
            "--tee",
            "3",
        ]
        cmd = [sys.executable, *(torchrun if nproc is not None else []), str(script), *args]
        proc = subprocess.run(
            cmd,
            cwd=REPO,
            env=env(**{RESULTS_ENV: results}),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        written = {
            int(path.stem.removeprefix("rank")): torch.load(path)
            for path in Path(results).glob("rank*.pt")
        }
    return Launch(Path(script).name, nproc, proc, written)


def launcher_copy(folder: Path) -> Path:
    """A copy of the launcher and the packages under ``folder / "repo"`` (``run_train.sh`` run
    there imports the copy's ``torchtitan_lite`` first), for tests that change the engine or a
    model before launching; returns its path. ``torchtitan_lite/models`` stays a symlink, to the
    copy's ``models/``."""
    work = folder / "repo"
    for name in ("torchtitan_lite", "models", "train_configs"):
        shutil.copytree(
            REPO / name, work / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy2(REPO / "run_train.sh", work / "run_train.sh")
    return work


def leave_together() -> None:
    """Barrier, destroy the process group, flush, then ``os._exit(0)``.

    The barrier is the trainer's own (``docs/design.md``, "Distributed: exiting together").
    ``os._exit`` skips the interpreter's teardown, where torch 2.13's thread cleanup on gloo can
    abort (SIGABRT, "terminate called without an active exception") after the results are written: a
    crash that says nothing about what the test checks.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
