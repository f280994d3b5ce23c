"""Mixture of experts: top-k router, grouped experts, load-balancing loss and expert-load counters.

Built for GPT-OSS (OpenAI gpt-oss model card, Aug 2025; reference ``MLPBlock`` in
``gpt_oss/torch/model.py``) and meant for DeepSeek-V3 too: :class:`MoE` takes any router module that
returns a :class:`RouterOutput`, and :class:`GroupedExperts` any activation of the fused
``mlp1`` projection.

Note: on the auxiliary loss without touching the forward output. The load-balancing loss of each
MoE layer is attached to the layer's output by :class:`AddAuxiliaryLoss` (the trick of the
DeepSeek-V2/V3 reference ``modeling_deepseek.py``): the forward value is unchanged and in backward
the loss receives a gradient of ``aux_loss_scale`` (1 by default), exactly as if it had been added
to the training loss. The trainer needs nothing special, and activation checkpointing and FSDP see
an ordinary graph. With gradients SUMMED over ranks and micro-batches (torchtitan_lite's
convention), set ``aux_loss_scale = 1 / (world_size * micro_batches)`` to add the mean.

Note: on counting tokens under activation checkpointing. ``tokens_per_expert`` is updated in
forward; a checkpointed block runs its forward a second time during backward (recompute), which
would count every token twice. A forward that runs while an autograd graph task is executing is a
recompute (``torch._C._current_graph_task_id() != -1``, the test FSDP2 itself uses in
``_fsdp_common.py``), and it does not count.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from models.common.token_dispatch import combine, dispatch, grouped_linear, scatter_rows

Activation = Callable[[torch.Tensor], torch.Tensor]
"""Expert activation: the fused ``mlp1`` output ``(..., 2 * hidden_dim)`` -> ``(..., hidden_dim)``."""

_WRAPPER_NAMES = ("_checkpoint_wrapped_module", "_orig_mod")  # checkpoint_wrapper, torch.compile


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
        raise ValueError(f"clamped_swiglu: last dim must be even (interleaved gate/up), got {x.shape[-1]}")
    if not limit > 0:
        raise ValueError(f"clamped_swiglu: limit must be > 0, got {limit}")
    gate = x[..., ::2].clamp(max=limit)
    up = x[..., 1::2].clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


class RouterOutput(NamedTuple):
    """What a router returns for ``T`` tokens and ``E`` experts, top-``k``.

    Attributes:
        weights: ``(T, k)`` gating weights of the chosen experts, in the dtype of the input.
        indices: ``(T, k)`` int64 expert ids.
        probs: ``(T, E)`` fp32 router probabilities over all experts (for the load-balancing loss).
    """

    weights: torch.Tensor
    indices: torch.Tensor
    probs: torch.Tensor


class TopKRouter(nn.Module):
    """Softmax over the top-k router logits (reference ``MLPBlock.forward``; HF ``GptOssTopKRouter``).

    ``logits = gate(x)`` (a linear layer with bias), the ``top_k`` largest are kept and their softmax
    gives the weights (they sum to 1 per token). ``probs`` is the softmax over all logits.

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
            raise ValueError(f"TopKRouter: top_k must be in 1..num_experts ({num_experts}), got {top_k}")
        self.top_k = top_k
        self.gate = nn.Linear(dim, num_experts, bias=True)

    def forward(self, x: torch.Tensor) -> RouterOutput:
        """``x`` ``(T, dim)`` -> :class:`RouterOutput`."""
        logits = self.gate(x).float()  # (T, E)
        top_logits, indices = torch.topk(logits, self.top_k, dim=-1)  # (T, k)
        weights = torch.softmax(top_logits, dim=-1).to(x.dtype)
        return RouterOutput(weights, indices, torch.softmax(logits, dim=-1))


class GroupedExperts(nn.Module):
    """``num_experts`` biased two-layer FFNs stored as 3-D weights (reference ``MLPBlock`` layout).

    Parameters (``E`` = ``num_experts``, FSDP2 shards all four on dim 0, the expert dimension):
      * ``mlp1_weight`` ``(E, 2 * hidden_dim, dim)``, ``mlp1_bias`` ``(E, 2 * hidden_dim)``: the fused
        gate/up projection (interleaved rows for :func:`clamped_swiglu`);
      * ``mlp2_weight`` ``(E, dim, hidden_dim)``, ``mlp2_bias`` ``(E, dim)``: the down projection.

    Computation: the ``T * k`` (token, expert) pairs are sorted by expert into per-expert groups, each
    projection is one grouped matmul over all groups, and the outputs are weighted and summed back per
    token with ``index_add``. No host sync (see ``models/common/token_dispatch.py``).

    Args:
        num_experts: ``E``.
        dim: model width.
        hidden_dim: expert inner width (GPT-OSS ``intermediate_size``: 2880).
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

    def forward(self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``sum_j weights[t, j] * expert_{indices[t, j]}(x[t])`` for every token ``t``.

        Args:
            x: ``(T, dim)``.
            indices: ``(T, k)`` int64 expert ids in ``[0, num_experts)``.
            weights: ``(T, k)`` gating weights.

        Returns:
            ``(T, dim)`` in the dtype of ``x``.
        """
        plan = dispatch(indices, self.num_experts)
        h = grouped_linear(scatter_rows(x, plan), self.mlp1_weight, plan)  # (num_rows, 2 * hidden_dim)
        h = self.activation(h + self.mlp1_bias.index_select(0, plan.group_expert))  # (num_rows, hidden_dim)
        out = grouped_linear(h, self.mlp2_weight, plan)  # (num_rows, dim)
        out = out + self.mlp2_bias.index_select(0, plan.group_expert)
        return combine(out, weights, plan, indices.shape[0])


