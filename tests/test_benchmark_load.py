"""benchmarks/machine_load.py: the load-average lines every benchmark prints before and after it
runs."""

import importlib.util
import os

from dist_helpers import REPO

spec = importlib.util.spec_from_file_location(
    "machine_load", REPO / "benchmarks" / "machine_load.py"
)
machine_load = importlib.util.module_from_spec(spec)
spec.loader.exec_module(machine_load)


def test_load_line_warns_only_when_the_load_exceeds_the_cores():
    assert machine_load.load_line("before", (1.5, 0.75, 0.1), 2) == (
        "load average before: 1.50 (1 min), 0.75 (5 min) on 2 cores"
    )
    busy = machine_load.load_line("after", (6.4, 3.0, 1.0), 2)
    assert busy.startswith(
        "load average after: 6.40 (1 min), 3.00 (5 min) on 2 cores; warning: the load exceeds the "
        "2 cores: other processes compete with the benchmark"
    )


def test_reported_load_prints_a_line_before_and_after_the_block(capsys):
    with machine_load.reported_load():
        print("benchmark table")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("load average before: ") and lines[1] == "benchmark table"
    assert (
        lines[2].startswith("load average after: ")
        and f"on {machine_load.cores()} cores" in lines[2]
    )
    assert machine_load.cores() <= (os.cpu_count() or 1)
