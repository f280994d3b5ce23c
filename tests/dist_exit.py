"""How a multi-rank test worker ends: together, and without the interpreter's teardown."""

from __future__ import annotations

import os
import sys

import torch.distributed as dist


def leave_together() -> None:
    """Barrier, destroy the process group, flush, then ``os._exit(0)``.

    The barrier is the trainer's own fix (see "Note: on exiting together" in ``torchtitan_lite.distributed``).
    ``os._exit`` skips the interpreter's teardown, where torch 2.13 on gloo still aborted once in a CI run
    ("terminate called without an active exception", SIGABRT) after a worker had printed all its results:
    a crash of torch's thread cleanup at exit, which says nothing about what the test checks.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
