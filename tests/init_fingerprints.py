"""The init fingerprint of every debug config on one CPU process, as
``python tests/init_fingerprints.py`` prints it (one ``config fingerprint seconds`` line each): the
subject of test_init_golden.py, run in a subprocess there so that ``ATEN_CPU_CAPABILITY`` selects
torch's CPU kernels."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.init.fingerprint import model_fingerprint
from torchtitan_lite.preflight.checks import load_run_or_exit

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.name for p in (REPO / "train_configs").glob("*_debug.toml"))
"""Every debug config in train_configs/."""


def fingerprint(config_name: str) -> tuple[str, float]:
    """``(fingerprint, init seconds)`` of ``train_configs/config_name`` on one CPU process, its own
    seed."""
    run = load_run_or_exit(["--job.config_file", str(REPO / "train_configs" / config_name)])
    config, spec, args = run.config, run.spec, run.model_args
    with torch.device("meta"):
        model = spec.model_cls(args)
    begin = time.perf_counter()
    materialize(model, "cpu")
    init_weights(model, spec.init_plan(args), config.training.seed, buffer_device="cpu")
    seconds = time.perf_counter() - begin
    return model_fingerprint(model), seconds


if __name__ == "__main__":
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    for name in CONFIGS:
        value, seconds = fingerprint(name)
        print(name, value, f"{seconds:.3f}")
