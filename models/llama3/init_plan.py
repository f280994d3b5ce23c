"""How every Llama 3 parameter starts: the init plan as a table (applied by
``torchtitan_lite.init``).

Meta published no initialization for Llama 3; the plan follows torchtitan's llama3 ``init_weights``
(its pretraining recipe for these models), with one row per weight kind:
  * ``tok_embeddings``: N(0, 1) (torchtitan ``nn.init.normal_``); every block input passes an
    RMSNorm first.
  * ``wq``/``wk``/``wv`` and ``w1``: std ``init_std`` 0.02 (torchtitan ``trunc_normal_(std=0.02)``,
    whose default bounds +-2 lie at 100 sigma: a normal).
  * ``wo``, ``w2`` and ``w3``: std ``0.02 / sqrt(2 * n_layers)`` (torchtitan ``weight_init_std``
    with ``depth_init=False``; GPT-2 report, Radford et al. 2019, section 2.3): the ``2 * n_layers``
    residual branches add up to a depth-independent scale. torchtitan's default ``depth_init=True``
    uses ``0.02 / sqrt(2 * (layer_id + 1))`` per layer instead; one std per weight kind keeps the
    table one row per weight.
  * RMSNorm weights: ones.
  * ``output.weight``, LAST so that it wins for a tied pair (see the note on tied weights in
    ``torchtitan_lite/init/spec.py``). Untied: std ``dim ** -0.5`` cut at 3 sigma (torchtitan
    ``final_out_std``, ``cutoff_factor`` 3): logits of std about 1 after the final RMSNorm, step-1
    loss about ln V + 0.5. Tied (Llama 3.2 1B/3B): std ``init_std`` (HF
    ``LlamaPreTrainedModel._init_weights``), step-1 loss about ln V.
"""

from __future__ import annotations

import math

from torchtitan_lite.init.spec import InitPlan, normal, ones, trunc_normal
from torchtitan_lite.models.llama3.args import Llama3ModelArgs


def llama3_init_plan(args: Llama3ModelArgs) -> InitPlan:
    """The init plan of a Llama 3 model with ``args``: every parameter's distribution and its
    source.

    Returns:
        An :class:`InitPlan` covering each parameter of ``Llama3Model(args)`` (RoPE tables are
        non-persistent buffers rebuilt by ``init_buffers``, not in the plan).
    """
    projection = normal(
        args.init_std, source="torchtitan llama3 trunc_normal_(std=0.02), bounds +-2 = 100 sigma"
    )
    residual = normal(
        args.init_std / math.sqrt(2 * args.n_layers),
        source="0.02/sqrt(2*n_layers): torchtitan llama3 depth_init=False; GPT-2 sec. 2.3",
    )
    if args.tie_embeddings:
        output = trunc_normal(
            args.init_std, source="tied: output spec wins; std initializer_range (HF Llama)"
        )
    else:
        output = trunc_normal(
            args.dim**-0.5, source="dim^-0.5, 3 sigma: torchtitan llama3 final_out_std"
        )
    norm = ones(source="RMSNorm weight = 1 (torchtitan, HF LlamaRMSNorm)")
    return InitPlan(
        model="llama3",
        entries=(  # grouped by distribution, as the module docstring lists them
            (
                "tok_embeddings.weight",
                normal(1.0, source="N(0, 1): torchtitan llama3 nn.init.normal_"),
            ),
            ("layers.*.attention.wq.weight", projection),
            ("layers.*.attention.wk.weight", projection),
            ("layers.*.attention.wv.weight", projection),
            ("layers.*.feed_forward.w1.weight", projection),
            ("layers.*.attention.wo.weight", residual),
            ("layers.*.feed_forward.w2.weight", residual),
            ("layers.*.feed_forward.w3.weight", residual),
            ("layers.*.attention_norm.weight", norm),
            ("layers.*.ffn_norm.weight", norm),
            ("norm.weight", norm),
            ("output.weight", output),
        ),
    )
