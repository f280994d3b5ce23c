"""Auxiliary load-balancing losses of an MoE layer, in the :data:`AuxLoss` form
:class:`torchtitan_lite.models.common.moe.MoE` takes: the Switch-Transformer loss (GPT-OSS,
Qwen3-MoE) and DeepSeek-V3's sequence-wise loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torchtitan_lite.models.common.routers import RouterOutput

WindowSum = Callable[[torch.Tensor], torch.Tensor]
"""A sum of a per-rank statistic over the ranks that share each window (context parallelism: an
all-reduce with autograd), so a loss of whole sequences is computed from each rank's share of them;
``None``: the rank has whole windows."""

AuxLoss = Callable[[RouterOutput, torch.Tensor, int, WindowSum | None], torch.Tensor]
"""``(routing of T tokens, counts (E,) of (token, expert) assignments, tokens per sequence held,
window sum) -> fp32 scalar``, unweighted (the MoE multiplies by its coefficient)."""


def _whole(stats: torch.Tensor, window_sum: WindowSum | None) -> torch.Tensor:
    return stats if window_sum is None else window_sum(stats)


def load_balance_loss(
    probs: torch.Tensor, tokens_per_expert: torch.Tensor, window_sum: WindowSum | None = None
) -> torch.Tensor:
    """Switch-Transformer load-balancing loss (Fedus et al. 2021, arXiv 2101.03961, eq. 4-6), HF
    form.

    ``E * sum_e f_e * P_e`` with ``f_e`` = (tokens routed to ``e``) / ``T`` (no gradient; summing to
    ``k`` over experts, as HF ``load_balancing_loss_func``) and ``P_e`` the mean router probability
    of ``e``. Perfect balance (``f_e = k/E``, ``P_e = 1/E``) gives ``k``.

    Args:
        probs: ``(T, E)`` router probabilities.
        tokens_per_expert: ``(E,)`` counts of (token, expert) assignments in this batch.
        window_sum: :data:`WindowSum`: the counts, probability sums and ``T`` summed over the
            ranks sharing the windows (``None``: none).

    Returns:
        fp32 scalar.
    """
    num_tokens, num_experts = probs.shape
    total = probs.new_full((1,), num_tokens).float()
    stats = torch.cat([tokens_per_expert.float(), probs.float().sum(dim=0), total])
    counts, prob_sum, total = _whole(stats, window_sum).split([num_experts, num_experts, 1])
    return num_experts * (counts / total * (prob_sum / total)).sum()


def sequence_balance_loss(
    scores: torch.Tensor, indices: torch.Tensor, seqlen: int, window_sum: WindowSum | None = None
) -> torch.Tensor:
    """Complementary sequence-wise balance loss ``sum_i f_i P_i`` (DeepSeek-V3 report, arXiv
    2412.19437, eq. 17-20), averaged over sequences.

    Per sequence of ``seqlen`` tokens: ``f_i = E / (k * seqlen) * (tokens choosing expert i)`` (no
    gradient) and ``P_i = mean_t s'_{i,t}`` with ``s'`` the scores normalized to sum 1 per token
    (eq. 19). Perfect balance gives 1. The coefficient ``alpha`` is applied by the caller.

    Args:
        scores: ``(bs * seqlen, E)`` unbiased affinity scores (rows in sequence order).
        indices: ``(bs * seqlen, k)`` chosen experts.
        seqlen: tokens per sequence held here.
        window_sum: :data:`WindowSum`: each sequence's counts, probability sums and length summed
            over the ranks sharing it (``None``: whole sequences).

    Returns:
        fp32 scalar.
    """
    num_tokens, num_experts = scores.shape
    top_k = indices.shape[1]
    bs = num_tokens // seqlen
    chosen = torch.zeros(bs, num_experts, device=scores.device).scatter_add_(
        1, indices.view(bs, seqlen * top_k), torch.ones(bs, seqlen * top_k, device=scores.device)
    )  # (bs, E) token counts per sequence
    normalized = scores.float() / scores.float().sum(dim=-1, keepdim=True)
    prob_sum = normalized.view(bs, seqlen, num_experts).sum(dim=1)  # (bs, E)
    length = chosen.new_full((bs, 1), seqlen)
    stats = _whole(torch.cat([chosen, prob_sum, length], dim=1), window_sum)
    chosen, prob_sum, length = stats.split([num_experts, num_experts, 1], dim=1)
    fraction = chosen * num_experts / (top_k * length)
    return (fraction * (prob_sum / length)).sum(dim=-1).mean()


def switch_aux_loss(
    routing: RouterOutput, counts: torch.Tensor, seqlen: int, window_sum: WindowSum | None = None
) -> torch.Tensor:
    """:func:`load_balance_loss` over all tokens of the batch, as an :data:`AuxLoss`."""
    return load_balance_loss(routing.probs, counts, window_sum)


def sequence_aux_loss(
    routing: RouterOutput, counts: torch.Tensor, seqlen: int, window_sum: WindowSum | None = None
) -> torch.Tensor:
    """:func:`sequence_balance_loss` per sequence of ``seqlen`` tokens, as an :data:`AuxLoss`."""
    return sequence_balance_loss(routing.probs, routing.indices, seqlen, window_sum)
