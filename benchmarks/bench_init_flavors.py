"""Benchmark (not a test): init time per rank of every published flavor, meta -> FSDP2 ->
materialize -> init.

For each flavor the model is built on meta and sharded as the trainer does
(:func:`torchtitan_lite.distributed.fsdp.apply_fsdp` on a 1-D mesh of ``N`` ranks), then this
process plays rank ``r`` of ``N`` through a fake process group
(``torch.testing._internal.distributed.fake_pg``: collectives return at once and move nothing), so
only rank ``r``'s shard is allocated: ``materialize`` (``to_empty``) and ``init_weights`` with the
family's real init plan (keyed sampling: the values are those of a real ``N``-rank run, checked in
``tests/test_init_flavors_fake_pg.py``). The init engine runs no collective.

Each flavor runs in a child process of its own: a second fake group in one process can leave
DTensors with the first group's mesh coordinate (torch 2.13 caches sharding specs by mesh value),
and a fresh process also returns the shard's memory.

``N`` is the smallest power of two for which rank 0's shard fits ``--max-shard-gib`` (fp32). FSDP2
shards dim 0, which is the expert dimension of MoE weights: a rank holds at least one whole expert
of every MoE tensor while ``N <= num_experts``, so for some flavors (gpt_oss 120b, deepseek_v3 671b)
no ``N`` fits rank 0; then the benchmark picks the smallest ``N`` where some rank fits and simulates
the fitting rank with the largest shard (the ``rank`` column says which, and a note gives rank 0's
size).

    python benchmarks/bench_init_flavors.py                          # every flavor, 2 GiB shards
    python benchmarks/bench_init_flavors.py --flavors qwen3:0.6b gpt_oss:20b --max-shard-gib 1

Columns: total parameters, ``N``, the simulated rank, its shard's parameters, seconds for
``materialize`` and for ``init_weights``, and nanoseconds of ``init_weights`` per shard element.
"""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from machine_load import reported_load
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from torchtitan_lite.distributed.fsdp import apply_fsdp
from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.models import get_model_spec

FLAVORS = (
    "qwen3:0.6b",
    "qwen3:1.7b",
    "qwen3:4b",
    "qwen3:8b",
    "qwen3:14b",
    "qwen3:32b",
    "qwen3_moe:30b-a3b",
    "gpt_oss:20b",
    "gpt_oss:120b",
    "deepseek_v3:16b",
    "deepseek_v3:671b",
)
MAX_WORLD_SIZE = 4096


@dataclass(frozen=True)
class InitTiming:
    """One simulated rank's init: parameters of the whole model and of the shard, seconds of each
    phase."""

    total_params: int
    shard_params: int
    materialize_s: float
    init_s: float


def build_meta(family: str, flavor: str) -> tuple[nn.Module, object]:
    """``(model on meta, its args)`` of ``family``'s ``flavor``."""
    spec = get_model_spec(family)
    if flavor not in spec.flavors:
        raise ValueError(f"unknown flavor {family}:{flavor}; known: {', '.join(spec.flavors)}")
    args = spec.flavors[flavor]
    with torch.device("meta"):
        return spec.model_cls(args), args


