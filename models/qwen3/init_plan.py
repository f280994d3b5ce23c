"""How every Qwen3 parameter starts: the init plan as a table (applied by ``torchtitan_lite.init``).

Choices and sources:
  * Linears and the embedding: std ``init_std`` 0.02, the ``initializer_range`` of every Qwen3
    ``config.json`` (HF ``Qwen3PreTrainedModel._init_weights`` draws
    ``normal_(0, initializer_range)``). We truncate at +-3 sigma like torchtitan's ``trunc_normal_``
    inits: it removes only 0.27% of the mass (std shrinks by 1.4%) and bounds the largest initial
        weight.
  * Residual output projections ``wo`` and ``w2``: std ``0.02 / sqrt(2 * n_layers)``, so the sum of
    the ``2 * n_layers`` branch outputs added to the residual stream keeps a depth-independent
    scale (GPT-2 report, Radford et al. 2019, section 2.3; torchtitan ``TransformerBlock``
    ``weight_init_std`` with ``depth_init=False``). torchtitan's default ``depth_init=True`` uses
    ``0.02 / sqrt(2 * (layer_id + 1))`` instead and also scales ``w3``; we keep one entry per
    weight kind so the table stays readable, and ``w3`` (an input projection) at 0.02.
  * RMSNorm weights (block norms, QK-norms, final norm): ones (HF ``Qwen3RMSNorm`` init).
  * ``output.weight``, LAST so that it wins for a tied pair (see the note on tied weights in
    ``torchtitan_lite/init/spec.py``). Tied: std 0.02, the embedding's own std (step-1 loss about
    ln V + 0.05). Untied: std ``dim ** -0.5``, cutoff 3 sigma (torchtitan ``final_out_std``): after
    the final RMSNorm (unit RMS features) the logits have std about 1 and step-1 loss about ln V +
    0.5.
"""

from __future__ import annotations

import math

from torchtitan_lite.init.spec import InitPlan, ones, trunc_normal
from torchtitan_lite.models.qwen3.args import Qwen3ModelArgs


def qwen3_init_plan(args: Qwen3ModelArgs) -> InitPlan:
    """The init plan of a Qwen3 model with ``args``: every parameter's distribution and its source.

    Returns:
        An :class:`InitPlan` covering each parameter of ``Qwen3Model(args)`` (RoPE tables are
        non-persistent buffers rebuilt by ``init_buffers``, not in the plan).
    """
    std = args.init_std
    hf = "HF Qwen3 initializer_range 0.02, cut at 3 sigma"
    residual_std = std / math.sqrt(2 * args.n_layers)
    residual = trunc_normal(
        residual_std, source="0.02/sqrt(2*n_layers): GPT-2 sec. 2.3; torchtitan depth_init=False"
    )
    if args.output_init_std is not None:
        output = trunc_normal(
            args.output_init_std, source="output_init_std from the model args (debugging)"
        )
    elif args.tie_embeddings:
        output = trunc_normal(std, source="tied: output spec wins; std 0.02 = embedding std (HF)")
    else:
        output = trunc_normal(args.dim**-0.5, source="dim^-0.5, 3 sigma: torchtitan final_out_std")
    norm = ones(source="RMSNorm weight = 1 (HF Qwen3RMSNorm)")
    return InitPlan(
        model="qwen3",
        entries=(
            ("tok_embeddings.weight", trunc_normal(std, source=hf)),
            ("layers.*.attention_norm.weight", norm),
            ("layers.*.attention.wq.weight", trunc_normal(std, source=hf)),
            ("layers.*.attention.wk.weight", trunc_normal(std, source=hf)),
            ("layers.*.attention.wv.weight", trunc_normal(std, source=hf)),
            ("layers.*.attention.q_norm.weight", norm),
            ("layers.*.attention.k_norm.weight", norm),
            ("layers.*.attention.wo.weight", residual),
            ("layers.*.ffn_norm.weight", norm),
            ("layers.*.feed_forward.w1.weight", trunc_normal(std, source=hf)),
            ("layers.*.feed_forward.w3.weight", trunc_normal(std, source=hf)),
            ("layers.*.feed_forward.w2.weight", residual),
            ("norm.weight", norm),
            ("output.weight", output),
        ),
    )
