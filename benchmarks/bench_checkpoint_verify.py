"""Benchmark of checkpoint verification (not a test): seconds per GiB of
:func:`torchtitan_lite.components.checkpoint.integrity.file_digest` (XXH3-128 over 8 MiB reads), the
cost that ``Checkpointer.finish`` adds to a save (the files just written, in the page cache) and
that loading adds per rank (each rank reads its share of the files; cold when the checkpoint is not
in the page cache). Side by side: ``hashlib.blake2b`` over the same reads, and a plain read, which
bounds any checksum on a cold file.

Usage: ``python benchmarks/bench_checkpoint_verify.py [--gib 1] [--reps 3] [--folder /tmp]`` from
the repo root. "Cold" evicts the file's pages with ``posix_fadvise(DONTNEED)`` before each read
(this file only).
"""

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import hashlib
import os
import statistics
import tempfile
import time

from torchtitan_lite.components.checkpoint.integrity import file_digest

CHUNK = 8 << 20


def read_only(path: str) -> None:
    buffer = bytearray(CHUNK)
    with open(path, "rb", buffering=0) as handle:
        while handle.readinto(buffer):
            pass


def blake2b(path: str) -> None:
    file_digest(path, hashlib.blake2b)


def evict(path: str) -> None:
    with open(path, "rb") as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def seconds(fn, path: str, reps: int, cold: bool) -> float:
    times = []
    for _ in range(reps):
        if cold:
            evict(path)
        else:
            read_only(path)
        start = time.perf_counter()
        fn(path)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the test file in GiB")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--folder", default=tempfile.gettempdir(), help="where to write the test file"
    )
    opts = parser.parse_args()
    size = int(opts.gib * 2**30)
    with tempfile.NamedTemporaryFile(dir=opts.folder, suffix=".distcp") as handle:
        block = os.urandom(CHUNK)
        for _ in range(size // CHUNK):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())
        gib = size / 2**30
        print(f"file {handle.name}: {gib:.2f} GiB, median of {opts.reps}")
        for cache in ("warm", "cold"):
            read = seconds(read_only, handle.name, opts.reps, cache == "cold") / gib
            xxh = seconds(file_digest, handle.name, opts.reps, cache == "cold") / gib
            blake = seconds(blake2b, handle.name, opts.reps, cache == "cold") / gib
            print(
                f"{cache:>4} page cache: read {read:.3f} s/GiB, xxh3_128 {xxh:.3f} s/GiB "
                f"({xxh / read:.2f}x read), blake2b {blake:.3f} s/GiB ({blake / xxh:.1f}x xxh3_128)"
            )


if __name__ == "__main__":
    main()
