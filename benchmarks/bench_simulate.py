"""Wall time and result of ``python -m torchtitan_lite.tools.simulate`` per row: each row's command
run in a fresh process, its last line and seconds printed as a table, with the machine and the
load average before and after (docs/benchmarks.md, "Simulating a step").

    python benchmarks/bench_simulate.py [--rows NAME ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from machine_load import cpu_model, reported_load

REPO = Path(__file__).resolve().parents[1]

ROWS = {
    "qwen3 debug, dp_shard 2 (cpu)": [
        "--device=cpu",
        "--world-size=2",
        "--job.config_file=train_configs/qwen3_debug.toml",
    ],
    "qwen3 8b, dp_shard 8, AC full": [
        "--world-size=8",
        "--job.config_file=train_configs/qwen3_0.6b.toml",
        "--model.flavor=8b",
    ],
}
"""Row name -> the tool's arguments (``python -m torchtitan_lite.tools.simulate ARGS``)."""


def run_row(args: list[str]) -> tuple[float, str]:
    """``(wall seconds, last line)`` of the tool on ``args`` (one thread, as one rank of a CPU)."""
    begin = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "torchtitan_lite.tools.simulate", *args],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - begin
    lines = (proc.stdout if proc.returncode == 0 else proc.stderr).strip().splitlines()
    return seconds, lines[-1] if lines else f"exit {proc.returncode}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    rows = parser.parse_args().rows
    print(f"machine: {cpu_model()}")
    with reported_load():
        print("| row | command | wall s | last line |\n|---|---|---|---|")
        for name in rows:
            seconds, last = run_row(ROWS[name])
            command = "python -m torchtitan_lite.tools.simulate " + " ".join(ROWS[name])
            print(f"| {name} | `{command}` | {seconds:.0f} | {last} |", flush=True)


if __name__ == "__main__":
    main()
