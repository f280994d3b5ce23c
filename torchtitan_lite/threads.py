"""The launcher's thread environment for every process of ours: OpenMP threads per rank and idle
threads that sleep (docs/running.md, "A busy machine"; docs/design.md, "Note: threads of the
entry points"). Torch-free: it must run before torch loads its OpenMP runtime."""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

ENTRY_POINTS = (
    "torchtitan_lite.preflight",
    "torchtitan_lite.generate",
    "torchtitan_lite.evaluate",
    "torchtitan_lite.data.prepare",
    "torchtitan_lite.tools.inspect_init",
    "torchtitan_lite.tools.compare_runs",
    "torchtitan_lite.tools.simulate",
)
"""The ``python -m`` modules that get :func:`thread_env` for one rank from the package's import
(the launcher and the trainer's workers get it from ``launch``)."""


def thread_env(env: MutableMapping[str, str], ngpu: str) -> None:
    """Fill in what ``env`` leaves empty: ``OMP_NUM_THREADS`` = this machine's cores / ``ngpu`` (at
    least 1; torchrun would say 1) and ``OMP_WAIT_POLICY`` = ``PASSIVE``."""
    if not env.get("OMP_NUM_THREADS"):
        share = len(os.sched_getaffinity(0)) // int(ngpu) if ngpu.isdigit() and int(ngpu) else 1
        env["OMP_NUM_THREADS"] = str(max(share, 1))
    if not env.get("OMP_WAIT_POLICY"):
        env["OMP_WAIT_POLICY"] = "PASSIVE"


def entry_point(argv: list[str]) -> str | None:
    """The module of ``python [options] -m <module> ...`` (``sys.orig_argv``) when it is one of
    :data:`ENTRY_POINTS`; else ``None``."""
    if "-m" not in argv[1:-1]:
        return None
    module = argv[argv.index("-m") + 1]
    return module if module in ENTRY_POINTS else None


def apply_to_entry_point() -> None:
    """:func:`thread_env` into ``os.environ`` when this process is an entry point, for one rank or
    torchrun's ``LOCAL_WORLD_SIZE``; the package's ``__init__`` calls it, so it runs before the
    entry point imports torch."""
    if entry_point(sys.orig_argv):
        thread_env(os.environ, os.environ.get("LOCAL_WORLD_SIZE", "1"))
