"""GPT-OSS init plan: every parameter and persistent buffer, with its source.

OpenAI released no training-time initialization for GPT-OSS; the plan follows HF transformers
``GptOssPreTrainedModel._init_weights`` (``modeling_gpt_oss.py``), with ``init_std`` =
``initializer_range`` 0.02 of the released ``config.json``: every weight matrix, the experts, the
router (weight AND bias: an uninitialized router bias is a known source of NaN at step 1) and the
sinks ~ N(0, 0.02^2); linear and expert biases zero; RMSNorm weights one.

Expected step-1 loss: the final RMSNorm gives unit-RMS features, so the logits have std about
``init_std * sqrt(dim)`` (0.32 for the debug dim 256) and the loss is ``ln V + std^2 / 2`` = ln V +
0.05.
"""

from __future__ import annotations

from torchtitan_lite.init.spec import InitPlan, normal, ones, zeros
from torchtitan_lite.models.gpt_oss.args import GptOssModelArgs

_HF = "HF modeling_gpt_oss.py _init_weights, initializer_range"


def gpt_oss_init_plan(args: GptOssModelArgs) -> InitPlan:
    """The :class:`InitPlan` of :class:`torchtitan_lite.models.gpt_oss.model.GptOssModel` built from
    ``args``."""
    weight = normal(args.init_std, source=f"{_HF} {args.init_std}")
    bias = zeros(source="HF _init_weights: nn.Linear and expert biases zeroed")
    norm = ones(source="RMSNorm identity at start (HF _init_weights fill 1.0)")
    entries = [
        (
            "tok_embeddings.weight",
            normal(args.init_std, source=f"{_HF} {args.init_std} (nn.Embedding)"),
        ),
        ("layers.*.attention_norm.weight", norm),
        ("layers.*.attention.wq.weight", weight),
        ("layers.*.attention.wk.weight", weight),
        ("layers.*.attention.wv.weight", weight),
        ("layers.*.attention.wo.weight", weight),
        ("layers.*.attention.wq.bias", bias),
        ("layers.*.attention.wk.bias", bias),
        ("layers.*.attention.wv.bias", bias),
        ("layers.*.attention.wo.bias", bias),
        (
            "layers.*.attention.sinks",
            normal(args.init_std, source=f"{_HF} {args.init_std} (GptOssAttention.sinks)"),
        ),
        ("layers.*.ffn_norm.weight", norm),
        ("layers.*.moe.router.gate.weight", weight),
        (
            "layers.*.moe.router.gate.bias",
            normal(args.init_std, source=f"{_HF} {args.init_std} (router bias)"),
        ),
        ("layers.*.moe.experts.mlp1_weight", weight),
        ("layers.*.moe.experts.mlp2_weight", weight),
        ("layers.*.moe.experts.mlp1_bias", bias),
        ("layers.*.moe.experts.mlp2_bias", bias),
        (
            "layers.*.moe.tokens_per_expert",
            zeros(source="state buffer: no tokens counted at a fresh start"),
        ),
        ("norm.weight", norm),
        ("output.weight", normal(args.init_std, source=f"{_HF} {args.init_std} (lm_head)")),
    ]
    return InitPlan(model="gpt_oss", entries=tuple(entries))
