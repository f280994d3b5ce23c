"""GPT-OSS <-> Hugging Face transformers: tensor names and ``config.json`` (``GptOssForCausalLM``).

Names (HF ``modeling_gpt_oss.py``), besides the decoder's:
``self_attn.{q,k,v,o}_proj.{weight,bias}`` = ``attention.w{q,k,v,o}``, ``self_attn.sinks`` =
``attention.sinks``, ``mlp.router.{weight,bias}`` = ``moe.router.gate``; the experts are fused 3-D
tensors, with HF's gate/up interleaving (gate at even, up at odd positions of the
``2 * intermediate_size`` axis, as :func:`torchtitan_lite.models.common.experts.clamped_swiglu`
reads them): ``mlp.experts.gate_up_proj`` ``(E, dim, 2H)`` is our ``mlp1_weight`` ``(E, 2H, dim)``
transposed, ``mlp.experts.down_proj`` ``(E, H, dim)`` our ``mlp2_weight`` ``(E, dim, H)``
transposed; the biases ``gate_up_proj_bias`` ``(E, 2H)`` and ``down_proj_bias`` ``(E, dim)`` are
ours as they are. The published gpt-oss safetensors store the two expert weights as MXFP4
``*_blocks``/``*_scales``: the loader dequantizes them into the ``(E, dim, 2H)`` layout first
(``torchtitan_lite/components/hf``).

Config: RoPE is YaRN with ``truncate: false`` (the published ``rope_scaling``;
``rope_type: default`` is YaRN with factor 1), even layers slide over ``sliding_window`` keys
(``layer_types``); ``hidden_act`` is read by no HF GPT-OSS module (the experts' clamped SwiGLU is
fixed); OpenAI's original keys ``experts_per_token`` and ``initial_context_length`` must agree with
``num_experts_per_tok`` and the YaRN original length.
"""

from __future__ import annotations

from typing import Any

from torchtitan_lite.models.common.hf_adapter import (
    DecoderStateDictAdapter,
    moe_counters,
    read_decoder,
    same,
)
from torchtitan_lite.models.common.hf_config import FILE_FIELDS, ConfigFields, rope_parameters
from torchtitan_lite.protocols.hf_tensors import HFTensor, Transposed

_LAYER_NAMES = {
    **{
        f"attention.w{p}.{kind}": f"self_attn.{p}_proj.{kind}"
        for p in "qkvo"
        for kind in ("weight", "bias")
    },
    "attention.sinks": "self_attn.sinks",
    "moe.router.gate.weight": "mlp.router.weight",
    "moe.router.gate.bias": "mlp.router.bias",
    "moe.experts.mlp1_bias": "mlp.experts.gate_up_proj_bias",
    "moe.experts.mlp2_bias": "mlp.experts.down_proj_bias",
}
HF_DEFAULTS = {
    "num_hidden_layers": 36,
    "num_local_experts": 128,
    "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "sliding_window": 128,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "attention_dropout": 0.0,
    "num_experts_per_tok": 4,
    "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0,
    "attention_bias": True,
}
"""transformers' ``GptOssConfig`` defaults for the keys read here (``configuration_gpt_oss.py``)."""
DEFAULT_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
"""transformers' ``GptOssConfig`` RoPE when a config has none."""
DEFAULT_THETA = 150000.0
"""transformers' ``GptOssConfig.default_theta``."""


def sliding_layer_types(n_layers: int) -> list[str]:
    """``layer_types`` of our model: sliding window on even layers (transformers' ``GptOssConfig``
    default)."""
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]


