"""TensorBoard extras for debug runs: weight histograms and per-layer gradient norms.

``metrics.MetricsLogger`` already writes ``loss/train``, ``loss/validation``, ``lr``, ``tokens_seen``,
``grad_norm`` and the MoE expert load; these add what an init or stability investigation needs.
Both functions are collective under FSDP2 (call them on every rank, in the same order); only the
rank holding a writer (rank 0, ``writer`` is ``None`` elsewhere) writes.

Tags: ``weights/<name>`` (histogram of every parameter and persistent buffer, tied tensors once,
named ``output.weight=tok_embeddings.weight``) and ``grad_norm/<group>`` (L2 norm of the gradients of
one block ``layers.<i>``, or of a top-level module: ``tok_embeddings``, ``norm``, ``output``).
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
    """L2 norm of the current gradients per :func:`grad_group`, over the full (unsharded) tensors.

    Call after ``backward`` and before ``zero_grad``. Parameters without a gradient are skipped; a
    tied tensor counts once, in the group of its first name (``output``). Sharded (``Shard``) DTensor
    gradients add their local squares over ranks with one ``all_reduce``.

    Returns:
        group -> norm (fp32 sums of squares, then sqrt), in model order.
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
    if not squares:
        return {}
    values = torch.stack(squares)
    device = values.device
    sharded_sum = torch.zeros(len(groups), device=device)
    plain_sum = torch.zeros(len(groups), device=device)
    for (index, sharded), value in zip(keys, values):
        (sharded_sum if sharded else plain_sum)[index] += value
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sharded_sum)
    norms = (sharded_sum + plain_sum).sqrt().tolist()
    return dict(zip(groups, norms))


def log_layer_grad_norms(writer: SummaryWriter | None, model: nn.Module, step: int) -> dict[str, float]:
    """:func:`layer_grad_norms`, written as ``grad_norm/<group>`` scalars at ``step``; returns them."""
    norms = layer_grad_norms(model)
    if writer is not None:
        for group, norm in norms.items():
            writer.add_scalar(f"grad_norm/{group}", norm, step)
    return norms
