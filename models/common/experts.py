"""Routed experts stored as 3-D weights (FSDP2 shards dim 0, the expert dimension), run with one
grouped matmul per projection over all experts (``models/common/token_dispatch.py``, no host sync).

Both classes map ``x`` ``(T, dim)``, ``indices``/``weights`` ``(T, k)`` to
``out[t] = sum_j weights[t, j] * expert_{indices[t, j]}(x[t])``, ``(T, dim)`` in the dtype of ``x``.
Under expert parallelism (``torchtitan_lite/distributed/expert_parallel.py``) their parameters are
``Shard(0)`` DTensors and the forward runs the rank's experts (:func:`local_experts`) on the rows
sent to them, ``indices`` then local expert ids.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from torchtitan_lite.models.common.token_dispatch import (
    combine,
    dispatch,
    grouped_linear,
    scatter_rows,
)

Activation = Callable[[torch.Tensor], torch.Tensor]
"""Expert activation: the fused ``mlp1`` output ``(..., 2 * hidden_dim)`` ->
``(..., hidden_dim)``."""


def local_experts(param: torch.Tensor) -> torch.Tensor:
    """The rank's experts of a stacked parameter ``(E, ...)``: the local shard of a DTensor (expert
    parallelism), else the tensor itself."""
    return param.to_local() if isinstance(param, DTensor) else param


def clamped_swiglu(x: torch.Tensor, limit: float = 7.0, alpha: float = 1.702) -> torch.Tensor:
    """GPT-OSS's clamped SwiGLU on the interleaved fused projection (reference ``swiglu``).

    ``gate = x[..., ::2]`` clamped above at ``limit``; ``up = x[..., 1::2]`` clamped to
    ``[-limit, limit]``; result ``gate * sigmoid(alpha * gate) * (up + 1)``. ``alpha = 1.702`` makes
    ``gate * sigmoid(alpha * gate)`` the sigmoid approximation of GELU (Hendrycks & Gimpel 2016);
    ``limit = 7.0`` and the ``+ 1`` on the linear half are from the model card / reference code.
    Gradients are zero where an input is clamped.

    Args:
        x: ``(..., 2 * hidden_dim)``, gate and up features interleaved (even, odd positions).
        limit: clamp bound (``swiglu_limit``).
        alpha: sigmoid slope.

    Returns:
        ``(..., hidden_dim)`` in the dtype of ``x``.

    Raises:
        ValueError: odd last dimension or a non-positive ``limit``.
    """
    if x.shape[-1] % 2:
        raise ValueError(
            f"clamped_swiglu: last dim must be even (interleaved gate/up), got {x.shape[-1]}"
        )
    if not limit > 0:
        raise ValueError(f"clamped_swiglu: limit must be > 0, got {limit}")
    gate = x[..., ::2].clamp(max=limit)
    up = x[..., 1::2].clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


class GroupedExperts(nn.Module):
    """``num_experts`` biased two-layer FFNs with a fused gate/up projection (GPT-OSS reference
    ``MLPBlock`` layout; HF ``GptOssExperts``).

    Parameters (``E`` = ``num_experts``):
      * ``mlp1_weight`` ``(E, 2 * hidden_dim, dim)``, ``mlp1_bias`` ``(E, 2 * hidden_dim)``: the
        fused gate/up projection (interleaved rows for :func:`clamped_swiglu`);
      * ``mlp2_weight`` ``(E, dim, hidden_dim)``, ``mlp2_bias`` ``(E, dim)``: the down projection.

    Args:
        num_experts: ``E``.
        dim: model width.
        hidden_dim: expert inner width (GPT-OSS ``moe_inter_dim``, HF ``intermediate_size``: 2880).
        activation: maps ``(..., 2 * hidden_dim)`` to ``(..., hidden_dim)``.
    """

    def __init__(self, num_experts: int, dim: int, hidden_dim: int, activation: Activation):
        super().__init__()
        self.num_experts = num_experts
        self.activation = activation
        self.mlp1_weight = nn.Parameter(torch.empty(num_experts, 2 * hidden_dim, dim))
        self.mlp1_bias = nn.Parameter(torch.empty(num_experts, 2 * hidden_dim))
        self.mlp2_weight = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.mlp2_bias = nn.Parameter(torch.empty(num_experts, dim))

    def forward(
        self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """See the module docstring: ``x`` ``(T, dim)``, int64 ``indices`` in ``[0, num_experts)``
        and ``weights`` ``(T, k)`` -> ``(T, dim)``."""
        mlp1_weight, mlp1_bias, mlp2_weight, mlp2_bias = (
            local_experts(p)
            for p in (self.mlp1_weight, self.mlp1_bias, self.mlp2_weight, self.mlp2_bias)
        )
        plan = dispatch(indices, mlp1_weight.shape[0])
        h = grouped_linear(scatter_rows(x, plan), mlp1_weight, plan)  # (num_rows, 2 * hidden_dim)
        h = self.activation(
            h + mlp1_bias.index_select(0, plan.group_expert)
        )  # (num_rows, hidden_dim)
        out = grouped_linear(h, mlp2_weight, plan)  # (num_rows, dim)
        out = out + mlp2_bias.index_select(0, plan.group_expert)
        return combine(out, weights, plan, indices.shape[0])


class GroupedSwiGLUExperts(nn.Module):
    """``num_experts`` bias-free SwiGLU FFNs ``w2(silu(w1 x) * w3 x)`` (DeepSeek-V3 reference
    ``Expert``, stacked; HF ``Qwen3MoeExperts``: ``gate_up_proj`` = ``cat([w1, w3], 1)``,
    ``down_proj`` = w2).

    Parameters: ``w1``, ``w3`` ``(E, hidden_dim, dim)``; ``w2`` ``(E, dim, hidden_dim)``.

    Args:
        num_experts: ``E``.
        dim: model width.
        hidden_dim: expert inner width (``moe_inter_dim``).
    """

    def __init__(self, num_experts: int, dim: int, hidden_dim: int):
        super().__init__()
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))

    def forward(
        self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """See the module docstring: ``x`` ``(T, dim)``, ``indices``/``weights`` ``(T, k)`` ->
        ``(T, dim)``."""
        w1, w2, w3 = (local_experts(p) for p in (self.w1, self.w2, self.w3))
        plan = dispatch(indices, w1.shape[0])
        buffer = scatter_rows(x, plan)  # (num_rows, dim)
        h = F.silu(grouped_linear(buffer, w1, plan)) * grouped_linear(buffer, w3, plan)
        return combine(grouped_linear(h, w2, plan), weights, plan, indices.shape[0])
