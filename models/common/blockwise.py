"""Exact causal attention over tiles with an online softmax: sinks, sliding windows and documents
without an ``S x S`` tensor, forward and backward (the CPU path; FlexAttention has no CPU backward
in torch 2.13).

Note: on the blockwise recurrence. Queries and keys are cut into blocks of ``block_size`` positions.
For each query block the key blocks it can see (causal, inside the window, inside the documents of
the block) are visited in order, keeping per query the running maximum ``m``, the running
denominator ``l`` and the running weighted sum of values ``acc`` (the online softmax of Milakov &
Gimelshein 2018, arXiv 1805.02867, as FlashAttention, Dao et al. 2022, arXiv 2205.14135). A sink
logit starts the recurrence (``m = sink``, ``l = 1``): it is one more term of the denominator with
no value (``models/common/sink_attention.py``). The forward saves only the output and the
log-sum-exp ``lse = m + log l`` per query; the backward revisits the same tiles and recomputes the
probabilities ``p = exp(s - lse)`` (FlashAttention-2's backward, Dao 2023, arXiv 2307.08691)::

    D_i = sum_d dO_id O_id      dS_ij = p_ij (dO_i . v_j - D_i)      dsink_h = -sum_i exp(sink_h -
    lse_i) D_i

Memory is ``O(S x block_size)`` per head (one tile of scores at a time plus the ``(S, head_dim)``
tensors); time is ``O(S x visible keys)``, so a 128-key window costs ``O(S x 128)``. Everything is
computed in fp32 and the output returned in the dtype of ``q``.
"""

from __future__ import annotations

import torch

from torchtitan_lite.data.documents import document_positions
from torchtitan_lite.models.common.attention_checks import check_qkv

BLOCK_SIZE = 256
"""Default tile edge in positions (a tile of scores is ``block_size^2`` per head)."""


class _Tiles:
    """The visible tiles of one call: query blocks, and for each the key range and whether it needs
    a mask.

    Queries sit at positions ``q_start .. seqlen - 1``, keys at ``0 .. seqlen - 1`` (``q_start`` >
    0: a context-parallel rank's chunk, whose earlier keys it gathered). ``document_ids`` int
    ``(bs, seqlen)`` of the keys (non-decreasing along the sequence) or ``None``.
    """

    def __init__(
        self,
        seqlen: int,
        window: int | None,
        document_ids: torch.Tensor | None,
        block_size: int,
        q_start: int = 0,
    ):
        self.seqlen, self.window, self.block, self.q_start = seqlen, window, block_size, q_start
        self.document_ids = document_ids
        if document_ids is not None:
            pos = torch.arange(seqlen, device=document_ids.device)
            self.doc_start = pos - document_positions(
                document_ids
            )  # first position of each one's document

    def __iter__(self):
        """Yield ``(qs, qe, key_ranges)`` in positions; ``key_ranges`` lists ``(ks, ke)`` key
        blocks visible from the block."""
        for qs in range(self.q_start, self.seqlen, self.block):
            qe = min(qs + self.block, self.seqlen)
            lo = 0 if self.window is None else max(0, qs - self.window + 1)
            if self.document_ids is not None:
                lo = max(lo, int(self.doc_start[:, qs].min()))
            yield qs, qe, [(ks, min(ks + self.block, qe)) for ks in range(lo, qe, self.block)]

    def mask(self, qs: int, qe: int, ks: int, ke: int) -> torch.Tensor | None:
        """Bool ``(bs or 1, 1, 1, qe - qs, ke - ks)``, ``True`` where query ``i`` sees key ``j``;
        ``None`` when all do."""
        full = ke - 1 <= qs and (self.window is None or qe - 1 - ks < self.window)
        if full and self.document_ids is None:
            return None
        device = self.doc_start.device if self.document_ids is not None else None
        i = torch.arange(qs, qe, device=device)[:, None]
        j = torch.arange(ks, ke, device=device)[None, :]
        allowed = j <= i
        if self.window is not None:
            allowed = allowed & (i - j < self.window)
        allowed = allowed[None]  # (1, nq, nk)
        if self.document_ids is not None:
            doc = self.document_ids
            allowed = allowed & (doc[:, qs:qe, None] == doc[:, None, ks:ke])
        return allowed[:, None, None]


def _scores(q, k, scale, tiles, qs, qe, ks, ke):
    """Masked scores of one tile, fp32 ``(bs, n_kv_heads, group, nq, nk)``; hidden keys are
    ``-inf``."""
    q0 = tiles.q_start
    s = q[..., qs - q0 : qe - q0, :] @ k[..., ks:ke, :].transpose(-1, -2) * scale
    mask = tiles.mask(qs, qe, ks, ke)
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


