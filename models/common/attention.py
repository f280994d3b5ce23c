"""The GQA self-attention layer of the Qwen3, Qwen3-MoE and Llama 3 blocks (:class:`Attention`); its
kernel is ``inner_attention`` (``models/common/attention_backends.py``).

Grouped-query attention (GQA; Ainslie et al. 2023, arXiv 2305.13245): ``n_heads`` query heads share
``n_kv_heads`` key/value heads, query head ``h`` reading key/value head
``h // (n_heads // n_kv_heads)`` (the grouping of HF ``repeat_kv`` and of SDPA's ``enable_gqa``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchtitan_lite.models.common.attention_backends import InnerAttention
from torchtitan_lite.models.common.kv_cache import LayerKV, cached_attention
from torchtitan_lite.models.common.norm import RMSNorm
from torchtitan_lite.models.common.rope import apply_rope


class Attention(nn.Module):
    """Causal GQA self-attention with RoPE (Llama 3, Qwen3, Qwen3-MoE), with QK-norm when
    ``qk_norm`` (Qwen3, Qwen3-MoE) and biases on the four projections when ``bias`` (GPT-OSS
    ``attention_bias: true``, whose subclass swaps the kernel; Llama 3 and Qwen3 have none).

    QK-norm: an RMSNorm over ``head_dim`` (one weight vector shared by all heads) on each query and
    key head, applied BEFORE RoPE (HF ``Qwen3Attention.forward``: ``q_norm(q_proj(x))`` then
    ``apply_rotary_pos_emb``; Qwen3 report section 2: QK-Norm replaces Qwen2's QKV bias).

    Args:
        args: a family's args; read here: ``dim``, ``n_heads``, ``n_kv_heads``, ``head_dim``,
            ``norm_eps``.
        qk_norm: add ``q_norm`` and ``k_norm`` (else both are ``None``).
        bias: give ``wq``/``wk``/``wv``/``wo`` biases.

    Shapes: ``x`` ``(bs, seqlen, dim)``, ``cos``/``sin`` ``(seqlen, head_dim)`` ->
    ``(bs, seqlen, dim)``. Head counts are read from the projections' outputs, so a rank holding
    some of the heads (tensor parallelism) runs its heads.
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
        self.inner_attention = InnerAttention()
        self.kv_cache: LayerKV | None = None  # set by the decoder for a forward with a KV cache

    def qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Queries ``(bs, seqlen, n_heads, head_dim)`` and keys after (QK-norm and) RoPE, values
        ``(bs, seqlen, n_kv_heads, head_dim)``."""
        bs, seqlen, _ = x.shape
        q = self.wq(x).view(bs, seqlen, -1, self.head_dim)  # (bs, seqlen, n_heads, head_dim)
        k = self.wk(x).view(bs, seqlen, -1, self.head_dim)  # (bs, seqlen, n_kv_heads, head_dim)
        v = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` ``(bs, seqlen, dim)`` -> ``(bs, seqlen, dim)``; ``document_ids`` int
        ``(bs, seqlen)`` or ``None``
        (:func:`torchtitan_lite.models.common.attention_backends.attention`)."""
        out = self.attend(
            *self.qkv(x, cos, sin), document_ids=document_ids
        )  # (bs, seqlen, n_heads, head_dim)
        return self.wo(out.flatten(2))

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        sinks: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``inner_attention`` of ``q`` ``(bs, seqlen, n_heads, head_dim)`` over ``k``/``v``; with
        ``kv_cache`` set, the new positions' keys and values are kept and the queries attend to all
        kept ones (:mod:`torchtitan_lite.models.common.kv_cache`)."""
        if self.kv_cache is None:
            k, v = self.inner_attention.gather(k, v)  # the whole window's under context parallelism
            args = (
                (q, k, v) if sinks is None else (q, k, v, sinks)
            )  # positional: what a TP plan prepares
            return self.inner_attention(*args, document_ids=document_ids)
        window = self.inner_attention.sliding_window
        (k, v), k_start = self.kv_cache.extend((k, v), keep=window)
        return cached_attention(
            q,
            k,
            v,
            self.kv_cache.end - q.shape[1],
            k_start,
            sinks=sinks,
            sliding_window=window,
            scale=self.inner_attention.scale,
        )
