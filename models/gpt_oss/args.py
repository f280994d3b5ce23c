"""GPT-OSS model arguments and flavors (OpenAI gpt-oss-20b / gpt-oss-120b, model card of Aug 2025)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class GptOssModelArgs:
    """Hyperparameters of a GPT-OSS model (name of the field; HF ``config.json`` key in brackets).

    Defaults are the values shared by the published gpt-oss-20b and gpt-oss-120b ``config.json``.
    Derive a variant with ``dataclasses.replace(args, swiglu_limit=5.0)``: the checks run again.

    Raises:
        ValueError: a size that is not a positive integer, ``n_heads`` not a multiple of
            ``n_kv_heads``, an odd ``head_dim``, ``experts_per_token > num_experts``, or a float
            outside its range (named in the message).
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
    hidden_dim: int = 2880
    """Inner width of each expert's clamped SwiGLU [intermediate_size]."""
    num_experts: int = 32
    """Experts per MoE layer [num_local_experts]."""
    experts_per_token: int = 4
    """Top-k experts each token is routed to [num_experts_per_tok]."""
    vocab_size: int = 201088
    """Vocabulary size (o200k_harmony) [vocab_size]."""
    swiglu_limit: float = 7.0
    """Clamp bound of the clamped SwiGLU [swiglu_limit]."""
    swiglu_alpha: float = 1.702
    """Sigmoid slope of the SwiGLU gate (reference ``swiglu``; not in config.json)."""
    sliding_window: int = 128
    """Keys visible to each query (itself included) on the sliding layers, the even ones [sliding_window]."""
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
    """Length of the RoPE tables: the longest sequence the model accepts [max_position_embeddings]."""
    tie_embeddings: bool = False
    """``output.weight is tok_embeddings.weight``; False in both releases [tie_word_embeddings]."""
    init_std: float = 0.02
    """Std of the random initial weights [initializer_range]."""
    load_balance_coeff: float = 0.01
    """Weight of each MoE layer's load-balancing loss; 0 turns it off. 0.01 is the Switch Transformer
    value (Fedus et al. 2021, sec. 2.2); the OpenAI reference trains none, and HF's
    ``router_aux_loss_coef`` 0.9 weighs one loss over all layers' tokens, not one per layer."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise ValueError(f"GptOssModelArgs.{f.name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"GptOssModelArgs: n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"GptOssModelArgs.head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"GptOssModelArgs: experts_per_token ({self.experts_per_token}) must be <= num_experts "
                f"({self.num_experts})"
            )
        for name in ("swiglu_limit", "swiglu_alpha", "norm_eps", "init_std"):
            if not getattr(self, name) > 0:
                raise ValueError(f"GptOssModelArgs.{name} must be > 0, got {getattr(self, name)!r}")
        if not self.rope_theta > 1:
            raise ValueError(f"GptOssModelArgs.rope_theta must be > 1, got {self.rope_theta!r}")
        if not self.rope_factor >= 1:
            raise ValueError(f"GptOssModelArgs.rope_factor must be >= 1 (1 = no YaRN), got {self.rope_factor!r}")
        if not 0 < self.rope_beta_slow < self.rope_beta_fast:
            raise ValueError(
                "GptOssModelArgs: need 0 < rope_beta_slow < rope_beta_fast, got "
                f"{self.rope_beta_slow!r} and {self.rope_beta_fast!r}"
            )
        if not self.load_balance_coeff >= 0:
            raise ValueError(f"GptOssModelArgs.load_balance_coeff must be >= 0, got {self.load_balance_coeff!r}")


# Published sizes: config.json of openai/gpt-oss-20b and openai/gpt-oss-120b (they differ only in
# num_hidden_layers and num_local_experts). Totals on meta, checked in tests/test_gpt_oss.py:
# 20,914,757,184 and 116,829,156,672 parameters (model card: 20.91B and 116.83B).
_20B = GptOssModelArgs()

# Debug: vocab 2048 = the bundled byte-level BPE tokenizer; max_seq_len 256 > window 128, so both the
# sliding and the full-causal path run; the published YaRN, SwiGLU and window constants.
_DEBUG = replace(
    _20B, dim=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=256, num_experts=8,
    experts_per_token=2, vocab_size=2048, max_seq_len=256,
)

gpt_oss_flavors: dict[str, GptOssModelArgs] = {
    "debug": _DEBUG,
    "20b": _20B,
    "120b": replace(_20B, n_layers=36, num_experts=128),
}