class _BlockAttention(torch.autograd.Function):
    """fp32 ``q`` ``(bs, n_kv, group, Sq, D)``, ``k`` ``(bs, n_kv, 1, S, D)``, ``v``
    ``(bs, n_kv, 1, S, Dv)``, ``sinks`` ``(1, n_kv, group, 1, 1)`` or ``None`` ->
    ``(bs, n_kv, group, Sq, Dv)``, ``Sq = S - tiles.q_start`` (module note)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, tiles, scale):
        outs, lses = [], []
        for qs, qe, key_ranges in tiles:
            shape = (*q.shape[:3], qe - qs, 1)
            if sinks is None:
                m, row_sum = q.new_full(shape, float("-inf")), q.new_zeros(shape)
            else:
                m, row_sum = sinks.expand(shape).clone(), q.new_ones(shape)
            acc = q.new_zeros(*shape[:-1], v.shape[-1])
            for ks, ke in key_ranges:
                s = _scores(q, k, scale, tiles, qs, qe, ks, ke)
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # rows that saw nothing yet
                p = torch.exp(s - m_safe)
                alpha = torch.exp(m - m_safe)
                row_sum = row_sum * alpha + p.sum(-1, keepdim=True)
                acc = acc * alpha + p @ v[..., ks:ke, :]
                m = m_new
            outs.append(acc / row_sum)  # every query sees itself: row_sum > 0
            lses.append(m + torch.log(row_sum))
        out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-2)
        ctx.save_for_backward(q, k, v, sinks, out, lse)
        ctx.tiles, ctx.scale = tiles, scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, sinks, out, lse = ctx.saved_tensors
        tiles, scale = ctx.tiles, ctx.scale
        d_out = d_out.contiguous()
        delta = (d_out * out).sum(-1, keepdim=True)  # D_i: (bs, n_kv, group, S, 1)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        q0 = tiles.q_start
        for qs, qe, key_ranges in tiles:
            rows = slice(qs - q0, qe - q0)  # the block's queries in q
            q_blk, do_blk = q[..., rows, :], d_out[..., rows, :]
            for ks, ke in key_ranges:
                p = torch.exp(_scores(q, k, scale, tiles, qs, qe, ks, ke) - lse[..., rows, :])
                dv[..., ks:ke, :] += (p.transpose(-1, -2) @ do_blk).sum(2, keepdim=True)
                ds = p * (do_blk @ v[..., ks:ke, :].transpose(-1, -2) - delta[..., rows, :])
                dq[..., rows, :] += ds @ k[..., ks:ke, :] * scale
                dk[..., ks:ke, :] += (ds.transpose(-1, -2) @ q_blk).sum(2, keepdim=True) * scale
        d_sinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            d_sinks = -(torch.exp(sinks - lse) * delta).sum(dim=(0, 3), keepdim=True)
        return dq, dk, dv, d_sinks, None, None


def block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sinks: torch.Tensor | None = None,
    sliding_window: int | None = None,
    document_ids: torch.Tensor | None = None,
    scale: float | None = None,
    block_size: int = BLOCK_SIZE,
    q_start: int = 0,
) -> torch.Tensor:
    """Causal grouped-query attention computed tile by tile (module note), exact in fp32, with
    autograd.

    Query ``i`` (at position ``q_start + i``) sees key ``j`` iff ``j <= q_start + i``,
    ``q_start + i - j < sliding_window`` (when set) and the two positions' ``document_ids`` agree
    (when given). Query head ``h`` reads key/value head ``h // (n_heads // n_kv_heads)``.

    Args:
        q: ``(bs, seqlen - q_start, n_heads, head_dim)``: the last positions of the keys' span.
        k: ``(bs, seqlen, n_kv_heads, head_dim)``.
        v: ``(bs, seqlen, n_kv_heads, v_head_dim)``.
        sinks: per-head sink logits ``(n_heads,)`` (not scaled), or ``None``.
        sliding_window: keys visible to each query, itself included, or ``None``.
        document_ids: int ``(bs, seqlen)`` of the keys' positions, non-decreasing along each row,
            or ``None``.
        scale: softmax scale; default ``head_dim ** -0.5``.
        block_size: tile edge in positions.
        q_start: position of the first query (a context-parallel chunk's offset; 0 = every
            position).

    Returns:
        ``(bs, seqlen - q_start, n_heads, v_head_dim)`` in the dtype of ``q``.

    Raises:
        ValueError: shapes that disagree
            (:func:`torchtitan_lite.models.common.attention_checks.check_qkv`).
    """
    ids = None if document_ids is None else document_ids[:, q_start:]  # the queries' positions
    bs, seqlen, n_heads, head_dim = check_qkv(
        "block_attention", q, k[:, q_start:], v[:, q_start:], sinks, ids
    )
    n_kv_heads = k.shape[2]
    group = n_heads // n_kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    q5 = q.float().transpose(1, 2).reshape(bs, n_kv_heads, group, seqlen, head_dim)
    k5 = k.float().transpose(1, 2).unsqueeze(2)  # (bs, n_kv_heads, 1, q_start + seqlen, head_dim)
    v5 = v.float().transpose(1, 2).unsqueeze(2)
    sinks5 = None if sinks is None else sinks.float().view(1, n_kv_heads, group, 1, 1)
    tiles = _Tiles(q_start + seqlen, sliding_window, document_ids, block_size, q_start)
    out = _BlockAttention.apply(
        q5.contiguous(), k5.contiguous(), v5.contiguous(), sinks5, tiles, scale
    )
    # (bs, n_kv_heads, group, seqlen, v_head_dim) -> (bs, seqlen, n_heads, v_head_dim)
    return out.reshape(bs, n_heads, seqlen, -1).transpose(1, 2).to(q.dtype)
