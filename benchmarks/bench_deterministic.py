"""Benchmark (not a test): tokens/s and peak memory of ``training.deterministic = "layout"`` vs
``"off"`` on one layout, side by side in one run.

Runs ``./run_train.sh`` with the qwen3 debug config (by default) on dp_shard 2 with one micro-batch
per rank (global batch 16 = local batch 8 x 2 ranks, the case the issue's 0.85x target names), each
rank one thread, validation, TensorBoard and checkpoints off, alternating ``off`` and ``layout``
twice so that a change in the machine's load hits both alike. Per mode: the median per-device
tokens/s over all its runs' steps after ``--warmup``, the largest peak memory of rank 0 (the
trainer's ``mem`` field), and ``layout / off`` for both. ``-- --training.global_batch_size=64`` runs
4 micro-batches per rank, to show the cost of the tree's buffers.

What ``layout`` adds: per FSDP group and micro-batch an ``all_to_all`` in place of the
reduce-scatter (the same bytes without HSDP) and ``D - 1`` additions of a shard on its owner; per
step one all-gather of every parameter's per-row sums of squares (the gradient norm) and of the
loss; AdamW ``foreach`` instead of ``fused``.

    python benchmarks/bench_deterministic.py      # 2 x 2 runs of 20 steps, a few minutes on 2 cores
    python benchmarks/bench_deterministic.py --steps 12 -- --training.global_batch_size=64

Arguments after ``--`` are config overrides passed to every run.
"""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import statistics

from bench_parallel import MEM
from bench_scaling import parse_options, parse_tps, run
from machine_load import reported_load

MODES = ("off", "layout")
RANKS = 2
"""dp_shard 2."""
REPEATS = 2
"""Runs per mode, alternating."""


def main() -> None:
    opts = parse_options(__doc__, steps=20)
    tps: dict[str, list[float]] = {mode: [] for mode in MODES}
    mem: dict[str, float] = dict.fromkeys(MODES, 0.0)
    for _ in range(REPEATS):
        for mode in MODES:
            output, command = run(
                RANKS,
                1,
                opts.steps,
                opts.seq_len,  # bench_scaling's: global 16, local 8
                [f"--training.deterministic={mode}", *opts.overrides],
            )
            tps[mode] += parse_tps(output, opts.warmup)
            mem[mode] = max(mem[mode], *(float(m) for m in MEM.findall(output)))
            print(f"  {mode:>6}: {' '.join(command)}", flush=True)
    print(f"{RANKS} ranks, micro-batches of 8 x {opts.seq_len} tokens, {REPEATS} runs per mode")
    print(f"{'mode':>6} {'tps/device':>10} {'mem GiB':>7}")
    median = {mode: statistics.median(tps[mode]) for mode in MODES}
    for mode in MODES:
        print(f"{mode:>6} {median[mode]:>10,.0f} {mem[mode]:>7.2f}")
    print(
        f"layout / off: tokens/s {median['layout'] / median['off']:.3f}, peak memory "
        f"{mem['layout'] / mem['off']:.3f}"
    )


if __name__ == "__main__":
    with reported_load():
        main()
