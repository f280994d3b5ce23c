"""TensorBoard extras: weight histograms ``weights/<names>`` (tied tensors once, as
``output.weight=tok_embeddings.weight``) and gradient norms ``grad_norm/<group>`` (a block ``layers.<i>`` or a
top-level module). Both are collective under FSDP2 (every rank, same order); rank 0's writer writes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard
from torch.utils.tensorboard import SummaryWriter

from torchtitan_lite.init.apply import tensor_groups


def log_weight_histograms(writer: SummaryWriter | None, model: nn.Module, step: int) -> None:
    """Write one histogram per tensor (``weights/<names>``) at ``step`` (0 = at init).

    Each DTensor is gathered in full, one at a time (peak extra memory: the largest tensor), on every
    rank; non-finite values are dropped from the histogram (TensorBoard rejects them).
    """
    for names, tensor in sorted(tensor_groups(model), key=lambda group: group[0]):
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if writer is not None:
            values = full.detach().float().reshape(-1).cpu()
            writer.add_histogram(f"weights/{'='.join(names)}", values[torch.isfinite(values)], step)


def grad_group(name: str) -> str:
    """The grad-norm group of a canonical parameter name: ``layers.3.attention.wq.weight`` -> ``layers.3``,
    ``tok_embeddings.weight`` -> ``tok_embeddings``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "layers" and len(parts) > 2 else parts[0]


def layer_grad_norms(model: nn.Module) -> dict[str, float]:
    """group -> L2 norm of the current gradients (full tensors; fp32), per :func:`grad_group`, in model order.

    Call between ``backward`` and ``zero_grad``, on every rank. A tied tensor counts once, in its first name's
    group; sharded gradients add their local squares with one ``all_reduce`` over a vector of every rank's groups
    (ranks holding different tensors, as pipeline stages do, agree on it with one ``all_gather_object``: groups
    in rank order, each rank's in model order).
    """
    groups: dict[str, int] = {}
    keys: list[tuple[int, bool]] = []
    squares: list[torch.Tensor] = []
    for names, tensor in tensor_groups(model):
        grad = getattr(tensor, "grad", None)
        if grad is None:
            continue
        index = groups.setdefault(grad_group(names[0]), len(groups))
        sharded = isinstance(grad, DTensor) and any(isinstance(p, Shard) for p in grad.placements)
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        keys.append((index, sharded))
        squares.append(local.detach().float().square().sum())
    names = list(groups)
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    if distributed:
        gathered: list[list[str] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, names)
        names = list(dict.fromkeys(name for rank_names in gathered for name in rank_names))
    if not names:
        return {}
    slot = [names.index(name) for name in groups]  # local group index -> index in names
    device = squares[0].device if squares else torch.device("cpu")
    sharded_sum = torch.zeros(len(names), device=device)
    plain_sum = torch.zeros(len(names), device=device)
    for (index, sharded), value in zip(keys, squares):
        (sharded_sum if sharded else plain_sum)[slot[index]] += value
    if distributed:
        dist.all_reduce(sharded_sum)
    norms = (sharded_sum + plain_sum).sqrt().tolist()
    return dict(zip(names, norms))


def log_layer_grad_norms(writer: SummaryWriter | None, model: nn.Module, step: int) -> dict[str, float]:
    """:func:`layer_grad_norms`, written as ``grad_norm/<group>`` scalars at ``step``; returns them."""
    norms = layer_grad_norms(model)
    if writer is not None:
        for group, norm in norms.items():
            writer.add_scalar(f"grad_norm/{group}", norm, step)
    return norms
