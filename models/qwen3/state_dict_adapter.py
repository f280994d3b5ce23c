"""Qwen3 <-> Hugging Face transformers: parameter names and ``config.json`` (``Qwen3ForCausalLM``).

Names (HF ``modeling_qwen3.py``): ``model.embed_tokens`` = ``tok_embeddings``; per layer
``input_layernorm`` = ``attention_norm``, ``self_attn.{q,k,v,o}_proj`` = ``attention.w{q,k,v,o}``,
``self_attn.{q,k}_norm`` = ``attention.{q,k}_norm``, ``post_attention_layernorm`` = ``ffn_norm``,
``mlp.gate_proj/up_proj/down_proj`` = ``feed_forward.w1/w3/w2``; ``model.norm`` = ``norm``;
``lm_head`` = ``output``.

Note: on the q/k layout. Meta's Llama checkpoints pair RoPE features ``(2i, 2i+1)`` and HF's conversion
script permutes ``wq``/``wk`` rows into HF's ``rotate_half`` pairing ``(i, i + head_dim/2)``. Our RoPE
(``models/common/rope.py``) uses HF's ``rotate_half`` pairing and Qwen3 was released in HF format, so
tensors map one to one with no permutation; ``tests/test_hf_io.py`` pins this by comparing logits with
``transformers``' ``Qwen3ForCausalLM`` on the same random weights.

Tied embeddings (``tie_word_embeddings``): HF files then hold ``model.embed_tokens.weight`` and usually
no ``lm_head.weight``; :meth:`Qwen3StateDictAdapter.to_hf` writes only the embedding.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from models.qwen3.args import Qwen3ModelArgs

_LAYER_NAMES = {
    "input_layernorm.weight": "attention_norm.weight",
    "self_attn.q_proj.weight": "attention.wq.weight",
    "self_attn.k_proj.weight": "attention.wk.weight",
    "self_attn.v_proj.weight": "attention.wv.weight",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "self_attn.q_norm.weight": "attention.q_norm.weight",
    "self_attn.k_norm.weight": "attention.k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
}
_TOP_NAMES = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}
_CONFIG_KEYS = {
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "head_dim": "head_dim",
    "intermediate_size": "hidden_dim",
    "vocab_size": "vocab_size",
    "rms_norm_eps": "norm_eps",
    "rope_theta": "rope_theta",
    "max_position_embeddings": "max_seq_len",
    "tie_word_embeddings": "tie_embeddings",
}
"""HF ``config.json`` key -> :class:`Qwen3ModelArgs` field (the brackets in its field docs)."""
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


class Qwen3StateDictAdapter:
    """Maps names and configs between our :class:`Qwen3ModelArgs` model and HF ``Qwen3ForCausalLM``.

    Args:
        args: the arguments of our model.
    """

    def __init__(self, args: Qwen3ModelArgs):
        self.args = args
        self._to_ours = dict(_TOP_NAMES)
        for i in range(args.n_layers):
            self._to_ours.update({f"model.layers.{i}.{hf}": f"layers.{i}.{ours}" for hf, ours in _LAYER_NAMES.items()})
        self._to_hf = {ours: hf for hf, ours in self._to_ours.items()}

    def hf_name(self, name: str) -> str:
        """HF name of our state name ``name`` (e.g. ``layers.0.attention.wq.weight`` ->
        ``model.layers.0.self_attn.q_proj.weight``).

        Raises:
            KeyError: ``name`` is not a parameter of this model.
        """
        return self._to_hf[name]

    def our_name(self, hf_name: str) -> str | None:
        """Our name of the HF tensor ``hf_name``, or ``None`` if this model has no such tensor
        (another architecture, or a layer index beyond ``n_layers``)."""
        return self._to_ours.get(hf_name)

    def hf_names_to_save(self) -> list[str]:
        """Our names to export, in model order: the tied ``output.weight`` is left out (HF writes only the
        embedding when ``tie_word_embeddings``)."""
        names = list(self._to_hf)
        return [n for n in names if not (self.args.tie_embeddings and n == "output.weight")]

    def to_hf_config(self, dtype_name: str) -> dict[str, Any]:
        """The ``config.json`` of ``Qwen3ForCausalLM`` for our args, weights stored as ``dtype_name``."""
        config = {hf: getattr(self.args, ours) for hf, ours in _CONFIG_KEYS.items()}
        config.update({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
                       "attention_bias": False, "rope_scaling": None, "torch_dtype": dtype_name})
        return config

    @staticmethod
    def args_from_hf_config(config: dict[str, Any], base: Qwen3ModelArgs) -> dict[str, Any]:
        """Field -> value that an HF ``config.json`` sets, read into :class:`Qwen3ModelArgs` terms.

        ``rope_theta`` is read from the top level or from ``rope_parameters`` (transformers >= 5).
        Keys the config lacks are left out (so they are not compared).

        Raises:
            ValueError: ``model_type`` is not ``qwen3``, or RoPE scaling is set (not supported).
        """
        if config.get("model_type") != "qwen3":
            raise ValueError(f"model_type is {config.get('model_type')!r}, not 'qwen3'")
        rope = config.get("rope_parameters") or {}
        scaling = config.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if scaling:
            raise ValueError(f"rope scaling {scaling!r} is not supported by this Qwen3 model")
        values = dict(config)
        if "rope_theta" not in values and "rope_theta" in rope:
            values["rope_theta"] = rope["rope_theta"]
        kinds = {f.name: type(getattr(base, f.name)) for f in dataclasses.fields(base)}
        return {ours: kinds[ours](values[hf]) for hf, ours in _CONFIG_KEYS.items() if hf in values}

