"""Benchmark and check (not a test): the init drawn on a device against the same init drawn on the
host CPU.

Builds a config's model on meta, materializes it on ``--device`` and runs ``init_weights`` there
(the values are computed on that device: :mod:`torchtitan_lite.init.draw`), then the same on the
CPU, and prints both fingerprints (they must be equal: the counter-based values are the same bits on
every device), the device's init seconds (compile seconds apart: the first call of each compiled
kernel), and a ``normal_`` fill of the same tensors on the device, side by side in this process.
Exits 1 when the fingerprints differ.

    python benchmarks/bench_init_device.py --device cuda [--config train_configs/qwen3_0.6b.toml]
    [--reps 3]

``benchmarks/gpu_check.sh`` runs it with ``INIT=1``.
"""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import sys
import time

import torch
from machine_load import reported_load

from torchtitan_lite.distributed.devices import device_module
from torchtitan_lite.init import draw
from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.init.fingerprint import model_fingerprint
from torchtitan_lite.preflight.checks import load_run_or_exit


def _init(spec, args, seed: int, device: str) -> tuple[torch.nn.Module, float]:
    with torch.device("meta"):
        model = spec.model_cls(args)
    materialize(model, device)
    begin = time.perf_counter()
    init_weights(model, spec.init_plan(args), seed, buffer_device=device)
    device_module(torch.device(device).type).synchronize()
    return model, time.perf_counter() - begin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--config", default="train_configs/qwen3_0.6b.toml")
    parser.add_argument("--reps", type=int, default=3)
    opts = parser.parse_args()
    run = load_run_or_exit(["--job.config_file", opts.config])
    spec, args, seed = run.spec, run.model_args, run.config.training.seed
    model, first = _init(spec, args, seed, opts.device)
    compile_s = draw.compile_seconds()
    times = [_init(spec, args, seed, opts.device)[1] for _ in range(opts.reps)]
    on_device = model_fingerprint(model)
    params = [p for p in model.parameters()]

    def fill_normal():
        with torch.no_grad():
            for p in params:
                p.normal_()
        device_module(torch.device(opts.device).type).synchronize()

    fill_normal()
    fills = []
    for _ in range(opts.reps):
        begin = time.perf_counter()
        fill_normal()
        fills.append(time.perf_counter() - begin)
    numel = sum(p.numel() for p in params)
    del model
    params.clear()  # free the device copy before the CPU one is built
    cpu_model, cpu_s = _init(spec, args, seed, "cpu")
    on_cpu = model_fingerprint(cpu_model)
    init_s, fill_s = sorted(times)[len(times) // 2], sorted(fills)[len(fills) // 2]
    print(
        f"{opts.config}: {numel:,} parameters; init on {opts.device}: {init_s:.3f} s (first call "
        f"{first:.2f} s, of which compile {compile_s:.2f} s), normal_ fill {fill_s:.3f} s, ratio "
        f"{init_s / fill_s:.2f}; on cpu {cpu_s:.2f} s"
    )
    print(
        f"fingerprint on {opts.device} {on_device}, on cpu {on_cpu}: "
        f"{'equal' if on_device == on_cpu else 'DIFFER'}"
    )
    return 0 if on_device == on_cpu else 1


if __name__ == "__main__":
    with reported_load():
        sys.exit(main())
