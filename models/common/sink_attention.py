"""Causal attention with per-head attention sinks and an optional sliding window, through SDPA.

Attention sink (GPT-OSS; OpenAI gpt-oss model card, Aug 2025, and ``sdpa`` in the reference
``gpt_oss/torch/model.py``): every query head ``h`` owns a learned logit ``sinks[h]`` that joins the
softmax denominator as one extra column with no value::

    p_ij = exp(s_ij) / (sum_{j' visible} exp(s_ij') + exp(sinks[h]))      out_i = sum_j p_ij v_j

so a head can put weight "nowhere" (the probabilities of the real keys sum to less than one).

Note: on computing the sink exactly with SDPA. SDPA returns no log-sum-exp, so the sink is folded
into the inputs instead: one extra key ``k_sink`` with value zero, and one extra feature column.
Queries get ``sinks[h] / scale`` in that column, real keys get 0 and ``k_sink`` gets 1 (all its other
features 0), so ``scale * q_aug . k_aug_j = s_ij`` for real keys and ``= sinks[h]`` for the sink key.
The value row of ``k_sink`` is zero, so it only adds ``exp(sinks[h])`` to the denominator: the output
is exactly the formula above, and autograd gives exact gradients for q, k, v and ``sinks`` through any
SDPA backend (fused flash on CPU, memory-efficient or math elsewhere). The head dimension is padded
with zeros to a multiple of 8 (the alignment fused kernels want; zero features change no dot product),
and v to the same size (CPU flash attention needs equal q/k/v head dims).
The sink key is shared by all query heads, so grouped-query attention keeps its ``n_kv_heads`` keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def sliding_window_causal_mask(
    seqlen: int, sliding_window: int | None, device: torch.device | str | None = None
) -> torch.Tensor:
    """Which keys each query may see: causal, optionally limited to the most recent keys.

    Query ``i`` sees key ``j`` iff ``j <= i`` and, with a window ``W``, ``i - j < W``: the ``W`` most
    recent positions, itself included (the reference ``sdpa`` masks ``j <= i - W``; HF
    ``sliding_window_causal_mask`` is the same).

    Args:
        seqlen: number of positions.
        sliding_window: ``W`` (GPT-OSS: 128 on its sliding layers), or ``None`` for full causal.
        device: where to build the mask.

    Returns:
        Bool ``(seqlen, seqlen)``, ``True`` where attention is allowed.

    Raises:
        ValueError: ``seqlen`` or ``sliding_window`` not positive.
    """
    if seqlen <= 0:
        raise ValueError(f"sliding_window_causal_mask: seqlen must be > 0, got {seqlen}")
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(
            f"sliding_window_causal_mask: sliding_window must be > 0 or None (full causal), got {sliding_window}"
        )
    pos = torch.arange(seqlen, device=device)
    offset = pos[:, None] - pos[None, :]  # (query, key): i - j
    mask = offset >= 0
    if sliding_window is not None:
        mask &= offset < sliding_window
    return mask


def sink_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor,
    sliding_window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal grouped-query attention with per-head sinks (see the note in this module).

    Query head ``h`` reads key/value head ``h // (n_heads // n_kv_heads)`` (the grouping of HF
    ``repeat_kv`` and of the reference's ``(n_kv_heads, q_mult)`` query layout).

    Args:
        q: queries ``(bs, seqlen, n_heads, head_dim)``.
        k: keys ``(bs, seqlen, n_kv_heads, head_dim)``.
        v: values ``(bs, seqlen, n_kv_heads, head_dim)``.
        sinks: sink logits ``(n_heads,)``, in logit units (already scaled; not multiplied by ``scale``).
        sliding_window: each query sees only the ``sliding_window`` most recent keys (itself
            included); ``None`` for full causal attention.
        scale: softmax scale of ``q . k``; default ``head_dim ** -0.5`` (the reference's ``sm_scale``).

    Returns:
        ``(bs, seqlen, n_heads, head_dim)`` in the dtype of ``q``.

    Raises:
        ValueError: inputs not 4-D or with mismatched shapes, ``n_heads`` not a multiple of
            ``n_kv_heads``, ``sinks`` not ``(n_heads,)``, or a non-positive ``sliding_window``.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            "sink_attention: q, k, v must be (bs, seqlen, heads, head_dim), got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    bs, seqlen, n_heads, head_dim = q.shape
    if k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != head_dim:
        raise ValueError(
            "sink_attention: k and v must be (bs, seqlen, n_kv_heads, head_dim) matching q's bs, seqlen and "
            f"head_dim; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    n_kv_heads = k.shape[2]
    if n_heads % n_kv_heads:
        raise ValueError(f"sink_attention: n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
    if tuple(sinks.shape) != (n_heads,):
        raise ValueError(f"sink_attention: sinks must have shape (n_heads,) = ({n_heads},), got {tuple(sinks.shape)}")
    scale = head_dim**-0.5 if scale is None else scale
    padded = head_dim + 8 - head_dim % 8  # room for the sink column, a multiple of 8
    pad = padded - head_dim

    q = q.transpose(1, 2)  # (bs, n_heads, seqlen, head_dim)
    sink_col = (sinks.to(q.dtype) / scale).view(1, n_heads, 1, 1).expand(bs, n_heads, seqlen, 1)
    q_aug = torch.cat([q, sink_col, q.new_zeros(bs, n_heads, seqlen, pad - 1)], dim=-1)

    sink_key = k.new_zeros(bs, n_kv_heads, 1, padded)
    sink_key[..., head_dim] = 1.0
    k_aug = torch.cat([F.pad(k.transpose(1, 2), (0, pad)), sink_key], dim=2)  # (bs, n_kv, seqlen + 1, padded)
    v_aug = F.pad(v.transpose(1, 2), (0, pad, 0, 1))  # (bs, n_kv, seqlen + 1, padded), sink value row 0

    mask = torch.ones(seqlen, seqlen + 1, dtype=torch.bool, device=q.device)
    mask[:, :seqlen] = sliding_window_causal_mask(seqlen, sliding_window, device=q.device)
    out = F.scaled_dot_product_attention(
        q_aug, k_aug, v_aug, attn_mask=mask, scale=scale, enable_gqa=n_heads != n_kv_heads
    )  # (bs, n_heads, seqlen, padded)
    return out[..., :head_dim].transpose(1, 2)  # (bs, seqlen, n_heads, head_dim)


class SinkAttention(nn.Module):
    """:func:`sink_attention` as a parameterless module (torchtitan's ``inner_attention``): the attention kernel
    of a layer, a boundary where tensor parallelism hands it plain local tensors (the rank's heads and sinks).

    Args:
        sliding_window: keys visible to each query, or ``None`` for full causal attention.
    """

    def __init__(self, sliding_window: int | None = None):
        super().__init__()
        self.sliding_window = sliding_window

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
        """``q`` ``(bs, seqlen, n_heads, head_dim)``, ``k``/``v`` ``(bs, seqlen, n_kv_heads, head_dim)``, ``sinks``
        ``(n_heads,)`` -> ``(bs, seqlen, n_heads, head_dim)``."""
        return sink_attention(q, k, v, sinks, sliding_window=self.sliding_window)
