"""Benchmark (not a test): the wall time of ``python -m torchtitan_lite.data.prepare`` (the whole
command: imports, spawned workers' start-up, encoding, writing) for inputs of several sizes and
worker counts, against the default the command chooses (``prepare.default_workers``), to see where
encoding workers start to pay for their start-up.

The text is ``bench_data.write_text``'s (JSON lines of documents of sentences drawn from the bundled
plays, seed 0). Each case runs ``--repeats`` times (the median is printed) in the order given, so a
change of the machine's load affects neighbours alike; the load average is printed before and after.

    python benchmarks/bench_prepare_workers.py                         # 1, 16, 32 MiB; 0, 2 workers
    python benchmarks/bench_prepare_workers.py --mib 1 --workers 0 2 8  # issue 36's 1 MB comparison
"""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_data import write_text  # noqa: E402
from benchmarks.machine_load import cores, reported_load  # noqa: E402


def prepare_seconds(text: Path, out: Path, workers: int | None) -> float:
    """Wall seconds of one prepare of ``text`` into ``out`` with ``workers`` (``None``: the
    default)."""
    argv = [
        sys.executable,
        "-m",
        "torchtitan_lite.data.prepare",
        "--input",
        str(text),
        "--output",
        str(out),
    ]
    argv += [] if workers is None else ["--workers", str(workers)]
    begin = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, cwd=REPO)
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mib", type=float, nargs="+", default=[1, 16, 32], help="input sizes, MiB of JSON lines"
    )
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[0, 2], help="worker counts to compare"
    )
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    from torchtitan_lite.data.prepare import default_workers

    with tempfile.TemporaryDirectory() as tmp, reported_load():
        tmp = Path(tmp)
        for mib in args.mib:
            text = tmp / f"text{mib:g}.jsonl"
            write_text(text, mib)
            size = text.stat().st_size
            chosen = default_workers(size, cores())
            times = {}
            for workers in args.workers:
                runs = [
                    prepare_seconds(text, tmp / f"out{mib:g}-{workers}-{r}", workers)
                    for r in range(args.repeats)
                ]
                times[workers] = statistics.median(runs)
            fastest = min(times, key=times.get)
            cells = "  ".join(
                f"{w} workers {t:6.1f} s ({t / times[fastest]:.2f}x)" for w, t in times.items()
            )
            print(
                f"{size / 2**20:5.1f} MiB on {cores()} cores: {cells}; fastest {fastest}, default "
                f"{chosen}",
                flush=True,
            )


if __name__ == "__main__":
    main()
