"""Causal grouped-query attention through PyTorch's fused SDPA kernel, and the GQA self-attention layer of the
Qwen3, Qwen3-MoE and Llama 3 blocks (:class:`Attention`).

Grouped-query attention (GQA; Ainslie et al. 2023, arXiv 2305.13245): ``n_heads`` query heads share
``n_kv_heads`` key/value heads, query head ``h`` reading key/value head ``h // (n_heads // n_kv_heads)``
(the grouping of HF ``repeat_kv`` and of SDPA's ``enable_gqa``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.common.norm import RMSNorm
from models.common.rope import apply_rope


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


class Attention(nn.Module):
    """Causal GQA self-attention with RoPE (Llama 3, Qwen3, Qwen3-MoE), with QK-norm when ``qk_norm`` (Qwen3,
    Qwen3-MoE) and biases on the four projections when ``bias`` (GPT-OSS ``attention_bias: true``, whose subclass
    swaps the kernel; Llama 3 and Qwen3 have none).

    QK-norm: an RMSNorm over ``head_dim`` (one weight vector shared by all heads) on each query and
    key head, applied BEFORE RoPE (HF ``Qwen3Attention.forward``: ``q_norm(q_proj(x))`` then
    ``apply_rotary_pos_emb``; Qwen3 report section 2: QK-Norm replaces Qwen2's QKV bias).

    Args:
        args: a family's args; read here: ``dim``, ``n_heads``, ``n_kv_heads``, ``head_dim``, ``norm_eps``.
        qk_norm: add ``q_norm`` and ``k_norm`` (else both are ``None``).
        bias: give ``wq``/``wk``/``wv``/``wo`` biases.

    Shapes: ``x`` ``(bs, seqlen, dim)``, ``cos``/``sin`` ``(seqlen, head_dim)`` -> ``(bs, seqlen, dim)``. Head counts
    are read from the projections' outputs, so a rank holding some of the heads (tensor parallelism) runs its heads.
    """

    def __init__(self, args: Any, qk_norm: bool, bias: bool = False):
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=bias)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=bias)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=bias)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=bias)
        self.q_norm = RMSNorm(args.head_dim, eps=args.norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, eps=args.norm_eps) if qk_norm else None

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Queries ``(bs, seqlen, n_heads, head_dim)`` and keys after (QK-norm and) RoPE, values
        ``(bs, seqlen, n_kv_heads, head_dim)``."""
        bs, seqlen, _ = x.shape
        q = self.wq(x).view(bs, seqlen, -1, self.head_dim)  # (bs, seqlen, n_heads, head_dim)
        k = self.wk(x).view(bs, seqlen, -1, self.head_dim)  # (bs, seqlen, n_kv_heads, head_dim)
        v = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        out = causal_attention(*self.qkv(x, cos, sin))  # (bs, seqlen, n_heads, head_dim)
        return self.wo(out.flatten(2))