class AddAuxiliaryLoss(torch.autograd.Function):
    """Return ``x`` unchanged; in backward give ``aux`` (a scalar) the gradient ``scale``.

    See "Note: on the auxiliary loss without touching the forward output" in this module.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.aux_meta = (aux.dtype, aux.device)
        ctx.scale = scale
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dtype, device = ctx.aux_meta
        return grad, torch.full((), ctx.scale, dtype=dtype, device=device), None


def load_balance_loss(probs: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
    """Switch-Transformer load-balancing loss (Fedus et al. 2021, arXiv 2101.03961, eq. 4-6), HF form.

    ``E * sum_e f_e * P_e`` with ``f_e`` = (tokens routed to ``e``) / ``T`` (no gradient; summing to
    ``k`` over experts, as HF ``load_balancing_loss_func``) and ``P_e`` the mean router probability
    of ``e``. Perfect balance (``f_e = k/E``, ``P_e = 1/E``) gives ``k``.

    Args:
        probs: ``(T, E)`` router probabilities.
        tokens_per_expert: ``(E,)`` counts of (token, expert) assignments in this batch.

    Returns:
        fp32 scalar.
    """
    num_tokens, num_experts = probs.shape
    fraction = tokens_per_expert.float() / num_tokens
    return num_experts * (fraction * probs.float().mean(dim=0)).sum()


class MoE(nn.Module):
    """A mixture-of-experts feed-forward layer: route, run the experts, balance, count.

    Args:
        router: maps ``(T, dim)`` to a :class:`RouterOutput` (e.g. :class:`TopKRouter`).
        experts: :class:`GroupedExperts`.
        load_balance_coeff: weight of :func:`load_balance_loss` added to the training loss through
            :class:`AddAuxiliaryLoss` (training mode only); 0 turns it off.

    Attributes:
        tokens_per_expert: persistent fp32 buffer ``(num_experts,)``: (token, expert) assignments
            counted in training forwards since the last :func:`collect_expert_load` (not recounted
            in activation-checkpoint recomputes).
        aux_loss: the last training forward's ``load_balance_coeff * load_balance_loss`` (detached),
            ``None`` before one ran or when the coefficient is 0.
        aux_loss_scale: gradient the aux loss receives in backward (see the module note), default 1.

    Raises:
        ValueError: a negative ``load_balance_coeff``.
    """

    def __init__(self, router: nn.Module, experts: GroupedExperts, load_balance_coeff: float):
        super().__init__()
        if not load_balance_coeff >= 0:
            raise ValueError(f"MoE: load_balance_coeff must be >= 0 (0 = off), got {load_balance_coeff}")
        self.router = router
        self.experts = experts
        self.load_balance_coeff = load_balance_coeff
        self.aux_loss_scale = 1.0
        self.aux_loss: torch.Tensor | None = None
        self.register_buffer("tokens_per_expert", torch.zeros(experts.num_experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``(bs, seqlen, dim)`` -> ``(bs, seqlen, dim)``."""
        flat = x.reshape(-1, x.shape[-1])  # (T, dim)
        weights, indices, probs = self.router(flat)
        out = self.experts(flat, indices, weights)
        if self.training:
            recompute = torch._C._current_graph_task_id() != -1
            with torch.no_grad():
                counts = torch.bincount(indices.reshape(-1), minlength=self.experts.num_experts).float()
                if not recompute:
                    self.tokens_per_expert += counts
            if self.load_balance_coeff > 0:
                aux = self.load_balance_coeff * load_balance_loss(probs, counts)
                out = AddAuxiliaryLoss.apply(out, aux, self.aux_loss_scale)
                if not recompute:
                    self.aux_loss = aux.detach()
        return out.view_as(x)


def _canonical(name: str) -> str:
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_NAMES)


def collect_expert_load(model: nn.Module, group: dist.ProcessGroup | None = None) -> dict[str, torch.Tensor]:
    """Per-layer expert load since the last call, summed over the data-parallel ranks; then reset.

    Call once per optimizer step. All layers' counters go through ONE all-reduce (SUM over
    ``group``) when ``torch.distributed`` is initialized; every rank gets the same result.

    Args:
        model: any module containing :class:`MoE` layers (FSDP/checkpoint wrappers allowed).
        group: the data-parallel process group (default: the world).

    Returns:
        MoE module name (wrapper prefixes stripped, e.g. ``"layers.0.moe"``) -> fp32 ``(num_experts,)``
        token-assignment counts (a copy); ``{}`` when the model has no MoE layer.
    """
    layers = [(_canonical(name), m) for name, m in model.named_modules() if isinstance(m, MoE)]
    if not layers:
        return {}
    flat = torch.cat([m.tokens_per_expert for _, m in layers])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    result = {}
    for (name, m), counts in zip(layers, flat.split([m.tokens_per_expert.numel() for _, m in layers])):
        result[name] = counts.clone()
        m.tokens_per_expert.zero_()
    return result
