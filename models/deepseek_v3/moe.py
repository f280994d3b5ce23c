"""DeepSeekMoE (DeepSeek-V3 report, arXiv 2412.19437, sec. 2.1.2): routed + shared experts, the V3 router.

Routing (report eq. 12-16; reference ``Gate.forward`` of deepseek-ai/DeepSeek-V3 ``inference/model.py``):
affinity scores ``s = sigmoid(u W^T)`` (or softmax), a per-expert bias ``b`` added for the top-k
choice only (auxiliary-loss-free load balancing), node-limited to the best ``n_limited_groups`` of
``n_expert_groups`` groups, gating weights from the unbiased scores, normalized and scaled.

Balancing: the bias is a persistent fp32 buffer (never a Parameter: the optimizer never sees it),
moved once per optimizer step by :func:`models.common.expert_bias.update_expert_bias` from the token
counts that :class:`models.common.moe.MoE` keeps; an optional sequence-wise balance loss (report
eq. 17-20) is attached with :class:`models.common.moe.AddAuxiliaryLoss`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.common.ffn import FeedForward
from models.common.moe import AddAuxiliaryLoss, MoE, RouterOutput
from models.common.token_dispatch import combine, dispatch, grouped_linear, scatter_rows


class DeepSeekV3Router(nn.Module):
    """The V3 gate: biased top-k choice within the best groups, unbiased weights.

    Steps for ``T`` tokens and ``E`` experts (reference ``Gate.forward``, the ``masked_fill(-inf)``
    version; HF ``DeepseekV3TopkRouter``/``get_topk_indices``):
      1. ``s = sigmoid(gate(x))`` or ``softmax(gate(x))``, fp32 ``(T, E)``;
      2. choice scores ``s + expert_bias``; with ``n_expert_groups > 1`` each group is scored by the sum
         of its 2 best choice scores (the reference's constant; the report's ``K_r / M`` = 8 / 4 for V3),
         and experts outside the ``n_limited_groups`` best groups are excluded (``-inf``);
      3. ``indices`` = the ``top_k`` best choice scores (distinct experts);
      4. ``weights = s[indices]``, divided by their sum when ``route_norm`` (plus 1e-20 as HF, against
         an all-underflowed sigmoid), times ``route_scale``.

    Args:
        dim: input width.
        num_experts: ``E``.
        top_k: experts per token.
        n_groups, n_limited_groups: expert groups and how many a token may use.
        score_func: ``"sigmoid"`` or ``"softmax"``.
        route_norm: normalize the chosen scores.
        route_scale: gating weight multiplier.
        bias_update_speed: ``gamma``, read by :func:`models.common.expert_bias.update_expert_bias`.

    Attributes:
        gate: ``nn.Linear(dim, num_experts, bias=False)``.
        expert_bias: persistent fp32 buffer ``(num_experts,)``, used only in step 2.
    """

    def __init__(self, dim: int, num_experts: int, top_k: int, n_groups: int, n_limited_groups: int,
                 score_func: str, route_norm: bool, route_scale: float, bias_update_speed: float):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.n_groups, self.n_limited_groups = n_groups, n_limited_groups
        self.score_func, self.route_norm, self.route_scale = score_func, route_norm, route_scale
        self.bias_update_speed = bias_update_speed
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.register_buffer("expert_bias", torch.empty(num_experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> RouterOutput:
        """``x`` ``(T, dim)`` -> :class:`RouterOutput`: weights ``(T, top_k)`` in ``x.dtype``, int64
        indices ``(T, top_k)``, and the unbiased fp32 scores ``(T, E)`` as ``probs``."""
        logits = self.gate(x).float()  # (T, E)
        scores = torch.sigmoid(logits) if self.score_func == "sigmoid" else torch.softmax(logits, dim=-1)
        choice = scores.detach() + self.expert_bias  # (T, E), no gradient through the choice
        if self.n_groups > 1:
            grouped = choice.view(x.shape[0], self.n_groups, -1)  # (T, G, E / G)
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (T, G)
            best = group_scores.topk(self.n_limited_groups, dim=-1).indices  # (T, n_limited_groups)
            excluded = torch.ones_like(group_scores, dtype=torch.bool).scatter_(1, best, False)
            choice = grouped.masked_fill(excluded[..., None], float("-inf")).flatten(1)  # (T, E)
        indices = choice.topk(self.top_k, dim=-1).indices  # (T, top_k)
        weights = scores.gather(1, indices)
        if self.route_norm:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return RouterOutput((weights * self.route_scale).to(x.dtype), indices, scores)


class GroupedSwiGLUExperts(nn.Module):
    """``num_experts`` bias-free SwiGLU FFNs ``w2(silu(w1 x) * w3 x)`` stored as 3-D weights.

    The reference's ``Expert`` (w1 gate, w3 up, w2 down; no biases), stacked on dim 0 so FSDP2 shards
    the experts. Parameters: ``w1``, ``w3`` ``(E, hidden_dim, dim)``; ``w2`` ``(E, dim, hidden_dim)``.
    The ``T * k`` (token, expert) pairs are sorted by expert and each expert runs once on its
    segment with one grouped matmul per weight, as :class:`models.common.moe.GroupedExperts` does (no host sync).

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

    def forward(self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``sum_j weights[t, j] * expert_{indices[t, j]}(x[t])``: ``x`` ``(T, dim)``, ``indices``/``weights``
        ``(T, k)`` -> ``(T, dim)`` in ``x.dtype``."""
        plan = dispatch(indices, self.num_experts)
        buffer = scatter_rows(x, plan)  # (num_rows, dim)
        h = F.silu(grouped_linear(buffer, self.w1, plan)) * grouped_linear(buffer, self.w3, plan)
        return combine(grouped_linear(h, self.w2, plan), weights, plan, indices.shape[0])


def sequence_balance_loss(scores: torch.Tensor, indices: torch.Tensor, seqlen: int) -> torch.Tensor:
    """Complementary sequence-wise balance loss ``sum_i f_i P_i`` (report eq. 17-20), averaged over sequences.

    Per sequence of ``seqlen`` tokens: ``f_i = E / (k * seqlen) * (tokens choosing expert i)`` (no
    gradient) and ``P_i = mean_t s'_{i,t}`` with ``s'`` the scores normalized to sum 1 per token
    (eq. 19). Perfect balance gives 1. The coefficient ``alpha`` is applied by the caller.

    Args:
        scores: ``(bs * seqlen, E)`` unbiased affinity scores (rows in sequence order).
        indices: ``(bs * seqlen, k)`` chosen experts.
        seqlen: tokens per sequence.

    Returns:
        fp32 scalar.
    """
    num_tokens, num_experts = scores.shape
    top_k = indices.shape[1]
    bs = num_tokens // seqlen
    chosen = torch.zeros(bs, num_experts, device=scores.device).scatter_add_(
        1, indices.view(bs, seqlen * top_k), torch.ones(bs, seqlen * top_k, device=scores.device)
    )  # (bs, E) token counts per sequence
    fraction = chosen * num_experts / (top_k * seqlen)
    normalized = scores.float() / scores.float().sum(dim=-1, keepdim=True)
    mean_prob = normalized.view(bs, seqlen, num_experts).mean(dim=1)  # (bs, E)
    return (fraction * mean_prob).sum(dim=-1).mean()


class DeepSeekMoE(MoE):
    """Routed experts chosen by :class:`DeepSeekV3Router` plus always-on shared experts.

    ``out = routed(x) + shared_experts(x)`` (report eq. 12; reference ``MoE.forward``). Inherits the
    token counters of :class:`models.common.moe.MoE` (``tokens_per_expert``, counted in training
    forwards, not in activation-checkpoint recomputes, see the note there) so that
    :func:`models.common.moe.collect_expert_load` finds it. Its own aux loss is the sequence-wise one.

    Args:
        router: :class:`DeepSeekV3Router`.
        experts: :class:`GroupedSwiGLUExperts`.
        shared_experts: a dense :class:`models.common.ffn.FeedForward`, or ``None``.
        seq_aux_loss_coeff: ``alpha`` of :func:`sequence_balance_loss`; 0 = off.

    Attributes:
        aux_loss: the last training forward's ``alpha * loss`` (detached), ``None`` when off.
        aux_loss_scale: gradient of the aux loss in backward (see :mod:`models.common.moe`).

    Raises:
        ValueError: a negative ``seq_aux_loss_coeff``.
    """

    def __init__(self, router: DeepSeekV3Router, experts: GroupedSwiGLUExperts, shared_experts: FeedForward | None,
                 seq_aux_loss_coeff: float):
        super().__init__(router, experts, load_balance_coeff=0.0)
        if not seq_aux_loss_coeff >= 0:
            raise ValueError(f"DeepSeekMoE: seq_aux_loss_coeff must be >= 0 (0 = off), got {seq_aux_loss_coeff}")
        self.shared_experts = shared_experts
        self.seq_aux_loss_coeff = seq_aux_loss_coeff

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``(bs, seqlen, dim)`` -> ``(bs, seqlen, dim)``."""
        flat = x.reshape(-1, x.shape[-1])  # (T, dim)
        weights, indices, scores = self.router(flat)
        out = self.experts(flat, indices, weights)
        if self.training:
            recompute = torch._C._current_graph_task_id() != -1
            if not recompute:
                with torch.no_grad():
                    self.tokens_per_expert += torch.bincount(indices.reshape(-1), minlength=self.experts.num_experts)
            if self.seq_aux_loss_coeff > 0:
                aux = self.seq_aux_loss_coeff * sequence_balance_loss(scores, indices, x.shape[1])
                out = AddAuxiliaryLoss.apply(out, aux, self.aux_loss_scale)
                if not recompute:
                    self.aux_loss = aux.detach()
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view_as(x)
