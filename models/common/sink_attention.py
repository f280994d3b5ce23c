"""The dense reference of causal attention with per-head sinks, a sliding window and documents: an
explicit boolean ``(S, S + 1)`` mask through SDPA (``model.attn_backend = "reference"``). Its memory
grows with ``S^2``; it is the reference the ``O(S)`` backends are tested against
(``models/common/attention_backends.py``).

Attention sink (GPT-OSS; OpenAI gpt-oss model card, Aug 2025, and ``sdpa`` in the reference
``gpt_oss/torch/model.py``): every query head ``h`` owns a learned logit ``sinks[h]`` that joins the
softmax denominator as one extra column with no value::

    p_ij = exp(s_ij) / (sum_{j' visible} exp(s_ij') + exp(sinks[h]))      out_i = sum_j p_ij v_j

so a head can put weight "nowhere" (the probabilities of the real keys sum to less than one).

Note: docs/design.md, "on computing the sink exactly with SDPA".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchtitan_lite.models.common.attention_checks import check_qkv


def sliding_window_causal_mask(
    seqlen: int, sliding_window: int | None, device: torch.device | str | None = None
) -> torch.Tensor:
    """Which keys each query may see: causal, optionally limited to the most recent keys.

    Query ``i`` sees key ``j`` iff ``j <= i`` and, with a window ``W``, ``i - j < W``: the ``W``
    most recent positions, itself included (the reference ``sdpa`` masks ``j <= i - W``; HF
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
            "sliding_window_causal_mask: sliding_window must be > 0 or None (full causal), got "
            f"{sliding_window}"
        )
    pos = torch.arange(seqlen, device=device)
    offset = pos[:, None] - pos[None, :]  # (query, key): i - j
    mask = offset >= 0
    if sliding_window is not None:
        mask &= offset < sliding_window
    return mask


