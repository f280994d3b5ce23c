"""Benchmark (not a test): tokens/s and peak memory per rank of each parallel layout, as ratios to
one process.

Runs ``./run_train.sh`` with the qwen3 debug config (by default) on every layout of :data:`LAYOUTS`:
one process, FSDP over 2 ranks, tensor parallelism over 2 ranks, FSDP 2 x TP 2 and HSDP 2 x 2 (4
ranks), and pipeline parallelism: 2 stages with each schedule (2 ranks), 2 stages x FSDP 2 and 2
stages x TP 2 (4 ranks; the pipeline rows train the untied variant, which a pipeline needs: the same
FLOPs, one more 2048 x 256 table). Each rank has one thread; the same global batch (16 sequences of
``--seq-len`` tokens in micro-batches of 4, split into pipeline micro-batches of 1), validation,
TensorBoard and checkpoints off. Per layout it prints the median per-device tokens/s after
``--warmup`` steps (the trainer's ``tps``: a data-parallel rank's tokens shared by its tensor- and
pipeline-parallel ranks), the total tokens/s (``tps`` x ranks), the largest peak memory of the ranks
(their ``mem`` fields: pipeline stages differ), and their ratios to one process.

What CPU numbers show: only overhead. On a 2-core machine a 4-rank layout runs two ranks per core,
and gloo collectives over shared memory cost what NCCL over NVLink does not; tensor parallelism
splits matmuls that are already small. The ratios say how much a layout costs beyond its math here,
not how it scales on GPUs (there run ``benchmarks/gpu_check.sh`` with ``NGPU=2 TP=2`` or
``NGPU=2 PP=2``); a pipeline adds its bubble, idle ranks while the micro-batches fill and drain it.
The load average is printed: a loaded machine skews every number.

    python benchmarks/bench_parallel.py              # 20 steps per layout, a few minutes on 2 cores
    python benchmarks/bench_parallel.py --steps 12 -- --model.flavor=debug_untied
    python benchmarks/bench_parallel.py --moe          # expert parallelism: the rows of MOE_LAYOUTS

With ``--moe`` it runs the Qwen3-MoE debug config (4 MoE blocks, 8 experts, top-2) on
:data:`MOE_LAYOUTS` (1 process, FSDP 2 and 4, ep 2, ep 4, FSDP 4 x ep 2, FSDP 2 x TP 2 x ep 2) and
adds the all-to-all bytes each rank sends per step, computed from the shapes
(:func:`all_to_all_bytes`).

Arguments after ``--`` are config overrides passed to every run.
"""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import os
import re
import statistics
import sys

from bench_scaling import parse_options, parse_tps, run

from torchtitan_lite.models import get_model_spec

MEM = re.compile(r"step\s+\d+\s+loss\s+\S+.*?\bmem ([\d.]+)GiB")
PP2 = ["--parallelism.pipeline_parallel_degree=2", "--model.tie_embeddings=false"]
LAYOUTS = {  # name: (ranks, [parallelism] overrides)
    "1 process": (1, []),
    "dp_shard 2": (2, []),
    "tp 2": (2, ["--parallelism.tensor_parallel_degree=2"]),
    "dp_shard 2 x tp 2": (4, ["--parallelism.tensor_parallel_degree=2"]),
    "dp_replicate 2 x dp_shard 2": (4, ["--parallelism.data_parallel_replicate_degree=2"]),
    "pp 2 (1F1B)": (2, [*PP2]),
    "pp 2 (GPipe)": (2, [*PP2, "--parallelism.pipeline_parallel_schedule=GPipe"]),
    "pp 2 (Interleaved1F1B)": (
        2,
        [*PP2, "--parallelism.pipeline_parallel_schedule=Interleaved1F1B"],
    ),
    "pp 2 x dp_shard 2": (4, [*PP2]),
    "pp 2 x tp 2": (4, [*PP2, "--parallelism.tensor_parallel_degree=2"]),
}

