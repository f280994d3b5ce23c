"""Qwen3 <-> Hugging Face transformers: tensor names and ``config.json`` (``Qwen3ForCausalLM``).

Names (HF ``modeling_qwen3.py``), besides the decoder's (``models/common/hf_adapter.py``): per layer
``self_attn.{q,k,v,o}_proj`` = ``attention.w{q,k,v,o}``, ``self_attn.{q,k}_norm`` = ``attention.{q,k}_norm``,
``mlp.gate_proj/up_proj/down_proj`` = ``feed_forward.w1/w3/w2``.

Note: on the q/k layout. Meta's Llama checkpoints pair RoPE features ``(2i, 2i+1)`` and HF's conversion
script permutes ``wq``/``wk`` rows into HF's ``rotate_half`` pairing ``(i, i + head_dim/2)``. Our RoPE
(``models/common/rope.py``) uses HF's ``rotate_half`` pairing and Qwen3 was released in HF format, so
tensors map one to one with no permutation; ``tests/test_hf_fidelity.py`` pins this by comparing logits with
``transformers``' ``Qwen3ForCausalLM`` on the published architectures.

Config (:func:`args_from_hf_config`): every key is mapped, accepted at the values our model implements (no
attention bias or dropout, no sliding window, plain RoPE), or known to change nothing; anything else is refused.
"""

from __future__ import annotations

from typing import Any

from models.common.hf_adapter import DECODER_KEYS, StateDictAdapter, same
from models.common.hf_config import FILE_FIELDS, ConfigFields, float_or_none, rope_parameters
from models.common.hf_tensors import HFTensor

ATTENTION_NAMES = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
}
"""Our name -> HF name of the Qwen3 attention tensors (shared with Qwen3-MoE), relative to the layer."""
_FFN_NAMES = {
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
HF_DEFAULTS = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 32768, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "attention_bias": False, "use_sliding_window": False, "attention_dropout": 0.0,
}
"""transformers' ``Qwen3Config`` defaults for the keys read here (``configuration_qwen3.py``)."""
DEFAULT_THETA = 10000.0
"""transformers' ``rope_theta`` when a config has none (``PreTrainedConfig.default_theta``)."""


def read_attention(fields: ConfigFields, head_dim_default: int | None) -> dict[str, Any]:
    """The Qwen3 attention keys (shared with Qwen3-MoE) as args fields: heads, ``head_dim`` (default
    ``head_dim_default``, or ``hidden_size // num_attention_heads`` when ``None``, as transformers), RoPE base.

    Raises:
        HFConfigError: attention bias or dropout, a sliding window, RoPE scaling, or a layer type other than
            full attention.
    """
    n_heads = fields.get("num_attention_heads")
    n_kv_heads = fields.get("num_key_value_heads")
    head_dim = fields.get("head_dim", head_dim_default)
    fields.expect("attention_bias", False)
    fields.expect("attention_dropout", 0.0)
    fields.expect("hidden_act", "silu")
    fields.expect("use_sliding_window", False)
    fields.ignore("sliding_window", "max_window_layers")  # transformers reads them only with use_sliding_window
    if fields.has("layer_types") and set(fields.get("layer_types")) != {"full_attention"}:
        raise fields.fail("layer_types", "is not all 'full_attention' (the model has no sliding-window layers)")
    rope = rope_parameters(fields, DEFAULT_THETA)
    rope.expect("rope_type", "default")
    theta = float_or_none(rope.get("rope_theta"))
    rope.finish()
    return {"n_heads": n_heads, "n_kv_heads": n_heads if n_kv_heads is None else n_kv_heads,
            "head_dim": fields.get("hidden_size") // n_heads if head_dim is None else head_dim, "rope_theta": theta}


def read_decoder(fields: ConfigFields) -> dict[str, Any]:
    """The shared decoder keys (:data:`models.common.hf_adapter.DECODER_KEYS`) as args fields."""
    values = {ours: fields.get(hf) for hf, ours in DECODER_KEYS.items()}
    values["norm_eps"], values["init_std"] = float(values["norm_eps"]), float(values["init_std"])
    return values


def args_from_hf_config(config: dict[str, Any]) -> dict[str, Any]:
    """:class:`models.qwen3.args.Qwen3ModelArgs` field -> value of an HF ``config.json`` of ``Qwen3ForCausalLM``.

    Raises:
        HFConfigError: a key the model does not implement, or one of the values :func:`read_attention` refuses.
    """
    fields = ConfigFields(config, HF_DEFAULTS, family="qwen3")
    fields.ignore(*FILE_FIELDS)
    values = read_decoder(fields)
    values.update(read_attention(fields, head_dim_default=HF_DEFAULTS["head_dim"]))
    values["hidden_dim"] = fields.get("intermediate_size")
    fields.finish()
    return values


def attention_config(args: Any) -> dict[str, Any]:
    """The attention keys of ``config.json`` for Qwen3 and Qwen3-MoE args."""
    return {"num_attention_heads": args.n_heads, "num_key_value_heads": args.n_kv_heads, "head_dim": args.head_dim,
            "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
            "rope_theta": args.rope_theta, "rope_scaling": None}


class Qwen3StateDictAdapter(StateDictAdapter):
    """Maps tensors and configs between our :class:`~models.qwen3.args.Qwen3ModelArgs` model and HF ``Qwen3ForCausalLM`` (the
    contract in ``models/common/hf_adapter.py``)."""

    model_type = "qwen3"
    architecture = "Qwen3ForCausalLM"
    args_from_hf_config = staticmethod(args_from_hf_config)

    def layer_tensors(self, i: int, prefix: str) -> dict[str, HFTensor]:
        """Attention and SwiGLU, one to one (module docstring)."""
        return same(prefix, {**ATTENTION_NAMES, **_FFN_NAMES})

    def family_config(self) -> dict[str, Any]:
        """Attention keys and ``intermediate_size``."""
        return {**attention_config(self.args), "intermediate_size": self.args.hidden_dim}