def document_causal_mask(
    seqlen: int,
    sliding_window: int | None,
    document_ids: torch.Tensor | None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """:func:`sliding_window_causal_mask`, and with ``document_ids`` int ``(bs, seqlen)`` only keys
    of the query's document: bool ``(seqlen, seqlen)``, or ``(bs, 1, seqlen, seqlen)`` with
    documents."""
    mask = sliding_window_causal_mask(seqlen, sliding_window, device=device)
    if document_ids is None:
        return mask
    same_doc = document_ids[:, :, None] == document_ids[:, None, :]  # (bs, query, key)
    return (mask & same_doc)[:, None]


def sink_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor | None,
    sliding_window: int | None = None,
    scale: float | None = None,
    document_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal grouped-query attention with per-head sinks (docs/design.md, "Note: on computing the
    sink exactly with SDPA"), by a dense mask.

    Query head ``h`` reads key/value head ``h // (n_heads // n_kv_heads)`` (the grouping of HF
    ``repeat_kv`` and of the reference's ``(n_kv_heads, q_mult)`` query layout).

    Args:
        q: queries ``(bs, seqlen, n_heads, head_dim)``.
        k: keys ``(bs, seqlen, n_kv_heads, head_dim)``.
        v: values ``(bs, seqlen, n_kv_heads, v_head_dim)`` (``v_head_dim == head_dim`` with sinks).
        sinks: sink logits ``(n_heads,)``, in logit units (already scaled; not multiplied by
            ``scale``), or ``None`` (plain softmax).
        sliding_window: each query sees only the ``sliding_window`` most recent keys (itself
            included); ``None`` for full causal attention.
        scale: softmax scale of ``q . k``; default ``head_dim ** -0.5`` (the reference's
            ``sm_scale``).
        document_ids: int ``(bs, seqlen)``; a query sees only keys of its own document. ``None``:
            one document.

    Returns:
        ``(bs, seqlen, n_heads, v_head_dim)`` in the dtype of ``q``.

    Raises:
        ValueError: inputs not 4-D or with mismatched shapes, ``n_heads`` not a multiple of
            ``n_kv_heads``, ``sinks`` not ``(n_heads,)``, or a non-positive ``sliding_window``.
    """
    bs, seqlen, n_heads, head_dim = check_qkv("sink_attention", q, k, v, sinks, document_ids)
    n_kv_heads = k.shape[2]
    mask = document_causal_mask(seqlen, sliding_window, document_ids, device=q.device)
    if sinks is None:
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            scale=scale,
            enable_gqa=n_heads != n_kv_heads,
        )
        return out.transpose(1, 2)
    scale = head_dim**-0.5 if scale is None else scale
    q_aug, k_aug, v_aug = _fold_sinks("sink_attention", q, k, v, sinks, scale, first=False)
    mask = F.pad(mask, (0, 1), value=True)  # the sink key (last) is visible to every query
    out = F.scaled_dot_product_attention(
        q_aug, k_aug, v_aug, attn_mask=mask, scale=scale, enable_gqa=n_heads != n_kv_heads
    )  # (bs, n_heads, seqlen, padded)
    return out[..., :head_dim].transpose(1, 2)  # (bs, seqlen, n_heads, head_dim)


def sink_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Full causal attention with per-head sinks through SDPA ``is_causal``: no mask, memory
    ``O(S)`` with a fused kernel (the flash kernel on CPU).

    The sink key is folded in as in :func:`sink_attention` but placed first, and one query row of
    zeros is put before the queries: with ``is_causal`` over ``seqlen + 1`` positions, query
    ``i + 1`` sees the sink key and keys ``0 .. i``, exactly the masked reference; the extra row is
    dropped.

    Args, returns and raises as :func:`sink_attention` (``sinks`` required, no window, one
    document).
    """
    bs, seqlen, n_heads, head_dim = check_qkv("sink_causal_attention", q, k, v, sinks)
    scale = head_dim**-0.5 if scale is None else scale
    q_aug, k_aug, v_aug = _fold_sinks("sink_causal_attention", q, k, v, sinks, scale, first=True)
    q_aug = F.pad(
        q_aug, (0, 0, 1, 0)
    )  # (bs, n_heads, 1 + seqlen, padded): the row that sees only the sink
    out = F.scaled_dot_product_attention(
        q_aug, k_aug, v_aug, is_causal=True, scale=scale, enable_gqa=n_heads != k.shape[2]
    )  # (bs, n_heads, 1 + seqlen, padded)
    return out[:, :, 1:, :head_dim].transpose(1, 2)  # (bs, seqlen, n_heads, head_dim)


def _fold_sinks(
    name: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor,
    scale: float,
    first: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q_aug, k_aug, v_aug)`` of the module note, heads before positions:
    ``(bs, n_heads, seqlen, padded)``, ``(bs, n_kv_heads, seqlen + 1, padded)`` twice, with the sink
    key and its zero value row ``first`` or last."""
    bs, seqlen, n_heads, head_dim = q.shape
    if v.shape[3] != head_dim:
        raise ValueError(
            f"{name}: with sinks v_head_dim must equal head_dim {head_dim}, got {v.shape[3]}"
        )
    padded = head_dim + 8 - head_dim % 8  # room for the sink column, a multiple of 8
    pad = padded - head_dim
    q = q.transpose(1, 2)  # (bs, n_heads, seqlen, head_dim)
    sink_col = (sinks.to(q.dtype) / scale).view(1, n_heads, 1, 1).expand(bs, n_heads, seqlen, 1)
    q_aug = torch.cat([q, sink_col, q.new_zeros(bs, n_heads, seqlen, pad - 1)], dim=-1)
    sink_key = k.new_zeros(bs, k.shape[2], 1, padded)
    sink_key[..., head_dim] = 1.0
    keys = F.pad(k.transpose(1, 2), (0, pad))
    k_aug = torch.cat(
        [sink_key, keys] if first else [keys, sink_key], dim=2
    )  # (bs, n_kv, seqlen + 1, padded)
    v_aug = F.pad(
        v.transpose(1, 2), (0, pad, 1, 0) if first else (0, pad, 0, 1)
    )  # the sink's value row is 0
    return q_aug, k_aug, v_aug
