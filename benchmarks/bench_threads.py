"""Benchmark (not a test): wall time of ``./run_train.sh`` on an idle and a busy CPU, by thread
count and OpenMP wait policy: ``passive`` (run_train.sh's default) or ``spin`` (libgomp's own
default, 300,000 spins before a waiting thread sleeps: run_train.sh before it set
``OMP_WAIT_POLICY``).

``busy`` starts one outside process that holds a core (``yes > /dev/null``) beside the run. Each
case is one run in a fresh dump folder; it prints the wall time, the init line's seconds, the
fingerprint and the last loss (neither may depend on the wait policy).

    python benchmarks/bench_threads.py                  # 5 steps of train_configs/qwen3_debug.toml
    python benchmarks/bench_threads.py --steps 3 --cases idle:2:spin idle:2:passive idle:1:passive
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

from machine_load import cpu_model, reported_load

REPO = Path(__file__).resolve().parents[1]
CASES = [
    "idle:2:spin",
    "idle:2:passive",
    "idle:1:passive",
    "busy:2:spin",
    "busy:2:passive",
    "busy:1:passive",
]
"""load:threads:wait policy."""


def run(
    load: str, threads: str, policy: str, steps: int, dump: Path
) -> tuple[float, str, str, str]:
    """(wall seconds, the init line's seconds, the fingerprint, the last loss) of one run."""
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": threads,
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    if policy == "spin":  # GOMP_SPINCOUNT overrides the policy's spin count (libgomp's env.c)
        env["GOMP_SPINCOUNT"] = "300000"
    busy = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) if load == "busy" else None
    try:
        begin = time.monotonic()
        proc = subprocess.run(
            [
                "./run_train.sh",
                f"--training.steps={steps}",
                f"--training.num_threads={threads}",
                f"--job.dump_folder={dump}",
                "--checkpoint.enable=false",
                "--metrics.log_freq=1",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        wall = time.monotonic() - begin
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    out = proc.stdout + proc.stderr
    init = re.search(r"init \(([\d.]+) s\).*fingerprint (\w+)", out)
    losses = re.findall(r"step +\d+ +loss +([\d.]+)", out)
    return wall, *(init.groups() if init else ("?", "?")), losses[-1] if losses else "?"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--cases", nargs="+", default=CASES, help="load:threads:spin|passive")
    args = parser.parse_args()
    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores; {args.steps} steps of qwen3_debug.toml")
    print(f"{'load':<5} {'threads':>7} {'wait':>8} {'wall s':>7} {'init s':>7}  fingerprint  loss")
    with reported_load(), tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(args.cases):
            load, threads, policy = case.split(":")
            wall, init, fp, loss = run(load, threads, policy, args.steps, Path(tmp) / str(i))
            row = f"{load:<5} {threads:>7} {policy:>8} {wall:>7.1f} {init:>7}  {fp}  {loss}"
            print(row, flush=True)


if __name__ == "__main__":
    main()
