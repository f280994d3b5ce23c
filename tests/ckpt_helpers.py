"""Shared settings and data of the runs the checkpoint, resume, HF, fault and tool tests train, and
the launcher of their worker (``tests/ckpt_worker.py``)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from dist_helpers import REPO, launch

from torchtitan_lite.data.corpus import shakespeare_plays

WORKER = REPO / "tests" / "ckpt_worker.py"
TINY_MODEL = [
    "--model.overrides.n_layers=1",
    "--model.overrides.dim=64",
    "--model.overrides.n_heads=2",
    "--model.overrides.n_kv_heads=1",
    "--model.overrides.head_dim=32",
    "--model.overrides.hidden_dim=128",
    "--model.overrides.max_seq_len=64",
]
"""A 1-block Qwen3 (about 0.3M parameters besides the embedding)."""
TINY_RUN = [
    "--training.seq_len=32",
    "--training.local_batch_size=2",
    "--training.steps=4",
    "--lr_scheduler.warmup_steps=1",
    "--validation.enable=false",
    "--training.num_threads=1",
    "--metrics.enable_tensorboard=false",
    "--metrics.log_freq=1",
    "--training.global_batch_size=-1",
    "--checkpoint.enable=true",
]
"""Four short steps of one micro-batch per rank, one thread per rank, checkpoints on (the debug
config has them off), no validation or TensorBoard."""


@functools.cache
def _plays_text(n_plays: int) -> str:
    """The first ``n_plays`` training plays, separated by a blank line (read once per session)."""
    return "\n\n".join(text for _, text in shakespeare_plays("train")[:n_plays])


def text_file(folder: Path, n_plays: int = 2) -> Path:
    """A local ``.txt`` dataset of the first ``n_plays`` training plays, ``folder / "data.txt"``
    (tokenizes in well under a second)."""
    path = folder / "data.txt"
    path.write_text(_plays_text(n_plays), encoding="utf-8")
    return path


def tiny_job(folder: Path, *extra: str, dump: str | Path = "out") -> list[str]:
    """The command line of a tiny run (:data:`TINY_MODEL`, :data:`TINY_RUN`) on
    ``folder / "data.txt"`` (:func:`text_file`) with its dump folder ``folder / dump``, then
    ``extra``."""
    return [
        *TINY_MODEL,
        *TINY_RUN,
        f"--training.dataset_path={folder / 'data.txt'}",
        f"--job.dump_folder={folder / dump}",
        *extra,
    ]


def worker_result(nproc: int | None, args: list[str], timeout: float = 240) -> dict:
    """Rank 0's result of ``tests/ckpt_worker.py args`` launched on ``nproc`` ranks (one plain
    process for ``None``)."""
    return launch(WORKER, args, nproc=nproc, timeout=timeout).result()


def tree_digest(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``folder`` (to show nothing was modified); a
    checkpoint folder's ``.lock`` counts by its presence only: it records the latest holder, and a
    run takes the lock before it reads the folder, so a run that refuses a damaged checkpoint has
    held it too."""
    return {
        str(p.relative_to(folder)): "held"
        if p.name == ".lock"
        else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
