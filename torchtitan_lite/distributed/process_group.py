"""Process groups and the device mesh: :func:`init_distributed` starts the group, :func:`shutdown_distributed`
leaves it.

Note: on gloo and PREMUL_SUM. FSDP2's default gradient reduction divides by the world size with
``ReduceOp.AVG``, or ``ReduceOp.PREMUL_SUM(1/factor)`` for a custom divide factor; gloo (the CPU backend)
implements neither. The trainer avoids both: :func:`torchtitan_lite.distributed.fsdp.apply_fsdp` sets
``set_force_sum_reduction_for_comms(True)`` and ``set_gradient_divide_factor(1.0)`` on every FSDP module,
which makes FSDP2 reduce with a plain ``ReduceOp.SUM`` (the right reduction for our loss, see the note
in ``fsdp.py``). :func:`uses_gloo` tells callers which backend runs, for code that must differ.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from torchtitan_lite.distributed.devices import backend_for, device_module, device_type
from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.errors import LaunchError


@dataclass(frozen=True)
class DistInfo:
    """Where this process runs.

    Attributes:
        rank: global rank, ``0 <= rank < world_size``.
        world_size: number of processes in the job (all nodes).
        local_rank: rank on this node; also the device index.
        local_world_size: processes on this node.
        device: this process's device, e.g. ``cuda:3`` or ``cpu``.
        backend: the process group backend (``nccl``, ``hccl``, ``xccl``, ``gloo``).
        dims: the parallel layout and its device mesh (:class:`ParallelDims`, mesh built).
        cpu_group: a gloo group of all ranks for small host-side agreements (stop signals) that must not
            wait for the device; ``None`` when the default group is gloo already.
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
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _env_int(name: str, default: int) -> int:
    """Integer environment variable set by torchrun."""
    value = os.environ.get(name, str(default))
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"environment variable {name}={value!r} is not an integer; launch with torchrun") from None


def init_distributed(config: Any) -> DistInfo:
    """Pick the device, set CPU threads, start the process group and build the device mesh (:class:`ParallelDims`).

    Under torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` set) the
    group starts from the environment; without it, a 1-rank group on an in-memory store, so FSDP2 code
    paths are the same for one process.

    Args:
        config: a :class:`torchtitan_lite.config.JobConfig`; reads ``training.device``,
            ``training.num_threads`` (unset: cores // processes on this node),
            ``parallelism.data_parallel_shard_degree`` and ``parallelism.comm_timeout_seconds``.

    Raises:
        LaunchError: more processes on a node than devices, the requested device is unavailable, or
            ``data_parallel_shard_degree`` is not -1 or the world size. Nothing is started then.
    """
    kind = device_type(config.training.device)
    backend = backend_for(kind)
    launched = "RANK" in os.environ
    rank, world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank, local_world_size = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1)
    dims = ParallelDims(dp_shard=config.parallelism.data_parallel_shard_degree, world_size=world_size)
    if kind == "cpu":
        device = torch.device("cpu")
    else:
        count = device_module(kind).device_count()
        if local_rank >= count:
            raise LaunchError(f"local rank {local_rank} needs {kind} device {local_rank}, but this node has {count}; "
                               f"start at most {count} processes per node (NGPU={count})")
        device = torch.device(kind, local_rank)
        device_module(kind).set_device(device)
    torch.set_num_threads(config.training.num_threads or max(1, _cpu_cores() // local_world_size))
    timeout = timedelta(seconds=config.parallelism.comm_timeout_seconds)
    device_id = None if kind == "cpu" else device
    if launched:
        dist.init_process_group(backend, timeout=timeout, device_id=device_id)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout,
                                device_id=device_id)
    dims.build_mesh(kind)
    cpu_group = None if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    return DistInfo(rank, world_size, local_rank, local_world_size, device, backend, dims, cpu_group)


def uses_gloo(info: DistInfo) -> bool:
    """Whether collectives run on gloo (CPU), which lacks ``ReduceOp.AVG``/``PREMUL_SUM`` (see the note above)."""
    return info.backend == "gloo"


def shutdown_distributed(*, in_step: bool) -> None:
    """End this process's part in the process group: barrier (when ``in_step``), then destroy it.

    Note: on exiting together. A gloo rank that tears its group down while a peer is still inside a
    collective or still holds the group's worker threads can abort at interpreter exit ("terminate
    called without an active exception", SIGABRT), seen here with torch 2.13 on 2 CPU ranks. After a
    successful run every rank passes a barrier first, so all leave the last collective together. After
    an error (``in_step=False``) there is no barrier: the other ranks may never arrive.
    """
    if not dist.is_initialized():
        return
    if in_step:
        dist.barrier()
    dist.destroy_process_group()
