"""``torch.compile`` per block, with a probed fallback to eager when the backend cannot run here."""

from __future__ import annotations

import functools
import shutil
import sys

import torch
from torch import nn

from torchtitan_lite.distributed.fsdp import _layers


def apply_compile(model: nn.Module, *, backend: str = "inductor") -> nn.Module:
    """``torch.compile`` each block of ``model.layers`` in place (``nn.Module.compile``).

    One graph serves all identical blocks (torchtitan's choice); ``nn.Module.compile`` keeps
    parameter names and state-dict keys (no ``_orig_mod.`` prefix).

    Args:
        backend: ``torch.compile`` backend, e.g. ``"inductor"``, ``"eager"``.

    Raises:
        TypeError: ``model.layers`` is not an ``nn.ModuleDict``.
    """
    for block in _layers(model).values():
        block.compile(backend=backend)
    return model


def _inductor_cpu_compilers() -> list[str]:
    """The C++ compilers inductor tries on CPU, in order (``torch._inductor.config.cpp.cxx``,
    ``None`` skipped)."""
    from torch._inductor import config as inductor_config

    cxx = inductor_config.cpp.cxx
    return [c for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c is not None]


def _probe(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + 1


def compile_fallback_reason(backend: str, device_type: str) -> str | None:
    """Why ``torch.compile(backend=backend)`` cannot run on ``device_type`` in this process, or
    ``None``.

    Inductor on CPU needs a C++ compiler (``torch._inductor.config.cpp.cxx`` on ``PATH``); then a
    two-op probe is compiled with ``backend`` (``fullgraph=True``) and run on ``device_type``: any
    exception (no triton, a broken toolchain) is the reason. The probe costs one compile.

    Returns:
        One line naming the cause and the fix, or ``None`` when compile works.
    """
    avoid = "set --compile.enable=false (or --compile.backend=aot_eager) to silence this"
    if backend == "inductor" and device_type == "cpu":
        compilers = _inductor_cpu_compilers()
        if not any(shutil.which(c) for c in compilers):
            return (
                f"inductor compiles C++ on CPU and found none of {compilers} on PATH; install g++ "
                f"or set CXX to a C++ compiler, or {avoid}"
            )
    try:
        torch.compile(_probe, backend=backend, fullgraph=True)(torch.ones(4, device=device_type))
    except Exception as err:  # noqa: BLE001 - any failure of the backend means: run eager
        while (inner := getattr(err, "inner_exception", None) or err.__cause__) is not None:
            # dynamo wraps the backend's own error (BackendCompilerFailed.inner_exception)
            err = inner
        detail = (str(err).strip().splitlines() or [""])[0]
        return (
            f"torch.compile(backend={backend!r}) failed on a probe: {type(err).__name__}: "
            f"{detail}; fix the backend's toolchain, or {avoid}"
        )
    return None


@functools.cache
def compile_available(backend: str, device_type: str) -> bool:
    """Whether to compile with ``backend`` on ``device_type``; when not, print ONE warning line.

    Cached per ``(backend, device_type)``; the line, on stderr, is
    ``warning: torch.compile disabled, running eager: <reason>`` (:func:`compile_fallback_reason`).
    """
    reason = compile_fallback_reason(backend, device_type)
    if reason is not None:
        print(
            f"warning: torch.compile disabled, running eager: {reason}", file=sys.stderr, flush=True
        )
    return reason is None


def compiles(
    enable: bool, components: list[str], backend: str, device_type: str, component: str
) -> bool:
    """Whether ``component`` (``"model"`` or ``"loss"``) is compiled: ``compile.enable``, listed in
    ``compile.components``, and ``backend`` works on ``device_type`` (:func:`compile_available`)."""
    return enable and component in components and compile_available(backend, device_type)
