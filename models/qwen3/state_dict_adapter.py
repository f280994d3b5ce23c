"""Qwen3 <-> Hugging Face transformers: tensor names and ``config.json`` (``Qwen3ForCausalLM``).

Names (HF ``modeling_qwen3.py``), besides the decoder's (``models/common/hf_adapter.py``): the
attention with QK-norm (``models/common/hf_attention.py``), ``mlp.gate_proj/up_proj/down_proj`` =
``feed_forward.w1/w3/w2``.

Config (:func:`args_from_hf_config`): every key is mapped, accepted at the values our model
implements (no attention bias or dropout, no sliding window, plain RoPE), or known to change
nothing; anything else is refused.

Note: docs/design.md, "on the q/k layout".
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
    QK_NORM_NAMES,
    attention_config,
    read_attention,
)
from torchtitan_lite.models.common.hf_config import FILE_FIELDS, ConfigFields
from torchtitan_lite.protocols.hf_tensors import HFTensor

HF_DEFAULTS = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "use_sliding_window": False,
    "attention_dropout": 0.0,
}
"""transformers' ``Qwen3Config`` defaults for the keys read here (``configuration_qwen3.py``)."""


def args_from_hf_config(config: dict[str, Any]) -> dict[str, Any]:
    """:class:`torchtitan_lite.models.qwen3.args.Qwen3ModelArgs` field -> value of an HF
    ``config.json`` of ``Qwen3ForCausalLM``.

    Raises:
        HFConfigError: a key the model does not implement, or one of the values
            :func:`torchtitan_lite.models.common.hf_attention.read_attention` refuses.
    """
    fields = ConfigFields(config, HF_DEFAULTS, family="qwen3")
    fields.ignore(*FILE_FIELDS)
    values = read_decoder(fields)
    values.update(read_attention(fields, head_dim_default=HF_DEFAULTS["head_dim"]))
    values["hidden_dim"] = fields.get("intermediate_size")
    fields.finish()
    return values


class Qwen3StateDictAdapter(DecoderStateDictAdapter):
    """Maps tensors and configs between our
    :class:`~torchtitan_lite.models.qwen3.args.Qwen3ModelArgs` model and HF ``Qwen3ForCausalLM``."""

    model_type = "qwen3"
    architecture = "Qwen3ForCausalLM"
    args_from_hf_config = staticmethod(args_from_hf_config)

    def layer_tensors(self, i: int, prefix: str) -> dict[str, HFTensor]:
        """Attention with QK-norm and the SwiGLU, one to one (module docstring)."""
        ffn = {f"feed_forward.{ours}": f"mlp.{hf}" for ours, hf in SWIGLU_NAMES.items()}
        return same(prefix, {**ATTENTION_NAMES, **QK_NORM_NAMES, **ffn})

    def family_config(self) -> dict[str, Any]:
        """Attention keys and ``intermediate_size``."""
        return {**attention_config(self.args), "intermediate_size": self.args.hidden_dim}
