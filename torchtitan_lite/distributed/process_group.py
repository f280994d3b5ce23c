"""Process groups and the device mesh: :func:`init_distributed` starts the group,
:func:`shutdown_distributed` leaves it. Gloo (CPU) has no ``ReduceOp.AVG``/``PREMUL_SUM``: see the
note on gradient reduction semantics in :mod:`torchtitan_lite.distributed.fsdp`; :func:`uses_gloo`
tells code that must differ.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from torchtitan_lite.distributed.devices import backend_for, device_type
from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.errors import LaunchError


@dataclass(frozen=True)
class DistInfo:
    """Where this process runs.

    Attributes:
        rank, world_size: global rank and number of processes; ``local_rank`` (also the device
        index) and
            ``local_world_size`` on this node.
        backend: ``nccl``, ``hccl``, ``xccl`` or ``gloo``.
        dims: the parallel layout, its mesh built.
        cpu_group: a gloo group of all ranks for host-side agreements (stop signals); ``None`` when
            the default group is gloo.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str
    dims: ParallelDims
    cpu_group: dist.ProcessGroup | None = None


def _cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


def _env_int(name: str, default: int) -> int:
    """Integer environment variable set by torchrun."""
    value = os.environ.get(name, str(default))
    try:
        return int(value)
    except ValueError:
        raise LaunchError(
            f"environment variable {name}={value!r} is not an integer; launch with torchrun"
        ) from None


def init_distributed(config: Any) -> DistInfo:
    """Pick the device, set CPU threads, start the process group and build the device mesh
    (:class:`ParallelDims`).

    Under torchrun the group starts from the environment; without it, a 1-rank group on an in-memory
    store (the same FSDP2 code paths). Reads ``training.device``, ``training.num_threads`` (unset:
    cores // processes on this node; 1 on CPU with ``training.deterministic = "layout"``), the
    degrees of ``[parallelism]`` and ``comm_timeout_seconds``.

    Raises:
        LaunchError: more processes on a node than devices, the requested device is unavailable, or
            parallel degrees whose product is not the world size. Nothing is started then.
    """
    kind = device_type(config.training.device)
    backend = backend_for(kind)
    launched = "RANK" in os.environ
    rank, world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank, local_world_size = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1)
    dims = ParallelDims.from_config(config.parallelism, world_size)
    if kind == "cpu":
        device = torch.device("cpu")
    else:
        count = torch.accelerator.device_count()
        if local_rank >= count:
            raise LaunchError(
                f"local rank {local_rank} needs {kind} device {local_rank}, but this node has "
                f"{count}; start at most {count} processes per node (NGPU={count})"
            )
        device = torch.device(kind, local_rank)
        torch.accelerator.set_device_index(local_rank)
    threads = config.training.num_threads
    if (
        threads is None
    ):  # a CPU matmul's rounding may depend on its thread count: "layout" fixes it at 1
        layout = kind == "cpu" and config.training.deterministic == "layout"
        threads = 1 if layout else max(1, _cpu_cores() // local_world_size)
    torch.set_num_threads(threads)
    timeout = timedelta(seconds=config.parallelism.comm_timeout_seconds)
    device_id = None if kind == "cpu" else device
    if launched:
        dist.init_process_group(backend, timeout=timeout, device_id=device_id)
    else:
        dist.init_process_group(
            backend,
            store=dist.HashStore(),
            rank=0,
            world_size=1,
            timeout=timeout,
            device_id=device_id,
        )
    dims.build_mesh(kind)
    cpu_group = None if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    return DistInfo(
        rank, world_size, local_rank, local_world_size, device, backend, dims, cpu_group
    )


def uses_gloo(info: DistInfo) -> bool:
    """Whether collectives run on gloo (CPU), which lacks ``ReduceOp.AVG``/``PREMUL_SUM`` (see the
    note above)."""
    return info.backend == "gloo"


def shutdown_distributed(*, in_step: bool) -> None:
    """End this process's part in the process group: barrier (when ``in_step``, so that every rank
    leaves the last collective together; see ``docs/design.md``, "Distributed: exiting together"),
    then destroy it. After an error (``in_step=False``) there is no barrier: the other ranks may
    never arrive."""
    if not dist.is_initialized():
        return
    if in_step:
        dist.barrier()
    dist.destroy_process_group()
