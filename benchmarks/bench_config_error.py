"""Benchmark of a config error's cost (not a test): wall seconds from starting
``python -m torchtitan_lite.preflight`` with an unknown key, a value of the wrong type and a missing
config file to its one ``config error:`` line, against the same errors found after importing the
full checks (``preflight/checks.py``, which imports torch), the path every error took before
``preflight/__main__.py`` checked keys and types first.

Usage: ``python benchmarks/bench_config_error.py [--reps 5]`` from the repo root; the two are run
alternately.
"""

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import statistics
import subprocess
import sys
import time

from machine_load import reported_load

ERRORS = {
    "unknown key": ["--training.stepz=3"],
    "bad type": ["--training.steps=abc"],
    "missing file": ["--job.config_file=no_such.toml"],
}
FULL_CHECKS = (
    "import sys; from torchtitan_lite.preflight.checks import load_run_or_exit; "
    "load_run_or_exit(sys.argv[1:])"
)


def seconds(command: list[str]) -> float:
    """Wall seconds of ``command``, which must exit 2 (a config error)."""
    begin = time.perf_counter()
    status = subprocess.run(command, capture_output=True).returncode
    elapsed = time.perf_counter() - begin
    if status != 2:
        raise SystemExit(f"{command}: exit status {status}, expected 2 (a config error)")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    reps = parser.parse_args().reps
    with reported_load():
        for name, args in ERRORS.items():
            early, full = [], []
            for _ in range(reps):
                early.append(seconds([sys.executable, "-m", "torchtitan_lite.preflight", *args]))
                full.append(seconds([sys.executable, "-c", FULL_CHECKS, *args]))
            e, f = statistics.median(early), statistics.median(full)
            print(
                f"{name:13s} keys and types first {e:.2f} s, after the torch import {f:.2f} s: "
                f"{f / e:.1f}x faster (median of {reps})",
                flush=True,
            )


if __name__ == "__main__":
    main()
