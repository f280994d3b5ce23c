"""Per-layer key/value state for decoding with a
:class:`~torchtitan_lite.protocols.attention.KVCache`.

A layer appends what it computes for the new positions and attends its new queries to everything it
keeps. Full layers keep every position; a sliding-window layer keeps the last ``sliding_window``
(older keys are never seen again); MLA keeps its compressed latent (``c_kv`` after ``kv_norm`` and
the rotated ``k_pe``) and up-projects it at each step (DeepSeek-V2 report sec. 2.1: the latent is
what makes the cache small). The attention over the kept keys is explicit (``n_new x kept`` scores):
a decoding step has one query; a prompt is run once.
"""

from __future__ import annotations

import torch


class LayerKV:
    """One layer's kept tensors (each ``(bs, kept, ...)``) and ``end``, the position after the last
    one kept."""

    def __init__(self):
        self.tensors: tuple[torch.Tensor, ...] | None = None
        self.end = 0

    def extend(
        self, new: tuple[torch.Tensor, ...], keep: int | None
    ) -> tuple[tuple[torch.Tensor, ...], int]:
        """Append ``new`` (each ``(bs, n_new, ...)``) along positions; returns all tensors for this
        step and the position of their first row, then keeps only the last ``keep`` positions
        (``None``: all)."""
        every = (
            new
            if self.tensors is None
            else tuple(torch.cat([t, n], dim=1) for t, n in zip(self.tensors, new, strict=True))
        )
        start = self.end - (0 if self.tensors is None else self.tensors[0].shape[1])
        self.end += new[0].shape[1]
        self.tensors = every if keep is None else tuple(t[:, -keep:] for t in every)
        return every, start


def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_start: int,
    k_start: int,
    *,
    sinks: torch.Tensor | None = None,
    sliding_window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention of new queries over kept keys at absolute positions, in fp32.

    Query ``i`` (position ``q_start + i``) sees key ``j`` (position ``k_start + j``) iff its
    position is not later and, with a window ``W``, less than ``W`` before; ``sinks`` add
    ``exp(sinks[h])`` to head ``h``'s denominator.

    Args:
        q: ``(bs, n_new, n_heads, head_dim)``; k: ``(bs, n_kept, n_kv_heads, head_dim)``; v:
            ``(bs, n_kept, n_kv_heads, v_head_dim)``.

    Returns:
        ``(bs, n_new, n_heads, v_head_dim)`` in the dtype of ``q``.
    """
    n_heads, head_dim = q.shape[2], q.shape[3]
    scale = head_dim**-0.5 if scale is None else scale
    group = n_heads // k.shape[2]
    kf = k.float().repeat_interleave(
        group, dim=2
    )  # (bs, n_kept, n_heads, head_dim), HF repeat_kv order
    vf = v.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) * scale
    q_pos = torch.arange(q_start, q_start + q.shape[1], device=q.device)[:, None]
    k_pos = torch.arange(k_start, k_start + k.shape[1], device=q.device)[None, :]
    visible = k_pos <= q_pos
    if sliding_window is not None:
        visible = visible & (q_pos - k_pos < sliding_window)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(1, n_heads, 1, 1).expand(*scores.shape[:3], 1)
        scores = torch.cat([scores, sink], dim=-1)
    probs = torch.softmax(scores, dim=-1)[..., : k.shape[1]]
    return torch.einsum("bhqk,bkhd->bqhd", probs, vf).to(q.dtype)
