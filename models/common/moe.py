"""The mixture-of-experts layer every MoE family uses: route, run the experts, add the auxiliary
loss, count.

:class:`MoE` takes a router (``models/common/routers.py``), grouped experts
(``models/common/experts.py``), optional shared experts and an auxiliary loss
(``models/common/balance_loss.py``): GPT-OSS is
:class:`~torchtitan_lite.models.common.routers.TopKRouter` +
:class:`~torchtitan_lite.models.common.experts.GroupedExperts` + the Switch loss; Qwen3-MoE the
V3-style router + SwiGLU experts + the Switch loss; DeepSeek-V3 the V3 router + SwiGLU experts +
shared experts + the sequence-wise loss.

Notes in docs/design.md: "on the auxiliary loss without touching the forward output", "on counting
tokens under activation checkpointing".
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from torchtitan_lite.distributed.activation_checkpoint import recomputing
from torchtitan_lite.init.apply import canonical_name
from torchtitan_lite.models.common.balance_loss import AuxLoss
from torchtitan_lite.protocols.attention import WindowAware


class AddAuxiliaryLoss(torch.autograd.Function):
    """Return ``x`` unchanged; in backward give ``aux`` (a scalar) the gradient ``scale``.

    See "Note: on the auxiliary loss without touching the forward output" in docs/design.md.
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


class MoE(WindowAware):
    """A mixture-of-experts feed-forward layer: ``out = routed(x) + shared_experts(x)``.

    ``routed(x)`` sends each token to the experts its router chose
    (``sum_j weights_j * expert_j(x)``); shared experts, when given, run on every token (DeepSeek-V3
    report eq. 12; reference ``MoE.forward``).

    Args:
        router: maps ``(T, dim)`` to a :class:`~torchtitan_lite.models.common.routers.RouterOutput`.
        experts: grouped experts with a ``num_experts`` attribute, called as
            ``experts(x, indices, weights)``.
        shared_experts: a module ``(T, dim) -> (T, dim)`` run on every token, or ``None``.
        aux_loss: an :data:`~torchtitan_lite.models.common.balance_loss.AuxLoss`, or ``None``.
        aux_loss_coeff: its weight, added to the training loss through :class:`AddAuxiliaryLoss`
            (training mode only); 0 turns it off.

    Attributes:
        tokens_per_expert: persistent fp32 buffer ``(num_experts,)``: (token, expert) assignments
            counted in training forwards since the last :func:`collect_expert_load` (not recounted
            in activation-checkpoint recomputes).
        aux_loss: the last training forward's ``aux_loss_coeff * aux_loss`` (detached), ``None``
            before one ran or when the coefficient is 0.
        aux_loss_scale: gradient the aux loss receives in backward (docs/design.md, "Note: on the
            auxiliary loss without touching the forward output"), default 1.
        cp: under context parallelism the rank's share of the windows (set by the engine): the
            aux loss is that of the whole windows, its statistics summed over the ranks sharing
            them.

    Raises:
        ValueError: a negative ``aux_loss_coeff``, or a positive one without ``aux_loss``.
    """

    def __init__(
        self,
        router: nn.Module,
        experts: nn.Module,
        *,
        shared_experts: nn.Module | None = None,
        aux_loss: AuxLoss | None = None,
        aux_loss_coeff: float = 0.0,
    ):
        super().__init__()
        if not aux_loss_coeff >= 0:
            raise ValueError(f"MoE: aux_loss_coeff must be >= 0 (0 = off), got {aux_loss_coeff}")
        if aux_loss_coeff > 0 and aux_loss is None:
            raise ValueError(f"MoE: aux_loss_coeff = {aux_loss_coeff} needs an aux_loss function")
        self.router = router
        self.experts = experts
        self.shared_experts = shared_experts
        self.aux_loss_fn = aux_loss
        self.aux_loss_coeff = aux_loss_coeff
        self.aux_loss_scale = 1.0
        self.aux_loss: torch.Tensor | None = None
        self.register_buffer(
            "tokens_per_expert", torch.zeros(experts.num_experts, dtype=torch.float32)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``(bs, seqlen, dim)`` -> ``(bs, seqlen, dim)``."""
        flat = x.reshape(-1, x.shape[-1])  # (T, dim)
        routing = self.router(flat)
        out = self.experts(flat, routing.indices, routing.weights)
        if self.training:
            recompute = recomputing()
            with torch.no_grad():
                counts = torch.bincount(
                    routing.indices.reshape(-1), minlength=self.experts.num_experts
                ).float()
                if not recompute:
                    self.tokens_per_expert += counts
            if self.aux_loss_coeff > 0:
                window_sum = None if self.cp is None else self.cp.sum  # CP: whole windows' stats
                aux = self.aux_loss_fn(routing, counts, x.shape[1], window_sum)
                aux = self.aux_loss_coeff * aux
                out = AddAuxiliaryLoss.apply(out, aux, self.aux_loss_scale)
                if not recompute:
                    self.aux_loss = aux.detach()
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view_as(x)


def moe_layers(model: nn.Module) -> dict[str, MoE]:
    """Canonical module name (wrapper prefixes stripped, e.g. ``"layers.0.moe"``) -> every
    :class:`MoE` of ``model``, in module order."""
    return {canonical_name(name): m for name, m in model.named_modules() if isinstance(m, MoE)}


def collect_expert_load(
    model: nn.Module, group: dist.ProcessGroup | None = None
) -> dict[str, torch.Tensor]:
    """Per-layer expert load since the last call, summed over the data-parallel ranks; then reset.

    Call once per optimizer step. All layers' counters go through ONE all-reduce (SUM over
    ``group``) when ``torch.distributed`` is initialized; every rank gets the same result.

    Args:
        model: any module containing :class:`MoE` layers (FSDP/checkpoint wrappers allowed).
        group: the data-parallel process group (default: the world).

    Returns:
        :func:`moe_layers` name -> fp32 ``(num_experts,)`` token-assignment counts (a copy); ``{}``
        when the model has no MoE layer.
    """
    layers = moe_layers(model)
    if not layers:
        return {}
    counters = [m.tokens_per_expert for m in layers.values()]
    flat = torch.cat(counters)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    result = {}
    for name, counts, counter in zip(
        layers, flat.split([c.numel() for c in counters]), counters, strict=True
    ):
        result[name] = counts.clone()
        counter.zero_()
    return result
