"""Llama 3 model arguments and flavors (dense Llama 3.1 and 3.2 of "The Llama 3 Herd of Models",
arXiv 2407.21783)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from torchtitan_lite.models.common import arg_checks as check


@dataclass(frozen=True)
class Llama3ModelArgs:
    """Hyperparameters of a dense Llama 3 model (name of the field; HF ``config.json`` key in
    brackets).

    Defaults are Llama-3.1-8B's ``config.json``. Derive a variant with
    ``dataclasses.replace(args, n_layers=2)``: the checks below run again on the new instance.

    Raises:
        ValueError: a size that is not a positive integer, ``n_heads`` not a multiple of
            ``n_kv_heads``, an odd ``head_dim``, ``norm_eps``/``init_std`` not positive,
            ``rope_theta <= 1``, a non-bool flag, or, with ``rope_scaling``, ``rope_factor < 1`` or
            not ``0 < rope_low_freq_factor < rope_high_freq_factor``.
    """

    dim: int = 4096
    """Model width [hidden_size]."""
    n_layers: int = 32
    """Number of transformer blocks [num_hidden_layers]."""
    n_heads: int = 32
    """Query heads [num_attention_heads]."""
    n_kv_heads: int = 8
    """Key/value heads, a divisor of ``n_heads`` (GQA) [num_key_value_heads]."""
    head_dim: int = 128
    """Per-head size, ``dim // n_heads`` in every release (64 in Llama-3.2-1B, 128 in the others)
    [head_dim]."""
    hidden_dim: int = 14336
    """SwiGLU inner width: 3.5 ``dim`` in 8B and 70B (Meta's ``ffn_dim_multiplier`` 1.3 and
    ``multiple_of`` 1024), 8192 in 3.2 1B and 3B [intermediate_size]."""
    vocab_size: int = 128256
    """Vocabulary size (the 128K tiktoken vocabulary) [vocab_size]."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon [rms_norm_eps]."""
    rope_theta: float = 500000.0
    """RoPE base [rope_theta]."""
    rope_scaling: bool = True
    """Llama 3.1's RoPE frequency scaling
    (:func:`torchtitan_lite.models.llama3.model.llama3_inv_freq`); False: plain RoPE, as Llama 3.0
    [rope_scaling.rope_type ``"llama3"``]."""
    rope_factor: float = 8.0
    """Low frequencies are divided by this [rope_scaling.factor]."""
    rope_low_freq_factor: float = 1.0
    """Wavelengths above ``rope_original_max_seq_len / rope_low_freq_factor`` are scaled by
    ``1 / rope_factor`` [rope_scaling.low_freq_factor]."""
    rope_high_freq_factor: float = 4.0
    """Wavelengths below ``rope_original_max_seq_len / rope_high_freq_factor`` are kept; between the
    two bounds the frequencies are interpolated [rope_scaling.high_freq_factor]."""
    rope_original_max_seq_len: int = 8192
    """Context length of pre-training before the extension
    [rope_scaling.original_max_position_embeddings]."""
    max_seq_len: int = 131072
    """Length of the RoPE tables: the longest sequence the model accepts
    [max_position_embeddings]."""
    tie_embeddings: bool = False
    """``output.weight is tok_embeddings.weight`` (Llama 3.2 1B and 3B) [tie_word_embeddings]."""
    init_std: float = 0.02
    """Std of the input projections at init (``init_plan.py``) [initializer_range]."""

    def __post_init__(self) -> None:
        check.ints(self)
        check.multiple(self, "n_heads", "n_kv_heads")
        check.even(self, "head_dim")
        check.bools(self, "rope_scaling", "tie_embeddings")
        check.rope(self, yarn=False)
        if self.rope_scaling and not (
            self.rope_factor >= 1 and 0 < self.rope_low_freq_factor < self.rope_high_freq_factor
        ):
            raise ValueError(
                "Llama3ModelArgs: RoPE scaling needs rope_factor >= 1 and 0 < "
                "rope_low_freq_factor < "
                f"rope_high_freq_factor, got {self.rope_factor!r}, {self.rope_low_freq_factor!r} "
                f"and {self.rope_high_freq_factor!r}"
            )
        check.positive(self, "norm_eps", "init_std")


# Published sizes: config.json of meta-llama/Llama-3.1-8B, Llama-3.1-70B, Llama-3.2-1B and
# Llama-3.2-3B (8 KV heads,
# vocab 128256, rope_theta 5e5, rms_norm_eps 1e-5, 131072 positions, rope_scaling llama3 with
# low/high frequency
# factors 1/4 and original context 8192; factor 8 in 3.1, 32 in 3.2; 3.2 ties its embeddings).
# Parameter totals
# (checked in tests/test_llama3.py): 8,030,261,248; 70,553,706,496; 1,235,814,400; 3,212,749,824.
_8B = Llama3ModelArgs()

# Debug: the 8B architecture at CPU size; vocab 2048 = the bundled byte-level BPE tokenizer.
_DEBUG = replace(
    _8B,
    dim=256,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    head_dim=64,
    hidden_dim=768,
    vocab_size=2048,
    max_seq_len=4096,
)

llama3_flavors: dict[str, Llama3ModelArgs] = {
    "debug": _DEBUG,
    "1b": replace(
        _8B,
        dim=2048,
        n_layers=16,
        head_dim=64,
        hidden_dim=8192,
        rope_factor=32.0,
        tie_embeddings=True,
    ),
    "3b": replace(
        _8B,
        dim=3072,
        n_layers=28,
        n_heads=24,
        hidden_dim=8192,
        rope_factor=32.0,
        tie_embeddings=True,
    ),
    "8b": _8B,
    "70b": replace(_8B, dim=8192, n_layers=80, n_heads=64, hidden_dim=28672),
}
