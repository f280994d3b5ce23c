"""Llama 3 <-> Hugging Face transformers: tensor names and ``config.json`` (``LlamaForCausalLM``,
``model_type`` ``llama``).

Names (HF ``modeling_llama.py``), besides the decoder's (``models/common/hf_adapter.py``): the
attention (``models/common/hf_attention.py``, no QK-norm) and ``mlp.gate_proj/up_proj/down_proj`` =
``feed_forward.w1/w3/w2``, one to one: the HF checkpoints were converted from Meta's (which pair
RoPE features ``(2i, 2i+1)``) by permuting the ``wq``/``wk`` rows into the ``rotate_half`` pairing
our RoPE uses (``models/common/rope.py``).

Config (:meth:`Llama3StateDictAdapter.args_from_hf_config`): no attention or MLP biases, no dropout;
RoPE plain (Llama 3.0) or ``rope_type: llama3`` (3.1, 3.2); ``pretraining_tp`` (Meta's
tensor-parallel degree, which transformers' Llama modules do not read) changes nothing; anything
else is refused.
"""

from __future__ import annotations

from typing import Any

from torchtitan_lite.models.common.hf_adapter import (
    SWIGLU_NAMES,
    DecoderStateDictAdapter,
    read_decoder,
    same,
)
from torchtitan_lite.models.common.hf_attention import (
    ATTENTION_NAMES,
    DEFAULT_THETA,
    heads_config,
    read_heads,
)
from torchtitan_lite.models.common.hf_config import FILE_FIELDS, ConfigFields, rope_parameters
from torchtitan_lite.protocols.hf_tensors import HFTensor

HF_DEFAULTS = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "head_dim": None,
}
"""transformers' ``LlamaConfig`` defaults for the keys read here (``configuration_llama.py``;
``None``: the key count of heads, ``hidden_size // num_attention_heads`` for ``head_dim``)."""


class Llama3StateDictAdapter(DecoderStateDictAdapter):
    """Maps tensors and configs between our
    :class:`~torchtitan_lite.models.llama3.args.Llama3ModelArgs` model and HF
    ``LlamaForCausalLM``."""

    model_type = "llama"
    architecture = "LlamaForCausalLM"

    @staticmethod
    def args_from_hf_config(config: dict[str, Any]) -> dict[str, Any]:
        """:class:`torchtitan_lite.models.llama3.args.Llama3ModelArgs` field -> value of an HF
        ``config.json`` of ``LlamaForCausalLM``.

        Raises:
            HFConfigError: attention or MLP biases, dropout, another activation, a RoPE other than
                plain or ``llama3``, or a key the model does not implement.
        """
        fields = ConfigFields(config, HF_DEFAULTS, family="llama3")
        fields.ignore(*FILE_FIELDS, "pretraining_tp")
        values = read_decoder(fields)
        values.update(read_heads(fields, head_dim_default=None))
        fields.expect("mlp_bias", False)
        values["hidden_dim"] = fields.get("intermediate_size")
        rope = rope_parameters(fields, DEFAULT_THETA)
        values["rope_scaling"] = rope.expect("rope_type", "default", "llama3") == "llama3"
        values["rope_theta"] = float(rope.get("rope_theta"))
        if values["rope_scaling"]:
            original = rope.get(
                "original_max_position_embeddings", values["max_seq_len"]
            )  # transformers' default
            values.update(
                rope_factor=float(rope.get("factor")),
                rope_original_max_seq_len=original,
                rope_low_freq_factor=float(rope.get("low_freq_factor")),
                rope_high_freq_factor=float(rope.get("high_freq_factor")),
            )
        rope.finish()
        fields.finish()
        return values

    def layer_tensors(self, i: int, prefix: str) -> dict[str, HFTensor]:
        """Attention and SwiGLU, one to one (module docstring)."""
        return same(
            prefix,
            {
                **ATTENTION_NAMES,
                **{f"feed_forward.{k}": f"mlp.{v}" for k, v in SWIGLU_NAMES.items()},
            },
        )

    def family_config(self) -> dict[str, Any]:
        """Attention, MLP and RoPE keys."""
        a = self.args
        rope = None
        if a.rope_scaling:
            rope = {
                "rope_type": "llama3",
                "factor": a.rope_factor,
                "low_freq_factor": a.rope_low_freq_factor,
                "high_freq_factor": a.rope_high_freq_factor,
                "original_max_position_embeddings": a.rope_original_max_seq_len,
            }
        return {
            **heads_config(a),
            "intermediate_size": a.hidden_dim,
            "mlp_bias": False,
            "rope_theta": a.rope_theta,
            "rope_scaling": rope,
        }
