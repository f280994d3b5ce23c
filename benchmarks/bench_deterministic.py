"""Benchmark (not a test): tokens/s and peak memory of ``training.deterministic = "layout"`` vs ``"off"`` on one
layout, side by side in one run.

Runs ``./run_train.sh`` with the qwen3 debug config (by default) on dp_shard 2 (``--ranks``) with one micro-batch per
rank (global batch 16 = local batch 8 x 2 ranks, the case the issue's 0.85x target names), each rank one thread,
validation, TensorBoard and checkpoints off, alternating ``off`` and ``layout`` ``--repeats`` times so that a change
in the machine's load hits both alike. Per mode: the median per-device tokens/s over all its runs' steps after
``--warmup``, the largest peak memory of rank 0 (the trainer's ``mem`` field), and ``layout / off`` for both.
``--micro-batches N`` runs N micro-batches per rank (global batch 16 x N) to show the cost of the tree's buffers.

What ``layout`` adds: per FSDP group and micro-batch an ``all_to_all`` in place of the reduce-scatter (the same
bytes without HSDP) and ``D - 1`` additions of a shard on its owner; per step one all-gather of every parameter's
per-row sums of squares (the gradient norm) and of the loss; AdamW ``foreach`` instead of ``fused``.

    python benchmarks/bench_deterministic.py                     # 2 x 2 runs of 20 steps, a few minutes on 2 cores
    python benchmarks/bench_deterministic.py --micro-batches 4 -- --training.seq_len=128

Arguments after ``--`` are config overrides passed to every run.
"""

from __future__ import annotations

import argparse
import statistics

from bench_parallel import MEM
from bench_scaling import parse_tps, run
from machine_load import reported_load

MODES = ("off", "layout")


def parse_options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="training steps per run")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per sequence")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of the medians")
    parser.add_argument("--ranks", type=int, default=2, help="data-parallel ranks (dp_shard)")
    parser.add_argument("--micro-batches", type=int, default=1, help="micro-batches per rank per step")
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode, alternating")
    parser.add_argument("overrides", nargs="*", help="config overrides after --")
    opts = parser.parse_args()
    if opts.steps <= opts.warmup:
        parser.error(f"--steps ({opts.steps}) must exceed --warmup ({opts.warmup})")
    return opts


def main() -> None:
    opts = parse_options()
    batch = ["--training.local_batch_size=8", f"--training.global_batch_size={8 * opts.ranks * opts.micro_batches}"]
    tps: dict[str, list[float]] = {mode: [] for mode in MODES}
    mem: dict[str, float] = dict.fromkeys(MODES, 0.0)
    for _ in range(opts.repeats):
        for mode in MODES:
            output, command = run(opts.ranks, 1, opts.steps, opts.seq_len,
                                  [*batch, f"--training.deterministic={mode}", *opts.overrides])
            tps[mode] += parse_tps(output, opts.warmup)
            mem[mode] = max(mem[mode], *(float(m) for m in MEM.findall(output)))
            print(f"  {mode:>6}: {' '.join(command)}", flush=True)
    print(f"{opts.ranks} ranks, {opts.micro_batches} micro-batch(es) of 8 x {opts.seq_len} tokens per rank, "
          f"{opts.repeats} run(s) per mode")
    print(f"{'mode':>6} {'tps/device':>10} {'mem GiB':>7}")
    median = {mode: statistics.median(tps[mode]) for mode in MODES}
    for mode in MODES:
        print(f"{mode:>6} {median[mode]:>10,.0f} {mem[mode]:>7.2f}")
    print(f"layout / off: tokens/s {median['layout'] / median['off']:.3f}, peak memory {mem['layout'] / mem['off']:.3f}")


if __name__ == "__main__":
    with reported_load():
        main()
