"""DeepSeek-V3 init plan: every parameter and persistent buffer, with its source.

DeepSeek released no training-time initialization code; the report (arXiv 2412.19437, sec. 4.2) says
"all learnable parameters are randomly initialized with a standard deviation of 0.006". We use
``init_std`` = ``initializer_range`` 0.02 of the released ``config.json`` files as HF
``DeepseekV3PreTrainedModel._init_weights`` does (``replace(args, init_std=0.006)`` gives the
report's value): every weight matrix, the experts and the router ~ N(0, init_std^2); RMSNorm weights
one; the expert bias and the token counters zero (persistent state, checkpointed, zero at a fresh
start).

Expected step-1 loss: the final RMSNorm gives unit-RMS features, so the logits have std about
``init_std * sqrt(dim)`` (0.32 for the debug dim 256) and the loss is ``ln V + std^2 / 2`` = ln V +
0.05.
"""

from __future__ import annotations

from torchtitan_lite.init.spec import InitPlan, normal, ones, zeros
from torchtitan_lite.models.deepseek_v3.args import DeepSeekV3ModelArgs

_HF = "HF modeling_deepseek_v3.py _init_weights, initializer_range"


def deepseek_v3_init_plan(args: DeepSeekV3ModelArgs) -> InitPlan:
    """The :class:`InitPlan` of :class:`torchtitan_lite.models.deepseek_v3.model.DeepSeekV3Model`
    built from ``args``."""
    weight = normal(args.init_std, source=f"{_HF} {args.init_std}")
    norm = ones(source="RMSNorm identity at start (HF _init_weights fill 1.0)")
    q_proj = ["wq"] if args.q_lora_rank == 0 else ["wq_a", "wq_b"]
    entries = [
        (
            "tok_embeddings.weight",
            normal(args.init_std, source=f"{_HF} {args.init_std} (nn.Embedding)"),
        )
    ]
    # (block pattern, has dense blocks, has MoE blocks): the main layers, then the MTP blocks (all
    # MoE: index >= n_layers)
    blocks = [("layers.*", args.n_dense_layers > 0, args.n_layers > args.n_dense_layers)]
    if args.mtp_num_layers:
        blocks.append(("mtp.layers.*.block", False, True))
    for block, dense, moe in blocks:
        entries += [(f"{block}.attention_norm.weight", norm), (f"{block}.ffn_norm.weight", norm)]
        entries += [
            (f"{block}.attention.{name}.weight", weight)
            for name in (*q_proj, "wkv_a", "wkv_b", "wo")
        ]
        if args.q_lora_rank:
            entries.append((f"{block}.attention.q_norm.weight", norm))
        entries.append((f"{block}.attention.kv_norm.weight", norm))
        if dense:
            entries += [(f"{block}.feed_forward.{w}.weight", weight) for w in ("w1", "w2", "w3")]
        if moe:
            router = normal(args.init_std, source=f"{_HF} {args.init_std} (router)")
            entries.append((f"{block}.moe.router.gate.weight", router))
            entries += [(f"{block}.moe.experts.{w}", weight) for w in ("w1", "w2", "w3")]
            if args.num_shared_experts:
                entries += [
                    (f"{block}.moe.shared_experts.{w}.weight", weight) for w in ("w1", "w2", "w3")
                ]
            entries.append(
                (
                    f"{block}.moe.router.expert_bias",
                    zeros(
                        source=(
                            "state: aux-loss-free balancing bias starts at 0 (HF "
                            "e_score_correction_bias)"
                        )
                    ),
                )
            )
            entries.append(
                (
                    f"{block}.moe.tokens_per_expert",
                    zeros(source="state: no tokens counted at a fresh start"),
                )
            )
    if (
        args.mtp_num_layers
    ):  # report sec. 2.2; no published init: the weights as every matrix, the norms one
        entries += [(f"mtp.layers.*.{name}.weight", norm) for name in ("enorm", "hnorm", "norm")]
        entries.append(
            (
                "mtp.layers.*.eh_proj.weight",
                normal(args.init_std, source=f"{_HF} {args.init_std} (eh_proj)"),
            )
        )
    output = normal(args.init_std, source=f"{_HF} {args.init_std} (lm_head)")
    entries += [("norm.weight", norm), ("output.weight", output)]
    return InitPlan(model="deepseek_v3", entries=tuple(entries))
