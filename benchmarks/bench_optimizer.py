"""Benchmark (not a test): one optimizer step, Muon (+ AdamW for the rest) vs AdamW, seconds and
memory per rank.

Two settings, each variant in a child process of its own (a fresh peak RSS, one fake process group
per process):

- ``debug``: a family's debug model on one process, plain CPU tensors (no process group);
- ``16b``: rank ``r`` of ``N`` of DeepSeek-V3 16b (Moonlight-16B-A3B's shapes; ``--layers`` of its
  27 blocks, the first dense) sharded by FSDP2 on a fake process group
  (``torch.testing._internal.distributed.fake_pg``, as ``bench_init_flavors.py``): only rank ``r``'s
  shard is allocated and the collectives move nothing, so the time is this rank's compute (its
  elementwise steps, Newton-Schulz of the experts it holds and of the 2-D matrices it owns), without
  the network. The bytes Muon's two all-to-alls would move for this rank are computed from the
  shapes.

The gradients are set to a fixed multiple of the weights (the values do not change the work);
denormals are flushed. Columns: the step's median seconds over ``--steps`` steps after one warm-up
step, the optimizer state per rank (exact, from ``optimizer.state``), the peak RSS growth over the
RSS before the first step (state plus the step's temporaries), and, for Muon, the matrices this rank
orthogonalizes and the all-to-all bytes it sends.

    python benchmarks/bench_optimizer.py                        # debug (deepseek_v3, qwen3) and 16b
    python benchmarks/bench_optimizer.py --settings 16b --world-size 64 --rank 5 --layers 27
"""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from machine_load import reported_load
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from torchtitan_lite.components.muon import owners
from torchtitan_lite.components.optimizer import build_optimizer
from torchtitan_lite.distributed.fsdp import apply_fsdp
from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.models import get_model_spec

MUON = {
    "momentum": 0.95,
    "nesterov": True,
    "ns_coefficients": [3.4445, -4.7750, 2.0315],
    "ns_steps": 5,
    "muon_eps": 1e-7,
    "adjust_lr_fn": "match_rms_adamw",
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def measure(
    family: str,
    flavor: str,
    optimizer: str,
    steps: int,
    world_size: int,
    rank: int,
    layers: int | None,
) -> dict:
    """One variant in this process: the model built (and sharded on a fake group when ``world_size``
    > 1), the optimizer built, one warm-up step, then ``steps`` timed steps."""
    spec = get_model_spec(family)
    args = spec.flavors[flavor]
    if layers is not None:
        args = dataclasses.replace(args, n_layers=layers)
    with torch.device("meta"):
        model = spec.model_cls(args)
    if world_size > 1:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp_shard",))
        apply_fsdp(
            model,
            mesh,
            param_dtype=torch.float32,
            reduce_dtype=torch.float32,
            reshard_after_forward=True,
        )
    materialize(model, "cpu")
    init_weights(model, spec.init_plan(args), 0, buffer_device="cpu")
    for p in model.parameters():
        p.grad = p.detach() * 1e-3
    opt = build_optimizer(
        model,
        lr=3e-4,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=0.1,
        decay_embeddings=False,
        decay_norms_and_biases=False,
        implementation="foreach",
        muon=MUON if optimizer == "Muon" else None,
    )
    owned, sent = 0, 0
    if (
        optimizer == "Muon"
    ):  # what MuonWithAdamW does with each matrix, from the shapes (components/muon.py)
        muon = [p for g in opt.param_groups if g["use_muon"] for p in g["params"]]
        stacks, matrices = [p for p in muon if p.ndim == 3], [p for p in muon if p.ndim == 2]
        owned = sum(
            _local(p).shape[0] for p in stacks
        )  # the experts this rank holds, orthogonalized in place
        owner = owners([p.numel() for p in matrices], world_size)
        for p, k in zip(matrices, owner, strict=True):
            owned += k == rank
            # out: this rank's bf16 shard to the owner; back: the owner's rows for the other ranks
            local = _local(p).numel()
            sent += 2 * (local if k != rank else p.numel() - local)
    rss_before = _rss_bytes()
    opt.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    state = sum(
        _local(t).numel() * t.element_size()
        for s in opt.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor)
    )
    params = sum(_local(p).numel() for p in model.parameters())
    if world_size > 1:
        dist.destroy_process_group()
    return {
        "step_s": statistics.median(times),
        "state_bytes": state,
        "peak_growth_bytes": peak - rss_before,
        "params": params,
        "owned_matrices": owned,
        "sent_bytes": sent if world_size > 1 else 0,
    }


def run_child(*argv: str) -> dict:
    command = [sys.executable, __file__, "--child", *argv]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _gib(n: float) -> str:
    return f"{n / 2**30:.3f}"


def report(opts: argparse.Namespace) -> None:
    rows = []
    if "debug" in opts.settings:
        rows += [
            (f"{family} debug, 1 process", (family, "debug", 1, 0, "0"))
            for family in ("deepseek_v3", "qwen3")
        ]
    if "16b" in opts.settings:
        rows.append(
            (
                f"deepseek_v3 16b ({opts.layers} blocks), rank {opts.rank} of {opts.world_size}",
                ("deepseek_v3", "16b", opts.world_size, opts.rank, str(opts.layers)),
            )
        )
    header = (
        f"{'setting':<44} {'optimizer':<6} {'params/rank':>12} {'step s':>8} {'ratio':>6} "
        f"{'state GiB':>10} {'peak+ GiB':>10} {'NS mats':>8} {'a2a MiB':>8}"
    )
    print(header)
    print("-" * len(header))
    for name, (family, flavor, n, r, layers) in rows:
        base = None
        for optimizer in ("AdamW", "Muon"):
            m = run_child(
                family,
                flavor,
                optimizer,
                str(opts.steps),
                str(n),
                str(r),
                layers,
                str(opts.threads),
            )
            base = base or m["step_s"]
            print(
                f"{name:<44} {optimizer:<6} {m['params']:>12,} {m['step_s']:>8.3f} "
                f"{m['step_s'] / base:>6.2f} "
                f"{_gib(m['state_bytes']):>10} {_gib(m['peak_growth_bytes']):>10} "
                f"{m['owned_matrices']:>8} {m['sent_bytes'] / 2**20:>8.1f}",
                flush=True,
            )
    print(
        f"command: python benchmarks/bench_optimizer.py --settings {' '.join(opts.settings)} "
        f"--steps {opts.steps} "
        f"--world-size {opts.world_size} --rank {opts.rank} --layers {opts.layers} --threads "
        f"{opts.threads}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--settings", nargs="+", choices=("debug", "16b"), default=["debug", "16b"])
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--world-size", type=int, default=64, help="16b: FSDP2 ranks N")
    parser.add_argument("--rank", type=int, default=0, help="16b: the simulated rank r")
    parser.add_argument(
        "--layers", type=int, default=27, help="16b: blocks of the 27 (the first dense)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--child", nargs=8, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        family, flavor, optimizer, steps, n, r, layers, threads = opts.child
        torch.set_num_threads(int(threads))
        torch.set_flush_denormal(True)
        result = measure(family, flavor, optimizer, int(steps), int(n), int(r), int(layers) or None)
        print(json.dumps(result))
        return
    with reported_load():
        report(opts)


if __name__ == "__main__":
    main()
