"""Deterministic algorithms for a run (``debug.deterministic``)."""

from __future__ import annotations

import os

import torch


def enable_deterministic() -> str:
    """Turn on deterministic algorithms for the rest of the process; returns a line saying what was
    set.

    ``torch.use_deterministic_algorithms(True)`` (ops without a deterministic kernel raise), cuDNN
    autotuning off, and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (required by cuBLAS for deterministic
    matmuls, PyTorch "Reproducibility" notes). On CPU two runs with the same seed, world size and
    ``training.num_threads`` are then bitwise equal; a different thread count may change reduction
    order. Call before any device work.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    return (
        "deterministic algorithms on "
        f"(CUBLAS_WORKSPACE_CONFIG={os.environ['CUBLAS_WORKSPACE_CONFIG']}, "
        f"{torch.get_num_threads()} CPU threads)"
    )
