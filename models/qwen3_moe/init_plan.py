"""Qwen3-MoE init plan: every parameter and persistent buffer, with its source.

Qwen released no training-time initialization; the plan follows HF
``Qwen3MoePreTrainedModel._init_weights`` with ``init_std`` = ``initializer_range`` 0.02 of the
released ``config.json``: weight matrices, experts, router and embeddings ~ N(0, 0.02^2); RMSNorm
weights (block, QK and final norms) one; the router's expert bias (kept at zero, see
``models/qwen3_moe/model.py``) and the token counters zero.

Expected step-1 loss: logits std about ``0.02 * sqrt(dim)`` after the final RMSNorm, loss ln V +
0.05 for dim 256.
"""

from __future__ import annotations

from torchtitan_lite.init.spec import InitPlan, normal, ones, zeros
from torchtitan_lite.models.qwen3_moe.args import Qwen3MoeModelArgs

_HF = "HF modeling_qwen3_moe.py _init_weights, initializer_range"


def qwen3_moe_init_plan(args: Qwen3MoeModelArgs) -> InitPlan:
    """The :class:`InitPlan` of :class:`torchtitan_lite.models.qwen3_moe.model.Qwen3MoeModel` built
    from ``args``."""
    weight = normal(args.init_std, source=f"{_HF} {args.init_std}")
    norm = ones(source="RMSNorm identity at start (HF _init_weights fill 1.0)")
    entries = [
        (
            "tok_embeddings.weight",
            normal(args.init_std, source=f"{_HF} {args.init_std} (nn.Embedding)"),
        )
    ]
    entries += [
        (f"layers.*.{n}.weight", norm)
        for n in ("attention_norm", "ffn_norm", "attention.q_norm", "attention.k_norm")
    ]
    entries += [(f"layers.*.attention.{w}.weight", weight) for w in ("wq", "wk", "wv", "wo")]
    entries.append(
        (
            "layers.*.moe.router.gate.weight",
            normal(args.init_std, source=f"{_HF} {args.init_std} (gate)"),
        )
    )
    entries += [(f"layers.*.moe.experts.{w}", weight) for w in ("w1", "w2", "w3")]
    entries.append(
        (
            "layers.*.moe.router.expert_bias",
            zeros(source="state: zero, never updated (no bias in Qwen3)"),
        )
    )
    entries.append(
        (
            "layers.*.moe.tokens_per_expert",
            zeros(source="state: no tokens counted at a fresh start"),
        )
    )
    output = normal(args.init_std, source=f"{_HF} {args.init_std} (lm_head)")
    entries += [("norm.weight", norm), ("output.weight", output)]
    return InitPlan(model="qwen3_moe", entries=tuple(entries))
