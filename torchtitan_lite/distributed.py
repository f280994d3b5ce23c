"""Devices, process groups and the device mesh: the one module that touches ``torch.cuda``/``npu``/``xpu``.

Everything else asks this module: :func:`device_type` finds the device at run time (cuda, then npu via
``torch_npu``, then xpu, else cpu), :func:`device_module` gives its ``torch.cuda``-like module,
:func:`init_distributed` starts the process group and the FSDP mesh, and :func:`peak_memory_bytes` /
:func:`peak_flops` feed the metrics.

Why a device module and not ``torch.accelerator`` (torch 2.13): ``torch.accelerator`` covers
``synchronize``, ``device_count`` and the memory counters, but not ``get_device_name`` (needed for the
peak-FLOPs table) and names ``set_device`` differently; ``torch.cuda``, ``torch.npu`` (torch_npu) and
``torch.xpu`` share one API for all five functions used here, so one code path serves every device.

Note: on gloo and PREMUL_SUM. FSDP2's default gradient reduction divides by the world size with
``ReduceOp.AVG``, or ``ReduceOp.PREMUL_SUM(1/factor)`` for a custom divide factor; gloo (the CPU backend)
implements neither. The trainer avoids both: :func:`torchtitan_lite.parallelize.apply_fsdp` sets
``set_force_sum_reduction_for_comms(True)`` and ``set_gradient_divide_factor(1.0)`` on every FSDP module,
which makes FSDP2 reduce with a plain ``ReduceOp.SUM`` (the right reduction for our loss, see the note
in ``parallelize.py``). :func:`uses_gloo` tells callers which backend runs, for code that must differ.
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

DEVICE_TYPES = ("cuda", "npu", "xpu", "cpu")
"""Device types in the order ``auto`` tries them."""

_BACKENDS = {"cuda": "nccl", "npu": "hccl", "xpu": "xccl", "cpu": "gloo"}

# Dense (no 2:4 sparsity) peak throughput of one device: (substrings its name must contain, BF16/FP16 FLOP/s,
# FP32 FLOP/s or None where unpublished, source). The tensor-core BF16 and FP16 peaks are equal on every
# row; FP32 is the non-tensor (CUDA core / vector) peak, TF32 being off by default in PyTorch. First match
# wins, so variants come before their family. FP8 is left out: the trainer computes in bf16 or fp32.
_PEAK_FLOPS: tuple[tuple[tuple[str, ...], float, float | None, str], ...] = (
    (("H100", "NVL"), 835.5e12, 60e12, "NVIDIA H100 datasheet, H100 NVL: BF16 1671 TFLOPS with sparsity / 2, FP32 60"),
    (("H100", "PCIe"), 756e12, 51e12, "NVIDIA H100 datasheet, H100 PCIe: BF16 1513 TFLOPS with sparsity / 2, FP32 51"),
    (("H100",), 989e12, 67e12, "NVIDIA H100 datasheet, H100 SXM: BF16 1979 TFLOPS with sparsity / 2, FP32 67"),
    (("H200", "NVL"), 835.5e12, 60e12, "NVIDIA H200 datasheet, H200 NVL: BF16 1671 TFLOPS with sparsity / 2, FP32 60"),
    (("H200",), 989e12, 67e12, "NVIDIA H200 datasheet, H200 SXM: BF16 1979 TFLOPS with sparsity / 2, FP32 67 "
                               "(GH200 has the same GPU peaks)"),
    (("B200",), 2250e12, 75e12, "NVIDIA Blackwell datasheet, HGX B200 (1000 W): FP16/BF16 4.5 PFLOPS with "
                                "sparsity / 2, FP32 75 TFLOPS"),
    (("A100",), 312e12, 19.5e12, "NVIDIA A100 datasheet (SXM and PCIe): BF16 tensor 312 TFLOPS dense, FP32 19.5"),
    (("MI300X",), 1307.4e12, 163.4e12, "AMD Instinct MI300X datasheet: BF16 1307.4 TFLOPS dense, FP32 163.4"),
    (("910B2",), 376e12, None, "Ascend 910B2 (also 910B2C): 376 TFLOPS FP16 as commonly quoted; Huawei publishes "
                               "no per-chip datasheet figure, so MFU on NPU is approximate; other 910B "
                               "variants (B1, B3, B4) differ and are n/a"),
)


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
        mesh: 1-D :class:`DeviceMesh` of all ranks, dimension name ``dp_shard`` (FSDP2 sharding).
        cpu_group: a gloo group of all ranks for small host-side agreements (stop signals) that must not
            wait for the device; ``None`` when the default group is gloo already.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str
    mesh: DeviceMesh
    cpu_group: dist.ProcessGroup | None = None


def _npu_available() -> bool:
    """Ascend NPU present: ``torch_npu`` imports (it registers ``torch.npu``) and reports a device."""
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        return False
    return hasattr(torch, "npu") and torch.npu.is_available()


def _available(kind: str) -> bool:
    """Whether a device of type ``kind`` is usable in this process."""
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "npu":
        return _npu_available()
    if kind == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    return True


def device_type(requested: str = "auto") -> str:
    """The device type to run on: ``requested``, or for ``auto`` the first available of cuda, npu, xpu, cpu.

    Raises:
        ValueError: ``requested`` is not ``auto`` or one of :data:`DEVICE_TYPES`.
        RuntimeError: ``requested`` names a device type that is not available here.
    """
    if requested == "auto":
        return next(kind for kind in DEVICE_TYPES if _available(kind))
    if requested not in DEVICE_TYPES:
        raise ValueError(f"training.device: unknown device type {requested!r}; "
                         f"use auto or one of {', '.join(DEVICE_TYPES)}")
    if not _available(requested):
        raise RuntimeError(f"training.device = {requested!r} but no {requested} device is available here; "
                           "use training.device = \"auto\" (or \"cpu\")")
    return requested


def backend_for(device_type: str) -> str:
    """The collective backend of a device type: cuda nccl, npu hccl, xpu xccl, cpu gloo.

    Raises:
        ValueError: an unknown device type.
    """
    if device_type not in _BACKENDS:
        raise ValueError(f"no process group backend for device type {device_type!r}; known: {', '.join(_BACKENDS)}")
    return _BACKENDS[device_type]


class _CpuDeviceModule:
    """Stand-in for ``torch.cuda`` on CPU: the functions the trainer calls.

    ``max_memory_allocated`` is the process's peak resident set size in bytes (which
    ``reset_peak_memory_stats`` cannot reset); the others do nothing.
    """

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """Nothing to wait for: CPU ops run synchronously."""

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        """Peak RSS of this process, bytes (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        """No-op: the OS keeps the peak RSS for the life of the process."""

    @staticmethod
    def set_device(device: Any) -> None:
        """No-op: there is one CPU device."""

    @staticmethod
    def device_count() -> int:
        """One CPU device."""
        return 1


_CPU_MODULE = _CpuDeviceModule()


def device_module(device_type: str) -> Any:
    """The ``torch.cuda``-like module of ``device_type`` (``torch.cuda``, ``torch.npu``, ``torch.xpu``), or
    a CPU stand-in with ``synchronize``, ``max_memory_allocated``, ``reset_peak_memory_stats``,
    ``set_device`` and ``device_count``.

    Raises:
        ValueError: an unknown device type.
    """
    backend_for(device_type)
    return _CPU_MODULE if device_type == "cpu" else getattr(torch, device_type)


def _cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _env_int(name: str, default: int) -> int:
    """Integer environment variable set by torchrun."""
    value = os.environ.get(name, str(default))
    try:
        return int(value)
    except ValueError:
        raise RuntimeError(f"environment variable {name}={value!r} is not an integer; launch with torchrun") from None


def init_distributed(config: Any) -> DistInfo:
    """Pick the device, set CPU threads, start the process group and build the ``dp_shard`` mesh.

    Under torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` set) the
    group starts from the environment; without it, a 1-rank group on an in-memory store, so FSDP2 code
    paths are the same for one process.

    Args:
        config: a :class:`torchtitan_lite.config.JobConfig`; reads ``training.device``,
            ``training.num_threads`` (unset: cores // processes on this node),
            ``parallelism.data_parallel_shard_degree`` and ``parallelism.comm_timeout_seconds``.

    Raises:
        RuntimeError: more processes on a node than devices, the requested device is unavailable, or
            ``data_parallel_shard_degree`` is not -1 or the world size. Nothing is started then.
    """
    kind = device_type(config.training.device)
    backend = backend_for(kind)
    launched = "RANK" in os.environ
    rank, world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank, local_world_size = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1)
    dp = config.parallelism.data_parallel_shard_degree
    dp = world_size if dp == -1 else dp
    if dp != world_size:
        raise RuntimeError(f"parallelism.data_parallel_shard_degree = {dp} but the world size is {world_size}; "
                           "FSDP over all ranks is the only layout: set it to -1")
    if kind == "cpu":
        device = torch.device("cpu")
    else:
        count = device_module(kind).device_count()
        if local_rank >= count:
            raise RuntimeError(f"local rank {local_rank} needs {kind} device {local_rank}, but this node has {count}; "
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
    mesh = init_device_mesh(kind, (dp,), mesh_dim_names=("dp_shard",))
    cpu_group = None if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    return DistInfo(rank, world_size, local_rank, local_world_size, device, backend, mesh, cpu_group)


def uses_gloo(info: DistInfo) -> bool:
    """Whether collectives run on gloo (CPU), which lacks ``ReduceOp.AVG``/``PREMUL_SUM`` (see the note above)."""
    return info.backend == "gloo"


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process in bytes: the device allocator's peak, or the peak RSS on CPU."""
    return int(device_module(device.type).max_memory_allocated(device))


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Dense peak FLOP/s of one ``device`` computing in ``dtype``, for MFU; ``None`` = unknown ("n/a").

    ``bfloat16``/``float16`` use the tensor-core (cube) peak, ``float32`` the non-tensor FP32 peak (TF32
    is off by default in PyTorch). The device's name (``get_device_name``) is looked up in the table
    ``_PEAK_FLOPS`` of this module (one datasheet per row: H100 SXM/PCIe/NVL, H200 SXM/NVL, B200, A100,
    MI300X, Ascend 910B2). ``None`` for CPU, for devices not in the table, for a dtype the table has no
    figure for (fp32 on NPU), and for other dtypes (fp64, fp8), so MFU shows "n/a" rather than a wrong number.
    """
    if device.type == "cpu":
        return None
    name = device_module(device.type).get_device_name(device)
    for parts, half, single, _source in _PEAK_FLOPS:
        if all(part in name for part in parts):
            if dtype in (torch.bfloat16, torch.float16):
                return half
            return single if dtype == torch.float32 else None
    return None


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
