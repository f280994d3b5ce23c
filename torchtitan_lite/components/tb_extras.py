"""TensorBoard extras: weight histograms ``weights/<names>`` (tied tensors once, as
``output.weight=tok_embeddings.weight``) and gradient norms ``grad_norm/<group>`` (a block
``layers.<i>`` or a top-level module). Both are collective under FSDP2 (every rank, same order);
rank 0's writer writes.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.tensorboard import SummaryWriter

from torchtitan_lite.init.apply import tensor_groups


def log_weight_histograms(writer: SummaryWriter | None, model: nn.Module, step: int) -> None:
    """Write one histogram per tensor (``weights/<names>``) at ``step`` (0 = at init).

    Each DTensor is gathered in full, one at a time (peak extra memory: the largest tensor), on
    every rank; non-finite values are dropped from the histogram (TensorBoard rejects them). Under
    pipeline parallelism rank 0's writer gets the tensors of rank 0's stages only.
    """
    for names, tensor in sorted(tensor_groups(model), key=lambda group: group[0]):
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if writer is not None:
            values = full.detach().float().reshape(-1).cpu()
            writer.add_histogram(f"weights/{'='.join(names)}", values[torch.isfinite(values)], step)


def grad_group(name: str) -> str:
    """The grad-norm group of a canonical parameter name: ``layers.3.attention.wq.weight`` ->
    ``layers.3``, ``tok_embeddings.weight`` -> ``tok_embeddings``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "layers" and len(parts) > 2 else parts[0]


def layer_grad_norms(model: nn.Module) -> dict[str, float]:
    """group -> L2 norm of the current gradients (full tensors; fp32), per :func:`grad_group`, in
    model order.

    Call between ``backward`` and ``zero_grad``, on every rank. A tied tensor counts once, in its
    first name's group. Each rank adds the squares of its local shards, each divided by the number
    of ranks holding a copy of that shard (the sizes of its DTensor's non-sharded mesh dimensions; a
    plain tensor: every rank), and one ``all_reduce`` over all ranks sums them: any layout (FSDP,
    TP, HSDP, stages on other ranks) counts every element once (exactly when the copies are a power
    of two, else up to rounding). The reduced vector has every rank's groups: ranks holding
    different tensors (pipeline stages) agree on them with one ``all_gather_object`` (groups in rank
    order, each rank's in model order).
    """
    groups: dict[str, int] = {}
    indices: list[int] = []
    squares: list[torch.Tensor] = []
    world = dist.get_world_size() if dist.is_initialized() else 1
    for names, tensor in tensor_groups(model):
        grad = getattr(tensor, "grad", None)
        if grad is None:
            continue
        indices.append(groups.setdefault(grad_group(names[0]), len(groups)))
        if isinstance(grad, DTensor):
            mesh, placements, local = grad.device_mesh, grad.placements, grad.to_local()
            copies = math.prod(
                mesh.size(dim)
                for dim, placement in enumerate(placements)
                if not placement.is_shard()
            )
        else:
            local, copies = grad, world
        squares.append(local.detach().float().square().sum() / copies)
    names = list(groups)
    if world > 1:
        gathered: list[list[str] | None] = [None] * world
        dist.all_gather_object(gathered, names)
        names = list(dict.fromkeys(name for rank_names in gathered for name in rank_names))
    if not squares:
        return {}
    slot = [names.index(name) for name in groups]  # local group index -> position in names
    values = torch.stack(squares)
    sums = torch.zeros(len(names), device=values.device).index_add_(
        0, torch.tensor([slot[i] for i in indices], device=values.device), values
    )
    if world > 1:
        dist.all_reduce(sums)
    return dict(zip(names, sums.sqrt().tolist(), strict=True))


def log_layer_grad_norms(
    writer: SummaryWriter | None, model: nn.Module, step: int
) -> dict[str, float]:
    """:func:`layer_grad_norms`, written as ``grad_norm/<group>`` scalars at ``step``; returns
    them."""
    norms = layer_grad_norms(model)
    if writer is not None:
        for group, norm in norms.items():
            writer.add_scalar(f"grad_norm/{group}", norm, step)
    return norms
