"""``training.deterministic``: runs that are bitwise the same twice (``run``) or on any
data-parallel layout (``layout``).

Gradients (FSDP2, through its public hooks): each FSDP module's reduce-scatter is replaced by
:class:`_Exchange` (``FSDPModule.set_custom_reduce_scatter``), an ``all_to_all`` over the
data-parallel ranks that hands each shard's owner every rank's contribution to it (the bytes of a
reduce-scatter without HSDP), and the post-reduce hook (``FSDPModule.set_all_reduce_hook``, which
runs after HSDP's all-reduce and also on one rank) sums them: per source rank over its
micro-batches, then over ranks, in the tree above, and writes the sum into the reduce output on the
step's last micro-batch (zeros before, which FSDP2 accumulates exactly). HSDP's own all-reduce then
sums zeros and its result is overwritten. The loss sum follows the same tree
(:func:`canonical_loss_sum`), the gradient norm its own layout-free order
(``distributed/grad_norm.py``). MoE auxiliary losses are part of each micro-batch's forward;
expert-load counts are integers in fp32 (exact). AdamW runs ``foreach``: torch's fused CPU kernel
takes another rounding path in a tensor's tail elements, so a parameter's update depends on where
its shard ends (``tests/test_deterministic.py``).

Note: docs/design.md, "on the canonical order of cross-micro-batch sums".
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from torchtitan_lite.distributed.parallel_dims import ParallelDims

MODES = ("off", "run", "layout")
"""Values of ``training.deterministic``."""


class PairwiseSum:
    """The sum of a sequence of same-shape tensors in the pairwise tree over their index.

    ``push(x)`` adds the next item; ``push(x, level=j)`` the sum of the next aligned block of
    ``2**j`` items (a complete subtree). :meth:`finish` returns the sum (for a count that is not a
    power of two, the leftover subtrees are added from the smallest, the latest, to the largest, the
    earliest: ``earlier + later``) and starts over. Additions are elementwise, so rows of a stacked
    tensor are summed exactly as apart.
    """

    def __init__(self):
        self._levels: list[torch.Tensor | None] = []

    def push(self, x: torch.Tensor, level: int = 0) -> None:
        """Add ``x``, the sum of ``2**level`` items.

        Raises:
            ValueError: the items so far are not a multiple of ``2**level`` (the block is not
                aligned).
        """
        self._levels += [None] * (level + 1 - len(self._levels))
        if any(buf is not None for buf in self._levels[:level]):
            raise ValueError(
                f"PairwiseSum: a block of 2**{level} items pushed at a position not a multiple of "
                "it"
            )
        while self._levels[level] is not None:
            x, self._levels[level] = self._levels[level] + x, None
            level += 1
            self._levels += [None] * (level + 1 - len(self._levels))
        self._levels[level] = x

    def finish(self) -> torch.Tensor:
        """The sum of everything pushed since the last call.

        Raises:
            ValueError: nothing was pushed.
        """
        total = None
        for buf in self._levels:
            if buf is not None:
                total = buf if total is None else buf + total
        self._levels = []
        if total is None:
            raise ValueError("PairwiseSum.finish: nothing was pushed")
        return total


def optimizer_implementation(config) -> str:
    """``optimizer.implementation`` for the run: ``foreach`` in ``layout`` mode (see the module
    note), else as set."""
    return (
        "foreach" if config.training.deterministic == "layout" else config.optimizer.implementation
    )


class _Exchange:
    """FSDP2's reduce-scatter replaced by an ``all_to_all`` over the data-parallel ranks: each rank
    receives every rank's contribution to its shard, ``(D, shard numel)`` rows in data-parallel rank
    order, kept in ``received`` for the post-reduce hook; the reduce output is zeroed. It has the
    two methods of FSDP2's ``ReduceScatter`` interface (``allocate``, ``__call__``), which
    ``set_custom_reduce_scatter`` calls; the interface class itself lives in a private module, so it
    is not subclassed."""

    def __init__(self, dims: ParallelDims):
        self.group, self.dp_shard, self.dp_replicate = (
            dims.dp_group,
            dims.dp_shard,
            dims.dp_replicate,
        )
        self.received: torch.Tensor | None = None

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group,
        op,
        async_op: bool = False,
    ):
        chunks = input_tensor.view(self.dp_shard, -1)  # row s: the contribution to shard s
        send = (
            chunks.repeat(self.dp_replicate, 1) if self.dp_replicate > 1 else chunks
        )  # dp rank r*S + s: shard s
        self.received = torch.empty_like(send)
        dist.all_to_all_single(self.received, send, group=self.group)
        output_tensor.zero_()
        return None


class _CanonicalReduction:
    """One FSDP module's gradient sum in the canonical tree (module note): :class:`_Exchange` and
    the post-reduce hook :meth:`__call__`, which counts the rank's ``micro_batches`` backwards of a
    step."""

    def __init__(self, dims: ParallelDims, micro_batches: int):
        self.exchange = _Exchange(dims) if dims.dp_degree > 1 else None
        self.micro_batches, self.block_level = micro_batches, micro_batches.bit_length() - 1
        self.per_source = PairwiseSum()
        self.done = 0

    def __call__(self, reduce_output: torch.Tensor) -> None:
        if self.exchange is None:
            rows = reduce_output.unsqueeze(
                0
            ).clone()  # (1, numel): one rank, the output is its own gradient
        else:
            rows, self.exchange.received = self.exchange.received, None
        self.per_source.push(rows)
        self.done += 1
        if self.done < self.micro_batches:
            reduce_output.zero_()
            return
        self.done = 0
        blocks = self.per_source.finish()  # (D, numel): each rank's block sum
        over_ranks = PairwiseSum()
        for block in blocks:
            over_ranks.push(block, level=self.block_level)
        reduce_output.copy_(over_ranks.finish())


def install_canonical_reduction(model: nn.Module, dims: ParallelDims, micro_batches: int) -> int:
    """Sum ``model``'s gradients over micro-batches and data-parallel ranks in the canonical tree
    (module note).

    Args:
        model: parallelized by ``apply_fsdp`` (every FSDP module gets its own reduction).
        dims: the layout (data parallelism only: :func:`check_deterministic`).
        micro_batches: backwards per rank per optimizer step, ``m``.

    Returns:
        The number of FSDP modules changed.
    """
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for module in modules:
        reduction = _CanonicalReduction(dims, micro_batches)
        if reduction.exchange is not None:
            module.set_custom_reduce_scatter(reduction.exchange)
        module.set_all_reduce_hook(reduction)
    return len(modules)


def canonical_loss_sum(
    micro_losses: PairwiseSum, dims: ParallelDims, micro_batches: int
) -> torch.Tensor:
    """The step's summed token cross-entropy over all ranks in the canonical tree, on data-parallel
    rank 0, and 0.0 on the others, so that the trainer's all-reduce (SUM) gives every rank exactly
    that sum.

    Args:
        micro_losses: this rank's micro-batch losses (0-dim fp32), pushed in order.
        dims: the layout; one ``all_gather`` over ``dims.dp_group``.
        micro_batches: ``m``, micro-batches per rank.
    """
    block = micro_losses.finish()
    if dims.dp_degree == 1:
        return block
    blocks = torch.empty(dims.dp_degree, dtype=block.dtype, device=block.device)
    dist.all_gather_single(blocks, block.reshape(1), group=dims.dp_group)
    total = PairwiseSum()
    for value in blocks:
        total.push(value, level=micro_batches.bit_length() - 1)
    total = total.finish()
    return total if dims.dp_rank == 0 else torch.zeros_like(total)