EP = "--parallelism.expert_parallel_degree"
MOE_LAYOUTS = {
    "1 process": (1, []),
    "dp_shard 2": (2, []),
    "ep 2": (2, [f"{EP}=2"]),
    "dp_shard 4": (4, []),
    "ep 4": (4, [f"{EP}=4"]),
    "dp_shard 4, ep 2": (4, [f"{EP}=2"]),
    "dp_shard 2 x tp 2, ep 2": (4, ["--parallelism.tensor_parallel_degree=2", f"{EP}=2"]),
}
"""Expert-parallel layouts: EP borrows its ranks from ``dp_shard x tp`` (``docs/parallel.md``,
"Expert parallelism")."""
MOE_CONFIG = "train_configs/qwen3_moe_debug.toml"
GLOBAL_BATCH = 16
"""Sequences per step (``bench_scaling.run``)."""


def all_to_all_bytes(
    ranks: int, layout: list[str], seq_len: int, bytes_per_element: int = 4
) -> float:
    """Bytes one rank sends to other ranks per step under expert parallelism, from the shapes of the
    Qwen3-MoE debug flavor: each MoE layer sends its ``T / tp`` tokens' ``top_k`` rows of ``dim``
    elements out and back in forward and twice again in backward (4 exchanges), ``(ep - 1) / ep`` of
    them to other ranks under balanced routing; ``T = GLOBAL_BATCH * seq_len / dp`` tokens per rank
    and step. 0 without expert parallelism."""
    degrees = {key.split("=")[0]: int(key.split("=")[1]) for key in layout}
    ep, tp = degrees.get(EP, 1), degrees.get("--parallelism.tensor_parallel_degree", 1)
    if ep == 1:
        return 0.0
    args = get_model_spec("qwen3_moe").flavors["debug"]
    tokens = GLOBAL_BATCH * seq_len / (ranks // tp) / tp
    return 4 * args.n_layers * tokens * args.top_k * args.dim * bytes_per_element * (ep - 1) / ep


def main() -> None:
    moe = "--moe" in sys.argv
    if moe:
        sys.argv.remove("--moe")
        os.environ["CONFIG_FILE"] = MOE_CONFIG  # run_train.sh's config
    opts = parse_options(__doc__, steps=20)
    print(
        f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min) on "
        f"{os.cpu_count()} CPUs; CPU numbers show overhead only (see the docstring)"
    )
    print(
        f"{'layout':>28} {'ranks':>5} {'tps/device':>10} {'total tok/s':>11} {'mem GiB':>7} "
        f"{'total/1':>7} {'mem/1':>6}" + (f" {'a2a MB/step/rank':>16}" if moe else "")
    )
    base = None
    for name, (ranks, layout) in (MOE_LAYOUTS if moe else LAYOUTS).items():
        os.environ["LOG_RANK"] = ",".join(
            map(str, range(ranks))
        )  # every rank's lines: stages differ in memory
        output, command = run(
            ranks,
            1,
            opts.steps,
            opts.seq_len,  # bench_scaling's run, micro-batches of 4
            ["--training.local_batch_size=4", *layout, *opts.overrides],
        )
        tps = statistics.median(parse_tps(output, opts.warmup))
        mem = max(float(m) for m in MEM.findall(output))
        total = tps * ranks
        base = base or (total, mem)
        a2a = f" {all_to_all_bytes(ranks, layout, opts.seq_len) / 1e6:>16.1f}" if moe else ""
        print(
            f"{name:>28} {ranks:>5} {tps:>10,.0f} {total:>11,.0f} {mem:>7.2f} "
            f"{total / base[0]:>7.2f} {mem / base[1]:>6.2f}{a2a}",
            flush=True,
        )
        print(f"      command: {' '.join(command)}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"command: python benchmarks/bench_parallel.py{' --moe' if moe else ''} --steps "
        f"{opts.steps} --seq-len {opts.seq_len} "
        f"--warmup {opts.warmup}" + (f" -- {' '.join(opts.overrides)}" if opts.overrides else "")
    )


if __name__ == "__main__":
    main()
