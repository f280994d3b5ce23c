"""Profile a window of training steps: torch.profiler traces and, where the device has one, a memory
snapshot.

Files in the run folder: ``profile/rank<r>_steps<a>-<b>.json``, a Chrome trace
(https://ui.perfetto.dev) with one ``ProfilerStep#<n>`` span per step;
``memory/rank<r>_steps<a>-<b>.pickle``, an allocator snapshot for https://pytorch.org/memory_viz, on
CUDA-like devices only (``memory._record_memory_history``; CPUs have none,
:attr:`StepProfiler.memory_note` says so).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from torchtitan_lite.distributed.devices import device_module

_MAX_MEMORY_EVENTS = 100_000
"""Allocation events kept by the memory history (the PyTorch memory-viz docs' example value)."""


def _memory_api(device_type: str):
    """The device module's ``memory`` submodule if it records allocation history, else ``None``."""
    if device_type == "cpu":
        return None
    memory = getattr(device_module(device_type), "memory", None)
    has_history = memory is not None and hasattr(memory, "_record_memory_history")
    return memory if has_history and hasattr(memory, "_dump_snapshot") else None


class StepProfiler:
    """Records steps ``start_step .. start_step + steps - 1`` of a run (1-based steps).

    ``with profiler.step(n): train_step(...)``; outside the window, or disabled, it does nothing.

    Args:
        run_folder: the run's folder; traces go to ``profile/``, snapshots to ``memory/``.
        enable: ``debug.profile``.
        start_step: first profiled step, >= 1.
        steps: number of profiled steps, >= 1.
        rank: this process's rank (file names).
        device: this process's device (``cpu``, ``cuda:0``, ...): CUDA-like devices add device
            activity and the memory snapshot.

    Raises:
        ValueError: ``start_step`` or ``steps`` < 1.
    """

    def __init__(
        self,
        run_folder: str | Path,
        *,
        enable: bool,
        start_step: int,
        steps: int,
        rank: int,
        device: torch.device,
    ):
        if start_step < 1 or steps < 1:
            raise ValueError(
                f"StepProfiler: debug.profile_start_step and debug.profile_steps must be >= 1, "
                f"got {start_step} and {steps}"
            )
        self.enable = enable
        self.first, self.last = start_step, start_step + steps - 1
        self.rank = rank
        self.device = torch.device(device)
        self.folder = Path(run_folder)
        self.memory = _memory_api(self.device.type) if enable else None
        self.memory_note = (
            f"memory snapshot: unsupported on {self.device.type} (no allocator history)"
            if enable and self.memory is None
            else ""
        )
        self.written: list[Path] = []
        self._profile: profile | None = None

    def _activities(self) -> list[ProfilerActivity]:
        kinds = [ProfilerActivity.CPU]
        device_activity = {"cuda": "CUDA", "xpu": "XPU"}.get(self.device.type)
        if device_activity is not None and hasattr(ProfilerActivity, device_activity):
            kinds.append(getattr(ProfilerActivity, device_activity))
        return kinds

    def _start(self) -> None:
        if self.memory is not None:
            self.memory._record_memory_history(max_entries=_MAX_MEMORY_EVENTS)
        self._profile = profile(
            activities=self._activities(), record_shapes=True, profile_memory=True
        )
        self._profile.start()

    def _stop(self) -> None:
        tag = f"rank{self.rank}_steps{self.first}-{self.last}"
        self._profile.stop()
        trace = self.folder / "profile" / f"{tag}.json"
        trace.parent.mkdir(parents=True, exist_ok=True)
        self._profile.export_chrome_trace(str(trace))
        self.written.append(trace)
        self._profile = None
        if self.memory is not None:
            snapshot = self.folder / "memory" / f"{tag}.pickle"
            snapshot.parent.mkdir(parents=True, exist_ok=True)
            self.memory._dump_snapshot(str(snapshot))
            self.memory._record_memory_history(enabled=None)
            self.written.append(snapshot)

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Profile training step ``step`` if it lies in the window (recording starts at the first
        step in it, e.g. mid-window after a resume); files are written after the window's last
        step."""
        if not self.enable or not self.first <= step <= self.last:
            yield
            return
        if self._profile is None:
            self._start()
        with record_function(f"ProfilerStep#{step}"):
            yield
        if step == self.last:
            self._stop()

    def close(self) -> None:
        """Write what was recorded if the run ended inside the window; file names keep the
        configured window."""
        if self._profile is not None:
            self._stop()
