"""Benchmark (not a test): the loss gap of float8 training against fp32 compute, step by step, on
this machine.

Trains the same config (same init, same batches) with fp32 matmuls and with each float8 recipe
(``[float8]``, torchao), one ``./run_train.sh`` each, reads every step's loss from the log lines (4
decimals) and prints, per recipe, the largest ``|loss_float8 - loss_fp32|`` over the steps, the step
where it occurs and the last step's gap. On CPU this measures numerics only (``torch._scaled_mm`` on
CPU is a slow reference kernel: the debug configs' 16 x 256 tokens per step take minutes per float8
step there, so shrink the batch on CPU).

    python benchmarks/bench_float8_numerics.py                          # qwen3_debug.toml, 30 steps
    python benchmarks/bench_float8_numerics.py --config train_configs/llama3_debug.toml
    python benchmarks/bench_float8_numerics.py -- --training.local_batch_size=2
    --training.global_batch_size=2 \
        --training.seq_len=32                                                   # a CPU-sized batch

Arguments after ``--`` are config overrides, as for ``run_train.sh``.
"""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine_load import reported_load

REPO = Path(__file__).resolve().parents[1]
RECIPES = {
    "fp32": [],
    "tensorwise": ["--float8.enable=true"],
    "rowwise": ["--float8.enable=true", "--float8.recipe_name=rowwise"],
    "rowwise_with_gw_hp": ["--float8.enable=true", "--float8.recipe_name=rowwise_with_gw_hp"],
}
STEP_LINE = re.compile(r"step\s+(\d+)\s+loss\s+(\S+)")


def losses(
    config: str, steps: int, extra: list[str], overrides: list[str]
) -> tuple[list[float], float]:
    """Every step's loss of one run and its seconds."""
    with tempfile.TemporaryDirectory() as dump:
        args = [
            f"--training.steps={steps}",
            "--lr_scheduler.warmup_steps=2",
            "--lr_scheduler.decay_ratio=0",
            "--validation.enable=false",
            "--checkpoint.enable=false",
            "--metrics.enable_tensorboard=false",
            f"--job.dump_folder={dump}",
            "--training.compute_dtype=float32",
            *overrides,
            *extra,
        ]
        start = time.perf_counter()
        proc = subprocess.run(
            ["./run_train.sh", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            env={**os.environ, "CONFIG_FILE": config, "PYTHON": sys.executable},
        )
        seconds = time.perf_counter() - start
    if proc.returncode:
        sys.exit(
            "bench_float8_numerics: run failed "
            f"({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    found = {int(s): float(v) for s, v in STEP_LINE.findall(proc.stdout)}
    return [found[s] for s in range(1, steps + 1)], seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="train_configs/qwen3_debug.toml")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--recipes", nargs="+", default=["tensorwise", "rowwise"], choices=list(RECIPES)[1:]
    )
    parser.add_argument("overrides", nargs="*", help="config overrides after --")
    cli = parser.parse_args()
    with reported_load():
        run(cli)


def run(cli: argparse.Namespace) -> None:
    """The fp32 reference, then each recipe against it."""
    ref, seconds = losses(cli.config, cli.steps, [], cli.overrides)
    print(
        f"{cli.config}, {cli.steps} steps: fp32 loss {ref[0]:.4f} -> {ref[-1]:.4f} ({seconds:.0f} "
        "s)"
    )
    for recipe in cli.recipes:
        got, seconds = losses(cli.config, cli.steps, RECIPES[recipe], cli.overrides)
        gaps = [abs(a - b) for a, b in zip(got, ref, strict=False)]
        worst = max(range(cli.steps), key=gaps.__getitem__)
        print(
            f"  {recipe:<19} max |gap| {gaps[worst]:.4f} at step {worst + 1}, last step "
            f"{gaps[-1]:.4f} (loss {got[-1]:.4f}; {seconds:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
