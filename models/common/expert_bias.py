"""Auxiliary-loss-free load balancing: the once-per-step update of each MoE layer's expert bias.

Source: DeepSeek-V3 technical report (arXiv 2412.19437), sec. 2.1.2: "at the end of each step, we
decrease the bias term by gamma if its corresponding expert is overloaded and increase it by gamma
if underloaded" (Wang et al. 2024, arXiv 2408.15664, Algorithm 1:
``b += gamma * sign(mean load - load)``). The delta is mean-centred as in torchtitan's ``MoE`` (so
the biases keep summing to their initial 0; a uniform shift would change no top-k choice).

Note: docs/design.md, "on when to call".
"""

from __future__ import annotations

import torch
from torch import nn

from torchtitan_lite.models.common.moe import moe_layers


def expert_bias_delta(counts: torch.Tensor, step_size: float) -> torch.Tensor:
    """``step_size * sign(mean(counts) - counts)``, minus its mean: the change of one layer's bias.

    Args:
        counts: ``(num_experts,)`` token assignments of the step (any real dtype).
        step_size: ``gamma`` (>= 0).

    Returns:
        fp32 ``(num_experts,)``; it sums to 0 (within fp32 rounding of the mean); zero counts give
        zeros.
    """
    counts = counts.float()
    delta = step_size * torch.sign(counts.mean() - counts)
    return delta - delta.mean()


@torch.no_grad()
def update_expert_bias(model: nn.Module, counts_by_layer: dict[str, torch.Tensor]) -> int:
    """Move every balanced MoE layer's ``router.expert_bias`` by :func:`expert_bias_delta`.

    A layer is balanced when its router has an ``expert_bias`` buffer; its step size is the router's
    ``bias_update_speed`` (from the model args; 0 leaves the bias unchanged). Layers without a bias
    (e.g. GPT-OSS) are skipped. See "Note: on when to call" in docs/design.md.

    Args:
        model: the model (FSDP/checkpoint/compile wrappers allowed).
        counts_by_layer: :func:`torchtitan_lite.models.common.moe.collect_expert_load`'s result:
            canonical MoE module name (``"layers.3.moe"``) -> ``(num_experts,)`` counts summed over
            ranks.

    Returns:
        The number of layers whose bias was updated.

    Raises:
        ValueError: a name in ``counts_by_layer`` is not an MoE layer of ``model``, or counts of the
            wrong shape.
    """
    layers = moe_layers(model)
    unknown = sorted(set(counts_by_layer) - set(layers))
    if unknown:
        raise ValueError(
            f"update_expert_bias: {unknown} are not MoE layers of the model (known: "
            f"{sorted(layers)}); pass the dict collect_expert_load(model) returns"
        )
    updated = 0
    for name, counts in counts_by_layer.items():
        router = layers[name].router
        bias = getattr(router, "expert_bias", None)
        if bias is None:
            continue
        if counts.shape != bias.shape:
            raise ValueError(
                f"update_expert_bias: counts of {name} have shape {tuple(counts.shape)}, expected "
                f"{tuple(bias.shape)} (one per expert)"
            )
        bias += expert_bias_delta(counts.to(bias.device), router.bias_update_speed)
        updated += 1
    return updated
