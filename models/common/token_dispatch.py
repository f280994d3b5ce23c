"""Sending (token, expert) pairs to stacked expert weights without a host sync: one grouped matmul
per layer.

Note: docs/design.md, "on dispatch without a host sync".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

ALIGN = 16
"""Rows each expert's group is padded to a multiple of (16: bf16 and fp8 grouped GEMMs, see the
note)."""


@dataclass(frozen=True)
class Dispatch:
    """Where each (token, expert) pair of a layer goes, in the padded per-expert buffer.

    Attributes:
        token_idx: ``(T * k,)`` int64, the token of each pair, pairs sorted by expert.
        order: ``(T * k,)`` int64, position of each sorted pair in the flattened ``(T, k)`` routing.
        rows: ``(T * k,)`` int64, the buffer row of each sorted pair.
        group_expert: ``(num_rows,)`` int64, the expert whose group holds each buffer row.
        offsets: ``(E,)`` int32, the end row of each expert's group (the last one is ``num_rows``).
        num_rows: buffer rows, ``T * k + E * ALIGN`` (from shapes only).
    """

    token_idx: torch.Tensor
    order: torch.Tensor
    rows: torch.Tensor
    group_expert: torch.Tensor
    offsets: torch.Tensor
    num_rows: int


def dispatch(indices: torch.Tensor, num_experts: int) -> Dispatch:
    """Plan the buffer for routing ``indices`` ``(T, k)`` (int64 expert ids in
    ``[0, num_experts)``).

    Tensor ops only: no host sync (docs/design.md, "Note: on dispatch without a host sync").
    """
    num_tokens, top_k = indices.shape
    flat = indices.reshape(-1)  # (T * k,)
    order = torch.argsort(flat, stable=True)
    expert = flat[order]  # (T * k,) sorted
    counts = torch.bincount(flat, minlength=num_experts)  # (E,)
    padded = (counts + ALIGN - 1) // ALIGN * ALIGN
    padded_start = torch.cumsum(padded, 0) - padded  # (E,)
    start = torch.cumsum(counts, 0) - counts
    position = torch.arange(flat.numel(), device=flat.device)
    rows = padded_start[expert] + position - start[expert]
    num_rows = flat.numel() + num_experts * ALIGN
    ends = torch.cumsum(padded, 0)
    offsets = torch.cat([ends[:-1], ends.new_full((1,), num_rows)]).to(torch.int32)
    group_expert = torch.bucketize(
        torch.arange(num_rows, device=flat.device), ends[:-1], right=True
    )
    return Dispatch(
        token_idx=order // top_k,
        order=order,
        rows=rows,
        group_expert=group_expert,
        offsets=offsets,
        num_rows=num_rows,
    )


def scatter_rows(x: torch.Tensor, plan: Dispatch) -> torch.Tensor:
    """The buffer ``(num_rows, dim)``: token ``token_idx[i]`` of ``x`` ``(T, dim)`` at row
    ``rows[i]``, zeros elsewhere."""
    return x.new_zeros(plan.num_rows, x.shape[-1]).index_copy(
        0, plan.rows, x.index_select(0, plan.token_idx)
    )


def grouped_mm_fits(weight: torch.Tensor) -> bool:
    """Whether ``F.grouped_mm`` takes ``weight`` ``(E, out, in)``: its kernels need both widths to
    span a multiple of 16 bytes (``out`` and ``in`` multiples of 4 in fp32, of 8 in bf16)."""
    return all(width * weight.element_size() % 16 == 0 for width in weight.shape[-2:])


def grouped_linear(buffer: torch.Tensor, weight: torch.Tensor, plan: Dispatch) -> torch.Tensor:
    """Each expert's rows times its weight: ``buffer`` ``(num_rows, in)``, ``weight``
    ``(E, out, in)`` (``nn.Linear`` layout) -> ``(num_rows, out)``.

    One ``F.grouped_mm`` call when :func:`grouped_mm_fits` (every flavor and debug config here);
    widths that do not fit (toy shapes in tests) fall back to a loop over experts, which reads the
    group sizes on the host (one sync).
    """
    if grouped_mm_fits(weight):
        return F.grouped_mm(buffer, weight.transpose(-2, -1), offs=plan.offsets)
    sizes = torch.diff(plan.offsets, prepend=plan.offsets.new_zeros(1)).tolist()
    return torch.cat(
        [F.linear(rows, weight[e]) for e, rows in enumerate(torch.split(buffer, sizes))]
    )


def combine(
    buffer: torch.Tensor, weights: torch.Tensor, plan: Dispatch, num_tokens: int
) -> torch.Tensor:
    """``out[t] = sum_j weights[t, j] * buffer[row of (t, j)]``: ``buffer`` ``(num_rows, dim)``,
    ``weights`` ``(T, k)`` -> ``(T, dim)`` in ``buffer.dtype``."""
    y = buffer.index_select(0, plan.rows) * weights.reshape(-1)[plan.order, None]  # (T * k, dim)
    return buffer.new_zeros(num_tokens, buffer.shape[-1]).index_add(
        0, plan.token_idx, y.to(buffer.dtype)
    )
