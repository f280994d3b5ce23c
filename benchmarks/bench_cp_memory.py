"""Benchmark (not a test): peak memory per rank and tokens/s of context parallelism at a long
window.

Runs ``./run_train.sh`` with the GPT-OSS and DeepSeek-V3 debug configs at ``--seq-len`` (default
16384; the models' ``max_seq_len`` raised to it) on ``context_parallel_degree`` 1, 2 and 4 (that
many ranks, one thread each), one window per step (global batch 1: the cp ranks share it), fp32, the
blockwise attention kernel on every run (what CP runs on CPU; on one process ``auto`` would give
DeepSeek-V3's MLA, whose query and value head dims differ, SDPA's math kernel and its ``S x S``
scores: 18.9 GiB at 16k, killed here for memory), no activation checkpointing, validation,
TensorBoard and checkpoints off. Per run it prints the peak RSS of every rank (the trainer's ``mem``
field on CPU, from each rank's last step line: ``LOG_RANK`` shows them all) and the median tokens/s
per rank (every rank's step lines after ``--warmup`` steps) and in total.

On CPU the RSS includes the interpreter, torch and the data (about 0.5 GiB here) besides the
activations; the activations of the blocks and the logits fall as ``1 / cp``, while the keys and
values of the whole window that each block gathers and keeps for its backward do not. Tokens/s on a
2-core machine only shows overhead (4 ranks share 2 cores).

    python benchmarks/bench_cp_memory.py                      # 16k, 3 steps per run
    python benchmarks/bench_cp_memory.py --seq-len 8192 --steps 2
    python benchmarks/bench_cp_memory.py --estimate            # the published sizes, no run

``--estimate`` prints instead the preflight's per-device estimate (``preflight/memory.py``: bf16,
batch 1, full activation checkpointing) of the published sizes in :data:`PUBLISHED` at 32k and 128k
tokens on cp 1, 2, 4 and 8.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics

from bench_scaling import parse_tps, run
from machine_load import reported_load
from torchtitan_lite.models import get_model_spec

from torchtitan_lite.preflight.memory import GIB, estimate_rank_memory, meta_parameter_count

MEM = re.compile(r"\[rank(\d+)\]:step\s+\d+\s+loss\s+\S+.*?\bmem ([\d.]+)GiB")
MODELS = {
    "GPT-OSS": "train_configs/gpt_oss_debug.toml",
    "DeepSeek-V3": "train_configs/deepseek_v3_debug.toml",
}
DEGREES = (1, 2, 4)
PUBLISHED = {  # name: (family, flavor, devices)
    "Llama 3 8B": ("llama3", "8b", 8),
    "Llama 3 70B": ("llama3", "70b", 64),
    "GPT-OSS-120B": ("gpt_oss", "120b", 16),
    "DeepSeek-V3-671B": ("deepseek_v3", "671b", 256),
}


def estimates() -> None:
    """The ``--estimate`` table (module docstring)."""
    print("| model | devices | context | cp | states (GiB) | activations (GiB) | total (GiB) |")
    print("|---|---|---|---|---|---|---|")
    for name, (family, flavor, devices) in PUBLISHED.items():
        spec = get_model_spec(family)
        args = spec.flavors[flavor]
        n_params = meta_parameter_count(spec.model_cls, args)
        for seq_len in (32768, 131072):
            for cp in (1, 2, 4, 8):
                est = estimate_rank_memory(
                    n_params,
                    args,
                    world_size=devices,
                    seq_len=seq_len,
                    local_batch_size=1,
                    compute_bytes=2,
                    ac_mode="full",
                    dense_scores=False,
                    cp=cp,
                )
                gib = (est.states / GIB, est.activations / GIB, est.total / GIB)
                sizes = " | ".join(f"{v:.1f}" for v in gib)
                print(f"| {name} | {devices} | {seq_len // 1024}k | {cp} | {sizes} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=3, help="training steps per run")
    parser.add_argument("--seq-len", type=int, default=16384, help="tokens per window")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the medians")
    parser.add_argument(
        "--estimate", action="store_true", help="the published sizes' estimates, no run"
    )
    parser.add_argument("overrides", nargs="*", help="config overrides after --")
    options = parser.parse_args()
    if options.estimate:
        estimates()
        return
    seq_len = options.seq_len
    print("| model | cp | peak RSS of each rank (GiB) | tokens/s per rank | tokens/s total |")
    print("|---|---|---|---|---|")
    with reported_load():
        for name, config in MODELS.items():
            for cp in DEGREES:
                # run_train.sh's config file and the ranks whose lines it shows
                os.environ.update(CONFIG_FILE=config, LOG_RANK=",".join(map(str, range(cp))))
                overrides = [
                    f"--model.overrides.max_seq_len={seq_len}",
                    f"--parallelism.context_parallel_degree={cp}",
                    "--training.global_batch_size=1",
                    "--training.local_batch_size=1",
                    "--training.compute_dtype=float32",
                    "--activation_checkpoint.mode=none",
                    "--model.attn_backend=blockwise",
                    *options.overrides,
                ]
                output, _ = run(cp, 1, options.steps, seq_len, overrides)
                mem = {int(m.group(1)): float(m.group(2)) for m in MEM.finditer(output)}  # last
                tps = statistics.median(parse_tps(output, options.warmup))
                rss = ", ".join(f"{mem[rank]:.2f}" for rank in sorted(mem))
                print(f"| {name} | {cp} | {rss} | {tps:,.0f} | {tps * cp:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
