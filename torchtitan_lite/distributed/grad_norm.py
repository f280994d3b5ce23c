"""The global gradient norm in an order that no sharding changes
(``training.deterministic = "layout"``).

Each parameter's gradient is cut into rows (dim 0, the dim FSDP2 shards; a 1-D gradient's rows are
its elements). A row's sum of squares is computed whole on the rank that holds it, so it is the same
number on any layout; the rows' sums are gathered in global row order (one ``all_gather`` over the
shard group for all parameters), summed per parameter, and the parameters' sums are added in
``named_parameters`` order.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard


def _shard_group(grads: list[torch.Tensor]) -> tuple[dist.ProcessGroup | None, int]:
    """``(group, size)`` over which the gradients are ``Shard(0)`` (``(None, 1)`` when none is
    sharded).

    Raises:
        ValueError: gradients sharded over different mesh dimensions, or on another dim than 0.
    """
    found = set()
    for grad in grads:
        if isinstance(grad, DTensor):
            for dim, placement in enumerate(grad.placements):
                if isinstance(placement, Shard):
                    if placement.dim != 0:
                        raise ValueError(
                            f"gradient sharded on dim {placement.dim}: rows need Shard(0)"
                        )
                    found.add((grad.device_mesh, dim))
    if len(found) > 1:
        raise ValueError(
            f"gradients sharded over {len(found)} mesh dimensions; the row order needs one"
        )
    if not found:
        return None, 1
    mesh, dim = found.pop()
    return mesh.get_group(dim), mesh.size(dim)


@torch.no_grad()
def layout_invariant_grad_norm(model: nn.Module) -> torch.Tensor:
    """The L2 norm of all of ``model``'s gradients, bitwise the same for any data-parallel sharding.

    Returns:
        0-dim fp32 tensor on the gradients' device, the same on every rank (0.0 with no gradient).

    Raises:
        ValueError: see :func:`_shard_group`.
    """
    grads = [p.grad for _, p in model.named_parameters() if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    group, size = _shard_group(grads)
    pieces, spans = (
        [],
        [],
    )  # each parameter's padded rows per rank: ceil(rows / size), FSDP2's chunk size
    for grad in grads:
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        rows = (
            local.float().reshape(local.shape[0], -1) if local.ndim else local.float().reshape(1, 1)
        )
        row_squares = (rows * rows).sum(dim=1)  # (local rows,)
        n_rows = grad.shape[0] if grad.ndim else 1
        chunk = math.ceil(n_rows / size)
        pieces.append(torch.cat([row_squares, row_squares.new_zeros(chunk - row_squares.numel())]))
        spans.append((chunk, n_rows))
    local_rows = torch.cat(pieces)
    if size > 1:
        gathered = local_rows.new_empty(size * local_rows.numel())
        dist.all_gather_single(gathered, local_rows, group=group)
        gathered = gathered.view(size, -1)  # (ranks, padded rows of every parameter)
    else:
        gathered = local_rows.unsqueeze(0)
    per_param, offset = [], 0
    for chunk, n_rows in spans:
        per_param.append(
            gathered[:, offset : offset + chunk].reshape(-1)[:n_rows].sum()
        )  # global row order
        offset += chunk
    return torch.stack(per_param).sum().sqrt()


@torch.no_grad()
def clip_grad_norm_layout_invariant_(model: nn.Module, max_norm: float) -> torch.Tensor:
    """:func:`layout_invariant_grad_norm`, then every gradient scaled by
    ``min(1, max_norm / (norm + 1e-6))`` (torch's ``clip_grads_with_norm_``, elementwise); a
    non-finite norm leaves the gradients as they are.

    Returns:
        The norm before clipping (0-dim fp32), for the caller to log or check.
    """
    norm = layout_invariant_grad_norm(model)
    params = [p for p in model.parameters() if p.grad is not None]
    if params:
        finite = torch.where(torch.isfinite(norm), norm, 0.0)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, finite, foreach=True)
    return norm
