"""Devices: the device type a run uses, its collective backend and its device module, from torch's
public accelerator
API: ``torch.accelerator`` (which accelerator this process has, device count and index, peak
memory), ``torch.get_device_module`` (``torch.cuda``, ``torch.npu``, ``torch.xpu``:
``get_device_name`` and ``get_device_properties``, which ``torch.accelerator`` lacks in torch 2.13)
and ``torch.distributed.get_default_backend_for_device``. Ascend NPUs come through ``torch_npu``,
which registers ``npu`` as torch's accelerator when imported.
"""

from __future__ import annotations

import contextlib
import resource
import sys
from typing import Any

import torch
import torch.distributed as dist

from torchtitan_lite.errors import LaunchError

DEVICE_TYPES = ("cuda", "npu", "xpu", "cpu")
"""Device types a run may ask for (``training.device``; ``auto`` takes the accelerator torch
reports, else cpu)."""

_NPU_BACKEND = "hccl"
"""Ascend's collective backend: ``torch_npu`` registers it as npu's default when imported; named
here so that a configuration can be checked without ``torch_npu``."""


def _accelerator() -> str | None:
    """The type of torch's accelerator when one of its devices is available in this process, else
    ``None`` (``torch.accelerator.current_accelerator(check_available=True)``). ``torch_npu`` is
    imported first where it is installed (torch also loads it at start-up unless
    ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``)."""
    with contextlib.suppress(ImportError):
        import torch_npu  # noqa: F401
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    return None if accelerator is None else accelerator.type


def device_type(requested: str = "auto") -> str:
    """The device type to run on: ``requested``, or for ``auto`` torch's available accelerator
    (cuda, npu, xpu, ...), else cpu.

    Raises:
        ValueError: ``requested`` is not ``auto`` or one of :data:`DEVICE_TYPES`.
        LaunchError: ``requested`` names a device type that is not available here.
    """
    if requested != "auto" and requested not in DEVICE_TYPES:
        raise ValueError(
            f"training.device: unknown device type {requested!r}; "
            f"use auto or one of {', '.join(DEVICE_TYPES)}"
        )
    found = _accelerator() or "cpu"
    if requested == "auto":
        return found
    if requested not in ("cpu", found):
        raise LaunchError(
            f"training.device = {requested!r} but no {requested} device is available here; "
            'use training.device = "auto" (or "cpu")'
        )
    return requested


def backend_for(device_type: str) -> str:
    """The collective backend of a device type: torch's default for it
    (``torch.distributed.get_default_backend_for_device``: cuda nccl, xpu xccl, cpu gloo), npu hccl.

    Raises:
        ValueError: a device type outside :data:`DEVICE_TYPES`.
    """
    if device_type not in DEVICE_TYPES:
        raise ValueError(
            f"no process group backend for device type {device_type!r}; "
            f"known: {', '.join(DEVICE_TYPES)}"
        )
    return (
        _NPU_BACKEND if device_type == "npu" else dist.get_default_backend_for_device(device_type)
    )


class _CpuDeviceModule:
    """Stand-in for ``torch.cuda`` on CPU: ``max_memory_allocated`` is the peak RSS, the rest do
    nothing."""

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """No-op: CPU ops run synchronously."""

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
    """The device module of ``device_type`` (``torch.get_device_module``: ``torch.cuda``,
    ``torch.npu``, ``torch.xpu``), or a CPU stand-in.

    Raises:
        ValueError: a device type outside :data:`DEVICE_TYPES`.
    """
    backend_for(device_type)
    return _CPU_MODULE if device_type == "cpu" else torch.get_device_module(device_type)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process in bytes: the accelerator allocator's peak
    (``torch.accelerator``), or the peak RSS on CPU."""
    if device.type == "cpu":
        return _CPU_MODULE.max_memory_allocated(device)
    return int(torch.accelerator.max_memory_allocated(device))
