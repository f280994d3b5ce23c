"""The machine's load around a benchmark: the load average before and after it, with a warning when
it exceeds the CPU cores this process may use (other processes then take cores from the benchmark
and skew its timings and ratios)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def cpu_model() -> str:
    """``model name`` of /proc/cpuinfo (Linux x86), else ``unknown``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


def load_line(
    when: str, load: tuple[float, float, float] | None = None, n_cores: int | None = None
) -> str:
    """``load average before: 0.42 (1 min), 0.80 (5 min) on 2 cores``, plus a warning when the
    1-minute load exceeds the cores; ``load`` defaults to ``os.getloadavg()``, ``n_cores`` to
    :func:`cores`."""
    one, five, _ = os.getloadavg() if load is None else load
    n_cores = cores() if n_cores is None else n_cores
    line = f"load average {when}: {one:.2f} (1 min), {five:.2f} (5 min) on {n_cores} cores"
    if one > n_cores:
        line += (
            f"; warning: the load exceeds the {n_cores} cores: other processes compete with the "
            "benchmark, its timings and ratios are not reliable"
        )
    return line


@contextlib.contextmanager
def reported_load() -> Iterator[None]:
    """Print :func:`load_line` before and after the block."""
    print(load_line("before"), flush=True)
    try:
        yield
    finally:
        print(load_line("after"), flush=True)
