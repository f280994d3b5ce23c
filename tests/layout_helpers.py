"""Runs of ``./run_train.sh`` compared across data-parallel layouts (``training.deterministic``'s
acceptance and Muon's): one run, its loss and gradient-norm curves against another's, the final
checkpoint gathered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from dist_helpers import REPO, env, run_train
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from torchtitan_lite.tools.compare_runs import step_ranges

LAYOUTS = {  # name: (processes, options)
    "1": (1, []),
    "dp_shard2": (2, []),
    "dp_shard4": (4, []),
    "hsdp2x2": (4, ["--parallelism.data_parallel_replicate_degree=2"]),
}
"""1 process, FSDP2 over 2 and 4 ranks, HSDP 2 x 2."""


def train(tmp_path: Path, name: str, config: str, nproc: int, options: list[str]) -> Path:
    """``./run_train.sh`` of one run on ``tmp_path / "data.txt"`` (``ckpt_helpers.text_file``),
    which must end without a warning; its dump folder ``tmp_path / name``."""
    dump = tmp_path / name
    proc = run_train(
        [f"--training.dataset_path={tmp_path / 'data.txt'}", f"--job.dump_folder={dump}", *options],
        nproc=nproc,
        timeout=600,
        CONFIG_FILE=config,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Warning" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    return dump


def run_folder(dump: Path) -> str:
    """The (one) run folder in ``dump``."""
    return str(next(path.parent for path in dump.glob("*/run.json")))


def assert_equal_curves(
    reference: Path,
    other: Path,
    steps: int,
    tags: tuple[str, ...] = ("loss/train", "grad_norm"),
    at: tuple[int, ...] | None = None,
    first: int = 1,
) -> None:
    """``compare_runs --assert-equal`` of ``tags`` (default: the loss and the gradient norm): max
    |diff| 0 at each of steps ``first..steps`` (a resumed run has those only), or at exactly the
    steps ``at``."""
    common = list(at) if at is not None else list(range(first, steps + 1))
    steps_said = f"{len(common)} common steps ({step_ranges(common)})"
    for tag in tags:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "torchtitan_lite.tools.compare_runs",
                run_folder(reference),
                run_folder(other),
                "--tag",
                tag,
                "--assert-equal",
            ],
            cwd=REPO,
            env=env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{steps_said}: max |diff| 0 (atol 0)" in proc.stdout, proc.stdout


def final_state(dump: Path, step: int) -> dict[str, torch.Tensor]:
    """The model parameters and optimizer state of the checkpoint of ``step``, gathered
    (``dcp_to_torch_save``)."""
    path = dump / f"step-{step}.pt"
    dcp_to_torch_save(dump / "checkpoint" / f"step-{step}", path)
    state = torch.load(path, weights_only=False)
    return {
        f"{part}.{key}": value
        for part in ("model", "optimizer")
        for key, value in state[part].items()
        if isinstance(value, torch.Tensor)
    }
