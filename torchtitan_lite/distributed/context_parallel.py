"""Context parallelism: a window's positions split over the ``cp`` ranks of a group, keys and
values all-gathered.

Note: docs/design.md, "on the load-balanced split".
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from torchtitan_lite.protocols.attention import WindowAware


def chunk_positions(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """int64 ``(seq_len // cp,)``: the window positions rank ``cp_rank`` of ``cp`` holds, in its
    local order (chunks ``cp_rank`` and ``2 cp - 1 - cp_rank``, module note).

    Raises:
        ValueError: ``seq_len`` not a multiple of ``2 * cp``.
    """
    if seq_len % (2 * cp):
        raise ValueError(
            f"context parallelism: seq_len {seq_len} is not a multiple of 2 x cp = {2 * cp}"
        )
    c = seq_len // (2 * cp)
    first, second = cp_rank * c, (2 * cp - 1 - cp_rank) * c
    return torch.cat([torch.arange(first, first + c), torch.arange(second, second + c)])


def split_sequence(t: torch.Tensor, cp: int, cp_rank: int) -> torch.Tensor:
    """Rank ``cp_rank``'s positions of ``t`` ``(bs, seq_len, ...)``: ``(bs, seq_len // cp, ...)``
    (:func:`chunk_positions`)."""
    return t[:, chunk_positions(t.shape[1], cp, cp_rank).to(t.device)]


class _GatherRanks(torch.autograd.Function):
    """``x`` -> ``(cp, *x.shape)``, every rank's ``x`` in rank order; backward: rank ``i``'s
    gradient is the sum of every rank's gradient for slot ``i``, received by ``all_to_all`` and
    added in rank order."""

    @staticmethod
    def forward(ctx, x, group, size):
        ctx.group, ctx.size = group, size
        out = x.new_empty(size * x.shape[0], *x.shape[1:])  # gloo wants the ranks along dim 0
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out.view(size, *x.shape)

    @staticmethod
    def backward(ctx, grad):
        received = torch.empty_like(grad)
        # received[j]: rank j's gradient for this rank's slot
        dist.all_to_all_single(received, grad.contiguous(), group=ctx.group)
        total = received[0]
        for j in range(1, ctx.size):
            total = total + received[j]
        return total, None, None


class _SumRanks(torch.autograd.Function):
    """``x`` summed over the group (all-reduce), on every rank; backward: the gradients summed
    the same way."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        total = grad.clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


class ContextParallel:
    """One rank's share of the windows under context parallelism (module note), what the attention
    kernels and MoE layers read (``models/common/attention_backends.py``, ``models/common/moe.py``).

    Args:
        group: the context-parallel process group (``ParallelDims.cp_mesh``).
        cp: its size, >= 2; ``cp_rank``: this rank's index in it.
        seq_len: the window length, a multiple of ``2 * cp``.

    Attributes:
        chunks: ``[(local_start, local_end, global_start)]`` of this rank's two chunks, in local
            order.
    """

    def __init__(self, group: dist.ProcessGroup, cp: int, cp_rank: int, seq_len: int):
        self.group, self.cp, self.cp_rank, self.seq_len = group, cp, cp_rank, seq_len
        c = seq_len // (2 * cp)
        self.chunks = [(0, c, cp_rank * c), (c, 2 * c, (2 * cp - 1 - cp_rank) * c)]

    def split(
        self, inputs: torch.Tensor, labels: torch.Tensor, documents: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """This rank's positions of a batch: ``inputs`` and ``labels`` ``(bs, seq_len)``, and the
        model's document keywords (``document_ids``, ``positions``; ``data/documents.py``), with
        ``positions`` (RoPE) always given: ``0 .. seq_len - 1`` when ``documents`` has none."""
        if "positions" not in documents:
            arange = torch.arange(inputs.shape[1], device=inputs.device)
            documents = {**documents, "positions": arange.expand(inputs.shape[0], -1)}
        local = {key: self._local(value) for key, value in documents.items()}
        return self._local(inputs), self._local(labels), local

    def _local(self, t: torch.Tensor) -> torch.Tensor:
        return split_sequence(t, self.cp, self.cp_rank)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the group, the same on every rank, with autograd: a statistic of the
        whole window from each rank's share of it (the MoE balance losses,
        ``models/common/balance_loss.py``)."""
        return _SumRanks.apply(x, self.group)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """The whole window of ``x`` ``(bs, seq_len // cp, ...)`` in position order:
        ``(bs, seq_len, ...)``; with autograd (gradients summed over the group in rank order). A
        DTensor (tensor parallelism) is gathered in its local tensor and keeps its placements."""
        if isinstance(x, DTensor):
            whole = self.gather(x.to_local())
            return DTensor.from_local(whole, x.device_mesh, x.placements, run_check=False)
        bs, local, *rest = x.shape
        c = local // 2
        g = _GatherRanks.apply(x, self.group, self.cp)  # (cp, bs, 2c, ...): chunks j, 2cp-1-j
        g = g.view(self.cp, bs, 2, c, *rest).movedim(0, 2)  # (bs, 2, cp, c, ...)
        whole = torch.cat([g[:, 0], g[:, 1].flip(1)], dim=1)  # (bs, 2cp, c, ...) in chunk order
        return whole.reshape(bs, self.seq_len, *rest)


def set_context_parallel(model: torch.nn.Module, cp: ContextParallel | None) -> None:
    """Give every ``WindowAware`` module of ``model`` (attention kernels, MoE layers) the rank's
    share ``cp`` (``None``: whole windows)."""
    for module in model.modules():
        if isinstance(module, WindowAware):
            module.cp = cp
