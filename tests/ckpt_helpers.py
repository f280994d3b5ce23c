"""Shared settings and launchers of the checkpoint, resume, HF and fault tests."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from dist_helpers import rank_results, torchrun_script

from torchtitan_lite.data.corpus import shakespeare_plays

REPO = Path(__file__).resolve().parents[1]
WORKER = str(REPO / "tests" / "ckpt_worker.py")
TINY_MODEL = ["--model.overrides.n_layers=1", "--model.overrides.dim=64", "--model.overrides.n_heads=2",
              "--model.overrides.n_kv_heads=1", "--model.overrides.head_dim=32", "--model.overrides.hidden_dim=128",
              "--model.overrides.max_seq_len=64"]
"""A 1-block Qwen3 (about 0.3M parameters besides the embedding)."""
TINY_RUN = ["--training.seq_len=32", "--training.local_batch_size=2", "--training.steps=4",
            "--lr_scheduler.warmup_steps=1", "--validation.enable=false", "--training.num_threads=1",
            "--metrics.enable_tensorboard=false", "--metrics.log_freq=1", "--training.global_batch_size=-1",
            "--checkpoint.enable=true"]
"""Four short steps of one micro-batch per rank, one thread per rank, checkpoints on (the debug config has
them off), no validation or TensorBoard."""


def text_file(folder: Path, n_plays: int = 2) -> Path:
    """A local ``.txt`` dataset of the first ``n_plays`` training plays (tokenizes in well under a second)."""
    path = folder / "data.txt"
    path.write_text("\n\n".join(text for _, text in shakespeare_plays("train")[:n_plays]), encoding="utf-8")
    return path


def env() -> dict[str, str]:
    """Environment of launched processes: one thread, the repo importable, this interpreter for run_train.sh."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable, "PYTHONPATH": str(REPO)}


def torchrun(nproc: int, args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node=nproc tests/ckpt_worker.py args`` from the repo root."""
    return torchrun_script(WORKER, nproc, args, timeout=timeout)


def result(proc: subprocess.CompletedProcess) -> dict:
    """The ``RESULT {...}`` line printed by rank 0 of the worker."""
    return rank_results(proc)[-1]


def tree_digest(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``folder`` (to show nothing was modified)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}