def shard_numels(model: nn.Module, world_size: int) -> list[int]:
    """Parameters each rank holds under FSDP2's Shard(0) (``torch.chunk`` of dim 0: ``ceil(d0 / N)``
    rows per rank, the last ranks fewer or none), for ``model`` built on meta; a tied tensor counts
    once."""
    counts = [0] * world_size
    for p in model.parameters():
        rows = p.shape[0] if p.dim() else 1
        row_numel = p.numel() // rows if rows else 0
        chunk = -(-rows // world_size)
        for r in range(world_size):
            counts[r] += max(0, min(chunk, rows - r * chunk)) * row_numel
    return counts


def choose_rank(model: nn.Module, max_shard_params: int) -> tuple[int, int, int]:
    """``(N, rank, rank 0's shard size)``: the smallest power-of-two ``N`` whose rank-0 shard has at
    most ``max_shard_params`` parameters (rank 0); if none does up to :data:`MAX_WORLD_SIZE`, the
    smallest ``N`` where some rank fits and the fitting rank with the largest shard.

    Raises:
        ValueError: ``max_shard_params`` is not positive, or no rank of any ``N`` up to
            :data:`MAX_WORLD_SIZE` fits (raise the budget).
    """
    if max_shard_params <= 0:
        raise ValueError(
            f"the shard budget must be > 0 parameters, got {max_shard_params}; raise "
            "--max-shard-gib"
        )
    candidates = [2**i for i in range(MAX_WORLD_SIZE.bit_length())]
    for n in candidates:
        counts = shard_numels(model, n)
        if counts[0] <= max_shard_params:
            return n, 0, counts[0]
    for n in candidates:
        counts = shard_numels(model, n)
        fitting = [r for r in range(n) if counts[r] <= max_shard_params]
        if fitting:
            return n, max(fitting, key=lambda r: counts[r]), counts[0]
    raise ValueError(
        f"no rank of up to {MAX_WORLD_SIZE} holds at most {max_shard_params} parameters; "
        "raise --max-shard-gib"
    )


def init_rank(
    family: str, flavor: str, world_size: int, rank: int, seed: int = 0
) -> tuple[nn.Module, InitTiming]:
    """Build ``family:flavor`` on meta, ``apply_fsdp`` on ``world_size`` ranks, and as ``rank``
    (fake process group) materialize on CPU and init with the family's plan and ``seed``. Returns
    the model (its parameters are DTensors holding rank ``rank``'s fp32 shard) and the timing. Call
    once per process (see the module docstring); the fake group stays up
    (``dist.destroy_process_group()`` after use).

    Raises:
        RuntimeError: a process group is already running in this process.
    """
    if dist.is_initialized():
        raise RuntimeError(
            "init_rank: a process group is already running; simulate one rank per process"
        )
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    spec = get_model_spec(family)
    model, args = build_meta(family, flavor)
    total = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp_shard",))
    apply_fsdp(
        model,
        mesh,
        param_dtype=torch.float32,
        reduce_dtype=torch.float32,
        reshard_after_forward=True,
    )
    start = time.perf_counter()
    materialize(model, "cpu")
    materialized = time.perf_counter()
    init_weights(model, spec.init_plan(args), seed, buffer_device="cpu")
    done = time.perf_counter()
    shard = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())
    return model, InitTiming(total, shard, materialized - start, done - materialized)


def run_child(name: str, world_size: int, rank: int, threads: int) -> InitTiming:
    """:func:`init_rank` of ``name`` (``family:flavor``) in a fresh Python process; its timing."""
    command = [
        sys.executable,
        __file__,
        "--child",
        name,
        str(world_size),
        str(rank),
        "--threads",
        str(threads),
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return InitTiming(**json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--flavors", nargs="+", default=list(FLAVORS), help="family:flavor, e.g. qwen3:0.6b"
    )
    parser.add_argument(
        "--max-shard-gib", type=float, default=2.0, help="fp32 shard budget per rank, GiB"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--child", nargs=3, metavar=("FLAVOR", "N", "RANK"), help=argparse.SUPPRESS)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    if opts.child:
        family, _, flavor = opts.child[0].partition(":")
        _, timing = init_rank(family, flavor, int(opts.child[1]), int(opts.child[2]))
        dist.destroy_process_group()
        print(json.dumps(timing.__dict__))
        return
    with reported_load():
        report(opts)


def report(opts: argparse.Namespace) -> None:
    """The table of every flavor in ``opts.flavors``, each measured in a child process."""
    budget = int(opts.max_shard_gib * 2**30 // 4)
    header = (
        f"{'flavor':<18} {'total params':>16} {'N':>5} {'rank':>5} {'shard params':>14} "
        f"{'materialize s':>13} {'init s':>8} {'ns/element':>10}"
    )
    print(header)
    print("-" * len(header))
    notes = []
    for name in opts.flavors:
        family, _, flavor = name.partition(":")
        meta_model, _ = build_meta(family, flavor)
        world_size, rank, rank0 = choose_rank(meta_model, budget)
        predicted = shard_numels(meta_model, world_size)[rank]
        del meta_model
        t = run_child(name, world_size, rank, opts.threads)
        if t.shard_params != predicted:
            raise RuntimeError(
                f"{name}: rank {rank} of {world_size} holds {t.shard_params} parameters, "
                f"predicted {predicted}: FSDP2's sharding differs from shard_numels"
            )
        if rank:
            notes.append(
                f"{name}: rank 0 of {world_size} would hold {rank0:,} parameters "
                f"({rank0 * 4 / 2**30:.1f} GiB fp32), over the budget"
            )
        print(
            f"{name:<18} {t.total_params:>16,} {world_size:>5} {rank:>5} {t.shard_params:>14,} "
            f"{t.materialize_s:>13.3f} {t.init_s:>8.2f} {t.init_s / t.shard_params * 1e9:>10.2f}",
            flush=True,
        )
    for note in notes:
        print("note:", note)
    print(
        f"command: python benchmarks/bench_init_flavors.py --flavors {' '.join(opts.flavors)} "
        f"--max-shard-gib {opts.max_shard_gib:g} --threads {opts.threads}"
    )


if __name__ == "__main__":
    main()
