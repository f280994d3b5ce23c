"""Expert parallelism (GShard, arXiv 2006.16668; torchtitan's ``ExpertParallel``): each rank of the
``ep`` mesh holds ``num_experts / ep`` whole experts, and the (token, expert) pairs travel to the
rank of their expert and back with two ``all_to_all_single`` of uneven splits.

Notes in docs/design.md: "on the token dispatch under expert parallelism", "on expert parallelism
borrowing tensor-parallel ranks", "on the experts' output".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle


@dataclass
class _Routed:
    """What :meth:`ExpertParallel._dispatch` keeps for the combine of the same forward."""

    order: (
        torch.Tensor
    )  # (T * k,) int64: position of each sorted pair in the flattened (T, k) routing
    weights: torch.Tensor  # (T, k) router weights
    send: list[int]  # rows sent to each EP rank
    receive: list[int]  # rows received from each EP rank
    num_tokens: int  # T before the tensor-parallel split


class ExpertParallel(ParallelStyle):
    """Shard a grouped-experts module's parameters by whole experts over ``ep_mesh`` (``Shard(0)``
    on the expert dimension) and dispatch its tokens with all-to-all (see the notes in this module).

    The module is called as ``experts(x, indices, weights)`` with ``x`` ``(T, dim)``, int64 global
    expert ids ``indices`` and router ``weights`` ``(T, k)``, returns ``(T, dim)``, has a
    ``num_experts`` attribute, and runs its experts on the local shards of its parameters
    (``models/common/experts.py``).

    Args:
        tp_mesh: the tensor-parallel mesh when the MoE layer runs replicated on ``tp > 1`` ranks
            (see the note on expert parallelism borrowing tensor-parallel ranks), else ``None``.

    Raises:
        ValueError: (at apply time) ``num_experts`` not a multiple of the mesh size.
    """

    def __init__(self, tp_mesh: DeviceMesh | None = None):
        super().__init__()
        self.tp_mesh = tp_mesh
        self._routed: _Routed | None = None

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        ep = device_mesh.size()
        if module.num_experts % ep:
            raise ValueError(
                f"expert_parallel_degree {ep} does not divide num_experts {module.num_experts} "
                "(each rank holds whole experts); pick a divisor"
            )
        self.num_experts, self.ep = module.num_experts, ep
        self.group = device_mesh.get_group()
        return distribute_module(
            module, device_mesh, _shard_experts, input_fn=self._dispatch, output_fn=self._combine
        )

    def _tp_split(self, tensor: torch.Tensor) -> torch.Tensor:
        """This tensor-parallel rank's share of the rows of a tensor replicated over ``tp_mesh``."""
        return (
            DTensor.from_local(tensor, self.tp_mesh, [Replicate()], run_check=False)
            .redistribute(placements=[Shard(0)])
            .to_local()
        )

    def _dispatch(
        self, module: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh
    ) -> tuple[torch.Tensor, ...]:
        """``(x, indices, weights)`` of the rank's tokens -> ``(rows, local ids, ones)`` of the rows
        its experts run: steps 1-4 of the note on the token dispatch."""
        x, indices, weights = inputs
        num_tokens = x.shape[0]
        if self.tp_mesh is not None:
            x, indices, weights = (self._tp_split(t) for t in (x, indices, weights))
        top_k = indices.shape[1]
        flat = indices.reshape(-1)  # (T * k,)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(
            flat, minlength=self.num_experts
        )  # (E,): [destination rank, its local expert]
        received = torch.empty_like(counts)  # (E,): [source rank, my local expert]
        dist.all_to_all_single(received, counts, group=self.group)
        send, receive = torch.stack(
            [counts.view(self.ep, -1).sum(1), received.view(self.ep, -1).sum(1)]
        ).tolist()
        rows = all_to_all_single_autograd(
            x.index_select(0, order // top_k), receive, send, self.group
        )
        local = self.num_experts // self.ep
        local_ids = (
            torch.arange(local, device=flat.device)
            .repeat(self.ep)
            .repeat_interleave(received, output_size=sum(receive))
        )  # (R,) the local expert of each received row
        self._routed = _Routed(
            order=order, weights=weights, send=send, receive=receive, num_tokens=num_tokens
        )
        return (
            rows,
            local_ids[:, None],
            torch.ones(rows.shape[0], 1, dtype=weights.dtype, device=weights.device),
        )

    def _combine(self, module: nn.Module, out: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        """The experts' rows ``(R, dim)`` -> ``(T, dim)``: back to their origin, weighted and summed
        per token (steps 6 of the note; ``torchtitan_lite.models.common.token_dispatch.combine``'s
        order)."""
        routed, self._routed = self._routed, None
        back = all_to_all_single_autograd(
            out, routed.send, routed.receive, self.group
        )  # (T * k, dim), sorted
        top_k = routed.weights.shape[1]
        y = back * routed.weights.reshape(-1)[routed.order, None].to(back.dtype)
        combined = back.new_zeros(routed.weights.shape[0], back.shape[-1]).index_add(
            0, routed.order // top_k, y
        )
        if self.tp_mesh is not None:
            shape = (routed.num_tokens, combined.shape[-1])  # the shares may be uneven
            gathered = DTensor.from_local(
                combined,
                self.tp_mesh,
                [Shard(0)],
                run_check=False,
                shape=shape,
                stride=(shape[1], 1),
            ).redistribute(placements=[Replicate()])
            combined = (
                gathered.to_local().clone()
            )  # to_local() is a view: see the note on the experts' output
        return combined


def _shard_experts(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
    """Every parameter of the grouped-experts module itself becomes a ``Shard(0)`` DTensor on
    ``mesh``."""
    if name:
        return
    for param_name, param in list(module.named_parameters(recurse=False)):
        module.register_parameter(
            param_name,
            nn.Parameter(
                distribute_tensor(param, mesh, [Shard(0)]), requires_grad=param.requires_grad
            ),
        )
