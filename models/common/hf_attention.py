"""Hugging Face names and ``config.json`` keys of the grouped-query attention
(:class:`torchtitan_lite.models.common.attention. Attention`) that Qwen3, Qwen3-MoE and Llama 3
share.

Names (HF ``modeling_qwen3.py``, ``modeling_llama.py``), relative to the layer:
``self_attn.{q,k,v,o}_proj`` = ``attention.w{q,k,v,o}``; with QK-norm ``self_attn.{q,k}_norm`` =
``attention.{q,k}_norm``. HF's ``rotate_half`` RoPE is ours (``models/common/rope.py``), so the
projections map one to one.
"""

from __future__ import annotations

from typing import Any

from torchtitan_lite.models.common.hf_config import ConfigFields, float_or_none, rope_parameters

ATTENTION_NAMES = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
}
"""Our name -> HF name of the attention projections, relative to the layer."""
QK_NORM_NAMES = {
    "attention.q_norm.weight": "self_attn.q_norm.weight",
    "attention.k_norm.weight": "self_attn.k_norm.weight",
}
"""Our name -> HF name of the QK-norm weights (Qwen3, Qwen3-MoE), relative to the layer."""
DEFAULT_THETA = 10000.0
"""transformers' ``rope_theta`` when a config has none (``PreTrainedConfig.default_theta``)."""


def read_heads(fields: ConfigFields, head_dim_default: int | None) -> dict[str, Any]:
    """Head counts and ``head_dim`` (default ``head_dim_default``, or
    ``hidden_size // num_attention_heads`` when ``None``, as transformers) as args fields; no
    attention bias or dropout, a SiLU MLP.

    Raises:
        HFConfigError: attention bias or dropout, or another ``hidden_act``.
    """
    n_heads = fields.get("num_attention_heads")
    n_kv_heads = fields.get("num_key_value_heads")
    head_dim = fields.get("head_dim", head_dim_default)
    fields.expect("attention_bias", False)
    fields.expect("attention_dropout", 0.0)
    fields.expect("hidden_act", "silu")
    return {
        "n_heads": n_heads,
        "n_kv_heads": n_heads if n_kv_heads is None else n_kv_heads,
        "head_dim": fields.get("hidden_size") // n_heads if head_dim is None else head_dim,
    }


def read_attention(fields: ConfigFields, head_dim_default: int | None) -> dict[str, Any]:
    """The Qwen3 and Qwen3-MoE attention keys as args fields: :func:`read_heads`, no sliding window,
    plain RoPE of base ``rope_theta``.

    Raises:
        HFConfigError: from :func:`read_heads`, a sliding window, RoPE scaling, or a layer type
            other than full attention.
    """
    values = read_heads(fields, head_dim_default)
    fields.expect("use_sliding_window", False)
    fields.ignore(
        "sliding_window", "max_window_layers"
    )  # transformers reads them only with use_sliding_window
    if fields.has("layer_types") and set(fields.get("layer_types")) != {"full_attention"}:
        raise fields.fail(
            "layer_types", "is not all 'full_attention' (the model has no sliding-window layers)"
        )
    rope = rope_parameters(fields, DEFAULT_THETA)
    rope.expect("rope_type", "default")
    values["rope_theta"] = float_or_none(rope.get("rope_theta"))
    rope.finish()
    return values


def heads_config(args: Any) -> dict[str, Any]:
    """The ``config.json`` keys :func:`read_heads` reads, from ``args``."""
    return {
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
    }


def attention_config(args: Any) -> dict[str, Any]:
    """The attention keys of ``config.json`` for Qwen3 and Qwen3-MoE args (:func:`read_attention`
    reads them)."""
    return {
        **heads_config(args),
        "use_sliding_window": False,
        "rope_theta": args.rope_theta,
        "rope_scaling": None,
    }
