"""Qwen3-MoE <-> Hugging Face transformers: tensor names and ``config.json``
(``Qwen3MoeForCausalLM``).

Names (HF ``modeling_qwen3_moe.py``): the Qwen3 attention with QK-norm
(``models/common/hf_attention.py``), the router ``mlp.gate`` = ``moe.router.gate`` and the experts
in the published one-tensor-per-expert layout
(:func:`torchtitan_lite.models.common.hf_adapter.per_expert`). The router's expert bias (kept at
zero, see ``models/qwen3_moe/model.py``) and the token counters are ours alone: zero at import, not
exported.

Config: every block is an MoE (``decoder_sparse_step`` 1, no ``mlp_only_layers``), so
``intermediate_size`` (the width of dense blocks) sizes nothing and is not read;
``router_aux_loss_coef`` weighs HF's training loss (over all layers at once), ours is
``aux_loss_coeff`` per layer (``models/qwen3_moe/args.py``).
"""

from __future__ import annotations

from typing import Any

from torchtitan_lite.models.common.hf_adapter import (
    DecoderStateDictAdapter,
    moe_counters,
    per_expert,
    read_decoder,
    same,
)
from torchtitan_lite.models.common.hf_attention import (
    ATTENTION_NAMES,
    QK_NORM_NAMES,
    attention_config,
    read_attention,
)
from torchtitan_lite.models.common.hf_config import FILE_FIELDS, ConfigFields
from torchtitan_lite.protocols.hf_tensors import HFTensor

HF_DEFAULTS = {
    "vocab_size": 151936,
    "hidden_size": 2048,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "use_sliding_window": False,
    "attention_dropout": 0.0,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 768,
    "num_experts_per_tok": 8,
    "num_experts": 128,
    "norm_topk_prob": False,
    "mlp_only_layers": [],
}
"""transformers' ``Qwen3MoeConfig`` defaults for the keys read here (``configuration_qwen3_moe.py``;
it has no
``head_dim``: the attention then uses ``hidden_size // num_attention_heads``)."""


def args_from_hf_config(config: dict[str, Any]) -> dict[str, Any]:
    """:class:`torchtitan_lite.models.qwen3_moe.args.Qwen3MoeModelArgs` field -> value of an HF
    ``config.json`` of ``Qwen3MoeForCausalLM`` (``num_experts`` or transformers 5's
    ``num_local_experts``).

    Raises:
        HFConfigError: a dense block (``decoder_sparse_step`` != 1 or ``mlp_only_layers``), the two
            expert counts disagreeing, or any key
            :func:`torchtitan_lite.models.common.hf_attention.read_attention` refuses.
    """
    fields = ConfigFields(config, HF_DEFAULTS, family="qwen3_moe")
    fields.ignore(*FILE_FIELDS, "intermediate_size", "router_aux_loss_coef")
    values = read_decoder(fields)
    values.update(read_attention(fields, head_dim_default=None))
    fields.expect("decoder_sparse_step", 1)
    fields.expect("mlp_only_layers", [], None)
    values.update(
        moe_inter_dim=fields.get("moe_intermediate_size"),
        num_experts=fields.aliased("num_experts", "num_local_experts"),
        top_k=fields.get("num_experts_per_tok"),
        route_norm=fields.get("norm_topk_prob"),
    )
    fields.finish()
    return values


class Qwen3MoeStateDictAdapter(DecoderStateDictAdapter):
    """Maps tensors and configs between our
    :class:`~torchtitan_lite.models.qwen3_moe.args.Qwen3MoeModelArgs` model and HF
    ``Qwen3MoeForCausalLM``."""

    model_type = "qwen3_moe"
    architecture = "Qwen3MoeForCausalLM"
    args_from_hf_config = staticmethod(args_from_hf_config)

    def layer_tensors(self, i: int, prefix: str) -> dict[str, HFTensor]:
        """Attention, router and the experts one tensor per expert (module docstring)."""
        return {
            **same(
                prefix,
                {**ATTENTION_NAMES, **QK_NORM_NAMES, "moe.router.gate.weight": "mlp.gate.weight"},
            ),
            **per_expert(prefix, self.args.num_experts),
        }

    def state_tensors(self) -> tuple[str, ...]:
        """The router's expert bias (kept at zero) and the token counters."""
        return moe_counters(self.args, names=("router.expert_bias", "tokens_per_expert"))

    def family_config(self) -> dict[str, Any]:
        """Attention and MoE keys; every block is an MoE."""
        a = self.args
        return {
            **attention_config(a),
            "moe_intermediate_size": a.moe_inter_dim,
            "num_experts": a.num_experts,
            "num_experts_per_tok": a.top_k,
            "norm_topk_prob": a.route_norm,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }
