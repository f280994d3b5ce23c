"""GPT-OSS model arguments and flavors (OpenAI gpt-oss-20b / gpt-oss-120b, model card of Aug
2025)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from torchtitan_lite.models.common import arg_checks as check


@dataclass(frozen=True)
class GptOssModelArgs:
    """Hyperparameters of a GPT-OSS model (name of the field; HF ``config.json`` key in brackets).

    Defaults are the values shared by the published gpt-oss-20b and gpt-oss-120b ``config.json``.
    Derive a variant with ``dataclasses.replace(args, swiglu_limit=5.0)``: the checks run again.

    Raises:
        ValueError: a size that is not a positive integer, ``n_heads`` not a multiple of
            ``n_kv_heads``, an odd ``head_dim``, ``top_k > num_experts``, a non-bool
            ``tie_embeddings``, or a float outside its range (named in the message).
    """

    dim: int = 2880
    """Model width [hidden_size]."""
    n_layers: int = 24
    """Number of transformer blocks [num_hidden_layers]."""
    n_heads: int = 64
    """Query heads [num_attention_heads]."""
    n_kv_heads: int = 8
    """Key/value heads, a divisor of ``n_heads`` (GQA) [num_key_value_heads]."""
    head_dim: int = 64
    """Per-head size (64 * 64 = 4096 != dim 2880) [head_dim]."""
    moe_inter_dim: int = 2880
    """Inner width of each expert's clamped SwiGLU [intermediate_size]."""
    num_experts: int = 32
    """Experts per MoE layer [num_local_experts]."""
    top_k: int = 4
    """Experts each token is routed to [num_experts_per_tok]."""
    vocab_size: int = 201088
    """Vocabulary size (o200k_harmony) [vocab_size]."""
    swiglu_limit: float = 7.0
    """Clamp bound of the clamped SwiGLU [swiglu_limit]."""
    swiglu_alpha: float = 1.702
    """Sigmoid slope of the SwiGLU gate (reference ``swiglu``; not in config.json)."""
    sliding_window: int = 128
    """Keys visible to each query (itself included) on the sliding layers, the even ones
    [sliding_window]."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon [rms_norm_eps]."""
    rope_theta: float = 150000.0
    """RoPE base [rope_theta]."""
    rope_factor: float = 32.0
    """YaRN context extension factor [rope_scaling.factor]."""
    rope_original_max_seq_len: int = 4096
    """Pre-extension context of YaRN [rope_scaling.original_max_position_embeddings]."""
    rope_beta_fast: float = 32.0
    """YaRN ramp bound, in turns over the original context [rope_scaling.beta_fast]."""
    rope_beta_slow: float = 1.0
    """YaRN ramp bound, in turns over the original context [rope_scaling.beta_slow]."""
    max_seq_len: int = 131072
    """Length of the RoPE tables: the longest sequence the model accepts
    [max_position_embeddings]."""
    tie_embeddings: bool = False
    """``output.weight is tok_embeddings.weight``; False in both releases [tie_word_embeddings]."""
    init_std: float = 0.02
    """Std of the random initial weights [initializer_range]."""
    aux_loss_coeff: float = 0.01
    """Weight of each MoE layer's Switch load-balancing loss (``models/common/balance_loss.py``); 0
    = off. 0.01 is the Switch Transformer value (Fedus et al. 2021, sec. 2.2); the OpenAI reference
    trains none, and HF's ``router_aux_loss_coef`` 0.9 weighs one loss over all layers' tokens, not
    one per layer."""

    def __post_init__(self) -> None:
        check.ints(self)
        check.multiple(self, "n_heads", "n_kv_heads")
        check.even(self, "head_dim")
        check.at_most(self, "top_k", "num_experts")
        check.bools(self, "tie_embeddings")
        check.positive(self, "swiglu_limit", "swiglu_alpha", "norm_eps", "init_std")
        check.rope(self, yarn=True)
        check.non_negative(self, "aux_loss_coeff")


# Published sizes: config.json of openai/gpt-oss-20b and openai/gpt-oss-120b (they differ only in
# num_hidden_layers and num_local_experts). Totals on meta, checked in tests/test_gpt_oss.py:
# 20,914,757,184 and 116,829,156,672 parameters (model card: 20.91B and 116.83B).
_20B = GptOssModelArgs()

# Debug: vocab 2048 = the bundled byte-level BPE tokenizer; max_seq_len 256 > window 128, so both
#     the
# sliding and the full-causal path run; the published YaRN, SwiGLU and window constants.
_DEBUG = replace(
    _20B,
    dim=256,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    head_dim=64,
    moe_inter_dim=256,
    num_experts=8,
    top_k=2,
    vocab_size=2048,
    max_seq_len=256,
)

gpt_oss_flavors: dict[str, GptOssModelArgs] = {
    "debug": _DEBUG,
    "20b": _20B,
    "120b": replace(_20B, n_layers=36, num_experts=128),
}
