"""Devices: the one module that touches ``torch.cuda``/``npu``/``xpu`` (cuda, then npu via ``torch_npu``, then
xpu, else cpu). ``torch.cuda``, ``torch.npu`` and ``torch.xpu`` share the five functions used here, including
``get_device_name``, which ``torch.accelerator`` (torch 2.13) lacks.
"""

from __future__ import annotations

import resource
import sys
from typing import Any

import torch

from torchtitan_lite.errors import LaunchError

DEVICE_TYPES = ("cuda", "npu", "xpu", "cpu")
"""Device types in the order ``auto`` tries them."""

_BACKENDS = {"cuda": "nccl", "npu": "hccl", "xpu": "xccl", "cpu": "gloo"}


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
        LaunchError: ``requested`` names a device type that is not available here.
    """
    if requested == "auto":
        return next(kind for kind in DEVICE_TYPES if _available(kind))
    if requested not in DEVICE_TYPES:
        raise ValueError(f"training.device: unknown device type {requested!r}; "
                         f"use auto or one of {', '.join(DEVICE_TYPES)}")
    if not _available(requested):
        raise LaunchError(f"training.device = {requested!r} but no {requested} device is available here; "
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
    """Stand-in for ``torch.cuda`` on CPU: ``max_memory_allocated`` is the peak RSS, the rest do nothing."""

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
    """The ``torch.cuda``-like module of ``device_type`` (``torch.cuda``, ``torch.npu``, ``torch.xpu``), or a CPU
    stand-in.

    Raises:
        ValueError: an unknown device type.
    """
    backend_for(device_type)
    return _CPU_MODULE if device_type == "cpu" else getattr(torch, device_type)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process in bytes: the device allocator's peak, or the peak RSS on CPU."""
    return int(device_module(device.type).max_memory_allocated(device))

