"""Auxiliary load-balancing losses of an MoE layer, in the :data:`AuxLoss` form :class:`torchtitan_lite.models.common.moe.MoE`
takes: the Switch-Transformer loss (GPT-OSS, Qwen3-MoE) and DeepSeek-V3's sequence-wise loss.
"""

from __future__ import annotations

from typing import Callable

import torch

from torchtitan_lite.models.common.routers import RouterOutput

AuxLoss = Callable[[RouterOutput, torch.Tensor, int], torch.Tensor]
"""``(routing of T tokens, counts (E,) of (token, expert) assignments, tokens per sequence) -> fp32 scalar``,
unweighted (the MoE multiplies by its coefficient)."""


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


def sequence_balance_loss(scores: torch.Tensor, indices: torch.Tensor, seqlen: int) -> torch.Tensor:
    """Complementary sequence-wise balance loss ``sum_i f_i P_i`` (DeepSeek-V3 report, arXiv 2412.19437,
    eq. 17-20), averaged over sequences.

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


def switch_aux_loss(routing: RouterOutput, counts: torch.Tensor, seqlen: int) -> torch.Tensor:
    """:func:`load_balance_loss` over all tokens of the batch, as an :data:`AuxLoss`."""
    return load_balance_loss(routing.probs, counts)


def sequence_aux_loss(routing: RouterOutput, counts: torch.Tensor, seqlen: int) -> torch.Tensor:
    """:func:`sequence_balance_loss` per sequence of ``seqlen`` tokens, as an :data:`AuxLoss`."""
    return sequence_balance_loss(routing.probs, routing.indices, seqlen)
