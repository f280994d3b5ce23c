"""Benchmark (not a test): data-parallel scaling on CPU, NGPU=1 vs NGPU=2 through
``./run_train.sh``.

Three runs of the same config (default ``train_configs/qwen3_debug.toml``), same global batch of 16
sequences of ``--seq-len`` (256) tokens (2 micro-batches of 8 on one rank, 1 on each of two), with
validation, TensorBoard and checkpoints off:

  * 1 rank x 1 thread   the baseline of the scaling efficiency;
  * 1 rank x 2 threads  the same cores as the 2-rank run;
  * 2 ranks x 1 thread  FSDP2 over gloo.

Each run's tokens/s is the median over the logged steps after ``--warmup`` (the trainer's ``tps``
field is per device; total = tps x ranks), and s/step = global tokens per step / total tokens/s.
Printed:

  * scaling efficiency = total tokens/s (2 ranks x 1 thread) / (2 x total tokens/s (1 rank x 1
    thread)): 1.0 = each added rank brings its full single-thread throughput;
  * same-cores ratio = total tokens/s (2 ranks x 1 thread) / total tokens/s (1 rank x 2 threads):
    whether two ranks use two cores better or worse than one rank's two threads.

Run it on a quiet machine (``uptime`` load < 1.5): two cores shared with anything else skew every
number.

    python benchmarks/bench_scaling.py                   # 30 steps each, about 3 minutes on 2 cores
    python benchmarks/bench_scaling.py --steps 20 -- --model.flavor=debug_untied

Arguments after ``--`` are config overrides passed to every run.
"""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine_load import reported_load

REPO = Path(__file__).resolve().parents[1]
STEP_LINE = re.compile(r"step\s+(\d+)\s+loss\s+\S+.*?\btps ([\d,]+)")
RUNS = ((1, 1), (1, 2), (2, 1))  # (ranks, threads per rank)


def parse_tps(output: str, warmup: int) -> list[float]:
    """Per-device tokens/s of each logged step after the first ``warmup`` steps, from the trainer's
    log lines.

    Raises:
        ValueError: no step line after ``warmup`` (the run failed or was shorter than the warmup).
    """
    tps = [
        float(m.group(2).replace(",", ""))
        for m in STEP_LINE.finditer(output)
        if int(m.group(1)) > warmup
    ]
    if not tps:
        raise ValueError(
            f"no step log line after step {warmup} in the run's output:\n{output[-2000:]}"
        )
    return tps


def run(
    ranks: int, threads: int, steps: int, seq_len: int, overrides: list[str]
) -> tuple[str, list[str]]:
    """Run ``./run_train.sh`` on ``ranks`` processes of ``threads`` threads; returns (output,
    command).

    Raises:
        RuntimeError: the run failed (its output is in the message).
    """
    args = [
        f"--training.steps={steps}",
        f"--training.num_threads={threads}",
        "--training.global_batch_size=16",
        "--training.local_batch_size=8",
        f"--training.seq_len={seq_len}",
        "--lr_scheduler.warmup_steps=2",
        "--validation.enable=false",
        "--metrics.enable_tensorboard=false",
        "--metrics.log_freq=1",
        "--checkpoint.enable=false",
        *overrides,
    ]
    env = {**os.environ, "NGPU": str(ranks), "OMP_NUM_THREADS": str(threads)}
    command = ["./run_train.sh", *args]
    with tempfile.TemporaryDirectory() as dump:  # the run folders go away with it
        done = subprocess.run(
            [*command, f"--job.dump_folder={dump}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
    if done.returncode:
        raise RuntimeError(
            f"NGPU={ranks} {' '.join(command)} failed ({done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-3000:]}"
        )
    return done.stdout + done.stderr, [f"NGPU={ranks} OMP_NUM_THREADS={threads}", *command]


def parse_options(description: str, steps: int) -> argparse.Namespace:
    """``--steps`` (default ``steps``) per run, ``--seq-len``, ``--warmup`` and config overrides
    after ``--``; exits when the steps do not exceed the warmup."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=steps, help="training steps per run")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per sequence")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of the medians")
    parser.add_argument(
        "overrides", nargs="*", help="config overrides after --, e.g. --model.flavor=debug_untied"
    )
    opts = parser.parse_args()
    if opts.steps <= opts.warmup:
        sys.exit(f"--steps ({opts.steps}) must exceed --warmup ({opts.warmup})")
    return opts


def main() -> None:
    opts = parse_options(__doc__, steps=30)
    tokens_per_step = 16 * opts.seq_len
    results = {}
    print(
        f"{'ranks':>5} {'threads/rank':>12} {'s/step':>8} {'tokens/s/rank':>13} "
        f"{'total tokens/s':>14}"
    )
    for ranks, threads in RUNS:
        output, command = run(ranks, threads, opts.steps, opts.seq_len, opts.overrides)
        per_rank = statistics.median(parse_tps(output, opts.warmup))
        total = per_rank * ranks
        results[ranks, threads] = total
        print(
            f"{ranks:>5} {threads:>12} {tokens_per_step / total:>8.3f} {per_rank:>13,.0f} "
            f"{total:>14,.0f}",
            flush=True,
        )
        print(f"      command: {' '.join(command)}")
    print(
        f"scaling efficiency (2 ranks x 1 thread) / (2 x 1 rank x 1 thread): "
        f"{results[2, 1] / (2 * results[1, 1]):.3f}"
    )
    print(
        "same-cores ratio (2 ranks x 1 thread) / (1 rank x 2 threads): "
        f"{results[2, 1] / results[1, 2]:.3f}"
    )
    print(
        f"command: python benchmarks/bench_scaling.py --steps {opts.steps} --seq-len "
        f"{opts.seq_len} "
        f"--warmup {opts.warmup}" + (f" -- {' '.join(opts.overrides)}" if opts.overrides else "")
    )


if __name__ == "__main__":
    with reported_load():
        main()