def args_from_hf_config(config: dict[str, Any]) -> dict[str, Any]:
    """:class:`torchtitan_lite.models.gpt_oss.args.GptOssModelArgs` field -> value of an HF
    ``config.json`` of ``GptOssForCausalLM``.

    Raises:
        HFConfigError: no attention bias, attention dropout, layer types other than alternating
            sliding/full, a RoPE other than YaRN without truncation, OpenAI's keys disagreeing, or a
            key the model does not implement.
    """
    fields = ConfigFields(config, HF_DEFAULTS, family="gpt_oss")
    fields.ignore(*FILE_FIELDS, "hidden_act", "router_aux_loss_coef")
    values = read_decoder(fields)
    fields.expect("attention_bias", True)
    fields.expect("attention_dropout", 0.0)
    n_layers = values["n_layers"]
    if fields.has("layer_types") and fields.get("layer_types") != sliding_layer_types(n_layers):
        raise fields.fail(
            "layer_types", "is not sliding_attention on even and full_attention on odd layers"
        )
    top_k = fields.get("num_experts_per_tok")
    if fields.has("experts_per_token") and fields.get("experts_per_token") != top_k:
        raise fields.fail("experts_per_token", f"differs from num_experts_per_tok = {top_k}")
    values.update(
        n_heads=fields.get("num_attention_heads"),
        n_kv_heads=fields.get("num_key_value_heads"),
        head_dim=fields.get("head_dim"),
        moe_inter_dim=fields.get("intermediate_size"),
        num_experts=fields.aliased("num_local_experts", "num_experts"),
        top_k=top_k,
        swiglu_limit=float(fields.get("swiglu_limit")),
        swiglu_alpha=float(fields.get("swiglu_alpha")),
        sliding_window=fields.get("sliding_window"),
    )
    rope = rope_parameters(fields, DEFAULT_THETA, DEFAULT_ROPE)
    kind = rope.expect("rope_type", "yarn", "default")
    values["rope_theta"] = float(rope.get("rope_theta"))
    if kind == "yarn":
        rope.expect("truncate", False)
        values.update(
            rope_factor=float(rope.get("factor")),
            rope_beta_fast=float(rope.get("beta_fast")),
            rope_beta_slow=float(rope.get("beta_slow")),
            rope_original_max_seq_len=rope.get("original_max_position_embeddings"),
        )
    else:
        values.update(rope_factor=1.0, rope_original_max_seq_len=values["max_seq_len"])
    rope.finish()
    original = values["rope_original_max_seq_len"]
    if fields.has("initial_context_length") and fields.get("initial_context_length") != original:
        raise fields.fail(
            "initial_context_length",
            f"differs from the YaRN original_max_position_embeddings {original}",
        )
    fields.finish()
    return values


class GptOssStateDictAdapter(DecoderStateDictAdapter):
    """Maps tensors and configs between our
    :class:`~torchtitan_lite.models.gpt_oss.args.GptOssModelArgs` model and HF
    ``GptOssForCausalLM``."""

    model_type = "gpt_oss"
    architecture = "GptOssForCausalLM"
    args_from_hf_config = staticmethod(args_from_hf_config)

    def layer_tensors(self, i: int, prefix: str) -> dict[str, HFTensor]:
        """Attention with biases and sinks, router, the fused experts transposed (module
        docstring)."""
        return {
            **same(prefix, _LAYER_NAMES),
            "moe.experts.mlp1_weight": Transposed(f"{prefix}mlp.experts.gate_up_proj", (1, 2)),
            "moe.experts.mlp2_weight": Transposed(f"{prefix}mlp.experts.down_proj", (1, 2)),
        }

    def state_tensors(self) -> tuple[str, ...]:
        """The token counters."""
        return moe_counters(self.args)

    def family_config(self) -> dict[str, Any]:
        """Attention, expert and YaRN keys."""
        a = self.args
        rope = {
            "rope_type": "yarn",
            "factor": a.rope_factor,
            "beta_fast": a.rope_beta_fast,
            "beta_slow": a.rope_beta_slow,
            "original_max_position_embeddings": a.rope_original_max_seq_len,
            "truncate": False,
        }
        return {
            "num_attention_heads": a.n_heads,
            "num_key_value_heads": a.n_kv_heads,
            "head_dim": a.head_dim,
            "intermediate_size": a.moe_inter_dim,
            "num_local_experts": a.num_experts,
            "num_experts_per_tok": a.top_k,
            "swiglu_limit": a.swiglu_limit,
            "swiglu_alpha": a.swiglu_alpha,
            "sliding_window": a.sliding_window,
            "layer_types": sliding_layer_types(a.n_layers),
            "attention_bias": True,
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "rope_theta": a.rope_theta,
            "rope_scaling": rope,
        }
