"""The training loss: summed token cross-entropy in fp32 (the trainer divides by the step's global
token count, see the note on the loss over a global batch in ``train.py``); evaluation uses the same
function."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.distributed.compile import compiles


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed token cross-entropy in fp32: logits ``(bs, seqlen, V)``, labels ``(bs, seqlen)`` ->
    0-dim tensor.

    ``logits`` may be a ``Shard(-1)`` DTensor (tensor parallelism with loss parallelism: call it,
    and the backward, inside
    :func:`~torchtitan_lite.distributed.tensor_parallel.loss_parallel_context`); the loss, the same
    on every rank of the tensor-parallel group, is returned as a plain tensor.
    """
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum")
    return loss.to_local() if isinstance(loss, DTensor) else loss


def build_loss_fn(
    config: JobConfig, device: torch.device
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The training loss: :func:`cross_entropy_sum`, ``torch.compile``-d with ``compile.backend``
    when ``compile.enable`` and ``"loss" in compile.components`` and the backend works on ``device``
    (else eager, after one warning line). Same signature and value as :func:`cross_entropy_sum`."""
    cfg = config.compile
    if compiles(cfg.enable, cfg.components, cfg.backend, device.type, "loss"):
        return torch.compile(cross_entropy_sum, backend=cfg.backend)
    return cross_entropy_sum
