"""The attention contract: a model's attention kernels are :class:`AttentionKernel` modules whose
``attn_backend`` the engine sets from ``model.attn_backend``
(:func:`torchtitan_lite.components.attention.set_attn_backend`), and a model's
``forward(tokens, document_ids=None, positions=None, cache=None)`` accepts document masks, RoPE
positions and a :class:`KVCache` for decoding (``models/common/decoder.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

ATTN_BACKENDS = ("auto", "flex", "blockwise", "reference")
"""Backend names (``models/common/attention_backends.py`` says what each runs)."""


class WindowAware(nn.Module):
    """Base of a module whose forward needs the whole window's statistics or keys: ``cp`` is
    ``None`` (it sees whole windows), or under context parallelism the rank's share, set by the
    engine (:class:`torchtitan_lite.distributed.context_parallel.ContextParallel`: ``chunks``,
    ``gather``, ``sum``)."""

    cp: Any = None


class AttentionKernel(WindowAware):
    """Base of a parameterless attention kernel (torchtitan's ``inner_attention``); ``attn_backend``
    is one of :data:`ATTN_BACKENDS`, ``auto`` until the engine sets it."""

    attn_backend: str = "auto"


@dataclass
class KVCache:
    """Decoding state of one sequence batch: ``length`` positions already run through the model, and
    per layer id (``str``) the state its attention keeps (``models/common/kv_cache.py``: keys and
    values, only the window's on sliding-window layers, MLA's compressed latent). Pass one to
    ``model(tokens, cache=cache)``; each call appends ``tokens`` at positions ``length ..`` and
    advances ``length``."""

    length: int = 0
    layers: dict[str, Any] = field(default_factory=dict)
