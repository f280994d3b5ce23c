"""MoE routers: which ``k`` experts each token goes to, and with which gating weights.

Both return a :class:`RouterOutput` for ``T`` tokens and ``E`` experts, which
:class:`torchtitan_lite.models.common.moe.MoE` passes to its experts and its auxiliary loss.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn


class RouterOutput(NamedTuple):
    """What a router returns for ``T`` tokens and ``E`` experts, top-``k``.

    Attributes:
        weights: ``(T, k)`` gating weights of the chosen experts, in the dtype of the input.
        indices: ``(T, k)`` int64 expert ids.
        probs: ``(T, E)`` fp32 router probabilities (or unbiased affinity scores) over all experts,
            for the auxiliary losses.
    """

    weights: torch.Tensor
    indices: torch.Tensor
    probs: torch.Tensor


class TopKRouter(nn.Module):
    """Softmax over the top-k router logits (GPT-OSS reference ``MLPBlock.forward``; HF
    ``GptOssTopKRouter``).

    ``logits = gate(x)`` (a linear layer with bias), the ``top_k`` largest are kept and their
    softmax gives the weights (they sum to 1 per token). ``probs`` is the softmax over all logits.

    Args:
        dim: input width.
        num_experts: ``E``.
        top_k: experts per token (GPT-OSS: 4).

    Raises:
        ValueError: ``top_k`` not in ``1 .. num_experts``.
    """

    def __init__(self, dim: int, num_experts: int, top_k: int):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(
                f"TopKRouter: top_k must be in 1..num_experts ({num_experts}), got {top_k}"
            )
        self.top_k = top_k
        self.gate = nn.Linear(dim, num_experts, bias=True)

    def forward(self, x: torch.Tensor) -> RouterOutput:
        """``x`` ``(T, dim)`` -> :class:`RouterOutput`."""
        logits = self.gate(x).float()  # (T, E)
        top_logits, indices = torch.topk(logits, self.top_k, dim=-1)  # (T, k)
        weights = torch.softmax(top_logits, dim=-1).to(x.dtype)
        return RouterOutput(weights, indices, torch.softmax(logits, dim=-1))


class TokenChoiceTopKRouter(nn.Module):
    """Token-choice top-k over affinity scores, with a balancing bias and group-limited routing (the
    DeepSeek-V3 gate; torchtitan ``TokenChoiceTopKRouter``).

    Source: DeepSeek-V3 report (arXiv 2412.19437) eq. 12-16 and sec. 2.1.2; reference
    ``Gate.forward`` of deepseek-ai/DeepSeek-V3 ``inference/model.py`` (the ``masked_fill(-inf)``
    version); HF ``DeepseekV3TopkRouter``/``get_topk_indices``. Steps for ``T`` tokens and ``E``
    experts:
      1. ``s = sigmoid(gate(x))`` or ``softmax(gate(x))``, fp32 ``(T, E)``;
      2. choice scores ``s + expert_bias`` (auxiliary-loss-free balancing: the bias steers the
         choice only); with ``num_expert_groups > 1`` each group is scored by the sum of its 2 best
         choice scores (the reference's constant; the report's ``K_r / M`` = 8 / 4 for V3), and
         experts outside the ``num_limited_groups`` best groups are excluded (``-inf``);
      3. ``indices`` = the ``top_k`` best choice scores (distinct experts);
      4. ``weights = s[indices]``, divided by their sum when ``route_norm`` (plus 1e-20 as HF,
         against an all-underflowed sigmoid), times ``route_scale``.
    Qwen3-MoE's router (HF ``Qwen3MoeSparseMoeBlock``) is the case softmax, one group,
    ``route_scale`` 1 and a bias kept at zero.

    Args:
        dim: input width.
        num_experts: ``E``.
        top_k: experts per token.
        num_expert_groups, num_limited_groups: expert groups and how many a token may use.
        score_func: ``"sigmoid"`` or ``"softmax"``.
        route_norm: normalize the chosen scores.
        route_scale: gating weight multiplier.
        bias_update_speed: ``gamma``, read by
            :func:`torchtitan_lite.models.common.expert_bias.update_expert_bias`.

    Attributes:
        gate: ``nn.Linear(dim, num_experts, bias=False)``.
        expert_bias: persistent fp32 buffer ``(num_experts,)``, used only in step 2; never a
            Parameter (the optimizer never sees it), moved once per optimizer step by
            :func:`torchtitan_lite.models.common.expert_bias.update_expert_bias`.
    """

    def __init__(
        self,
        dim: int,
        num_experts: int,
        top_k: int,
        num_expert_groups: int,
        num_limited_groups: int,
        score_func: str,
        route_norm: bool,
        route_scale: float,
        bias_update_speed: float,
    ):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.num_expert_groups, self.num_limited_groups = num_expert_groups, num_limited_groups
        self.score_func, self.route_norm, self.route_scale = score_func, route_norm, route_scale
        self.bias_update_speed = bias_update_speed
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.register_buffer("expert_bias", torch.empty(num_experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> RouterOutput:
        """``x`` ``(T, dim)`` -> :class:`RouterOutput`: weights ``(T, top_k)`` in ``x.dtype``, int64
        indices ``(T, top_k)``, and the unbiased fp32 scores ``(T, E)`` as ``probs``."""
        logits = self.gate(x).float()  # (T, E)
        scores = (
            torch.sigmoid(logits) if self.score_func == "sigmoid" else torch.softmax(logits, dim=-1)
        )
        choice = scores.detach() + self.expert_bias  # (T, E), no gradient through the choice
        if self.num_expert_groups > 1:
            grouped = choice.view(x.shape[0], self.num_expert_groups, -1)  # (T, G, E / G)
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (T, G)
            best = group_scores.topk(
                self.num_limited_groups, dim=-1
            ).indices  # (T, num_limited_groups)
            excluded = torch.ones_like(group_scores, dtype=torch.bool).scatter_(1, best, False)
            choice = grouped.masked_fill(excluded[..., None], float("-inf")).flatten(1)  # (T, E)
        indices = choice.topk(self.top_k, dim=-1).indices  # (T, top_k)
        weights = scores.gather(1, indices)
        if self.route_norm:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return RouterOutput((weights * self.route_scale).to(x.dtype), indices, scores)
