"""Causal grouped-query attention through PyTorch's fused SDPA kernel.

Grouped-query attention (GQA; Ainslie et al. 2023, arXiv 2305.13245): ``n_heads`` query heads share
``n_kv_heads`` key/value heads, query head ``h`` reading key/value head ``h // (n_heads // n_kv_heads)``
(the grouping of HF ``repeat_kv`` and of SDPA's ``enable_gqa``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Causal softmax attention, position ``t`` attending to positions ``0 .. t``.

    Runs :func:`torch.nn.functional.scaled_dot_product_attention` with ``is_causal=True`` and
    ``enable_gqa=True`` (forward and backward work on CPU in fp32, and on accelerators).

    Args:
        q: queries ``(bs, seqlen, n_heads, head_dim)``.
        k: keys ``(bs, seqlen, n_kv_heads, head_dim)``.
        v: values ``(bs, seqlen, n_kv_heads, v_head_dim)``.
        scale: softmax scale; default ``head_dim ** -0.5`` (Vaswani et al. 2017).

    Returns:
        ``(bs, seqlen, n_heads, v_head_dim)`` in the dtype of ``q``.

    Raises:
        ValueError: inputs not 4-D, mismatched batch/sequence sizes or head dims, or ``n_heads`` not
            a multiple of ``n_kv_heads``.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            "causal_attention: q, k, v must be (bs, seqlen, heads, head_dim), got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[3] != k.shape[3]:
        raise ValueError(
            "causal_attention: q, k, v must agree on (bs, seqlen), k and v on n_kv_heads, q and k on "
            f"head_dim; got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    n_heads, n_kv_heads = q.shape[2], k.shape[2]
    if n_heads % n_kv_heads:
        raise ValueError(
            f"causal_attention: n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})"
        )
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),  # (bs, n_heads, seqlen, head_dim)
        k.transpose(1, 2),  # (bs, n_kv_heads, seqlen, head_dim)
        v.transpose(1, 2),  # (bs, n_kv_heads, seqlen, v_head_dim)
        is_causal=True,
        scale=scale,
        enable_gqa=n_heads != n_kv_heads,
    )
    return out.transpose(1, 2)  # (bs, seqlen, n_heads, v_head_dim)


class CausalAttention(nn.Module):
    """:func:`causal_attention` as a parameterless module (torchtitan's ``inner_attention``): the attention kernel
    of a layer, a boundary where tensor parallelism hands it plain local tensors (the rank's heads).

    Args:
        scale: softmax scale; ``None`` = ``head_dim ** -0.5``.
    """

    def __init__(self, scale: float | None = None):
        super().__init__()
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q`` ``(bs, seqlen, n_heads, head_dim)``, ``k`` ``(bs, seqlen, n_kv_heads, head_dim)``, ``v``
        ``(bs, seqlen, n_kv_heads, v_head_dim)`` -> ``(bs, seqlen, n_heads, v_head_dim)``."""
        return causal_attention(q, k, v, scale=self.scale)
