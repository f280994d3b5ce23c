"""The init engine: init plans as data (``spec.py``), keyed sampling (``sampling.py``), applying a
plan (``apply.py``), the init report (``report.py``), the fingerprint (``fingerprint.py``) and the
expected step-1 loss (``step1.py``).

Public: :func:`trunc_normal_` (the exact, no-grad drop-in for ``torch.nn.init.trunc_normal_``) and
:class:`InitKey` (what a keyed draw is keyed by). Both load on first use (PEP 562), so importing
``torchtitan_lite.init.spec`` does not import DTensor."""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "trunc_normal_": "torchtitan_lite.init.sampling",
    "InitKey": "torchtitan_lite.init.keyed",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
