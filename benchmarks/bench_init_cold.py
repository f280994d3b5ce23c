"""Benchmark (not a test): a config's init phase on a fresh machine and on a warm one, against a
``normal_`` fill.

Runs the init phase of ``inspect_init`` and the trainer (build on meta, ``materialize`` on the CPU,
``init_weights``) in a child process twice with a new empty ``HOME``, ``TMPDIR`` and
``TORCHINDUCTOR_CACHE_DIR`` (the first run: cold, nothing built; the second: warm, the same
folders), then fills the same tensors with ``normal_`` in this process, on the same thread count.
The CPU, its kernel ISA and the load are printed with the numbers.

Usage: ``python benchmarks/bench_init_cold.py [--config train_configs/qwen3_0.6b.toml] [--threads
2]`` from the repo root. Targets (issue 42, Qwen3 0.6B at 2 threads): cold <= 2.0x the fill, warm <=
1.2x.
"""

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch
from bench_init import cpu_line
from machine_load import reported_load

from torchtitan_lite.builder import build_meta_model, init_model
from torchtitan_lite.init import draw
from torchtitan_lite.init.apply import materialize
from torchtitan_lite.preflight.checks import load_run_or_exit


def child(config_file: str) -> None:
    """Print the init phase's seconds and the kernels' build seconds (the child's output)."""
    run = load_run_or_exit(["--job.config_file", config_file])
    model = build_meta_model(run)
    begin = time.perf_counter()
    materialize(model, "cpu")
    init_model(model, run, "cpu")
    print(f"child init {time.perf_counter() - begin:.3f} build {draw.compile_seconds():.3f}")


def run_child(config_file: str, threads: int, folder: str) -> tuple[float, float]:
    """``(init seconds, build seconds)`` of a child process with ``folder`` as HOME, TMPDIR and
    caches."""
    env = dict(
        os.environ,
        HOME=folder,
        TMPDIR=folder,
        TORCHINDUCTOR_CACHE_DIR=os.path.join(folder, "inductor"),
        OMP_NUM_THREADS=str(threads),
    )
    env.pop("TORCHTITAN_LITE_KERNEL_CACHE", None)
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--config", config_file, "--threads", str(threads)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    words = next(line for line in out.splitlines() if line.startswith("child init ")).split()
    return float(words[2]), float(words[4])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="train_configs/qwen3_0.6b.toml")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        child(args.config)
        return
    print(
        f"command: python benchmarks/bench_init_cold.py --config {args.config} --threads "
        f"{args.threads}"
    )
    print(cpu_line())
    with tempfile.TemporaryDirectory() as folder:
        cold, cold_build = run_child(args.config, args.threads, folder)
        warm, warm_build = run_child(args.config, args.threads, folder)
    model = materialize(
        build_meta_model(load_run_or_exit(["--job.config_file", args.config])), "cpu"
    )
    params = list(model.parameters())
    fills = []
    for _ in range(3):
        begin = time.perf_counter()
        with torch.no_grad():
            for p in params:
                p.normal_()
        fills.append(time.perf_counter() - begin)
    fill = sorted(fills)[1]
    numel = sum(p.numel() for p in params)
    print(
        f"{args.config}: {numel:,} parameters, {args.threads} thread(s); normal_ fill {fill:.2f} s "
        "(median of 3)"
    )
    for label, seconds, build in (("fresh machine", cold, cold_build), ("warm", warm, warm_build)):
        print(
            f"init phase, {label}: {seconds:.2f} s = {seconds / fill:.2f}x the fill (kernels built "
            f"in {build:.2f} s)"
        )


if __name__ == "__main__":
    with reported_load():
        main()
