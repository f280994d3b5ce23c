"""Qwen3 model arguments and flavors (dense models of the Qwen3 technical report, arXiv
2505.09388)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from torchtitan_lite.models.common import arg_checks as check


@dataclass(frozen=True)
class Qwen3ModelArgs:
    """Hyperparameters of a dense Qwen3 model (names of the field; HF ``config.json`` key in
    brackets).

    Derive a variant with ``dataclasses.replace(args, tie_embeddings=False, max_seq_len=2048)``: the
    checks below run again on the new instance.

    Raises:
        ValueError: a size that is not a positive integer, ``n_heads`` not a multiple of
            ``n_kv_heads``, an odd ``head_dim`` (RoPE rotates pairs), ``norm_eps``/``init_std``/
            ``output_init_std`` not positive, ``rope_theta <= 1``, or a non-bool ``tie_embeddings``.
    """

    dim: int
    """Model width [hidden_size]."""
    n_layers: int
    """Number of transformer blocks [num_hidden_layers]."""
    n_heads: int
    """Query heads [num_attention_heads]."""
    n_kv_heads: int
    """Key/value heads, a divisor of ``n_heads`` (GQA) [num_key_value_heads]."""
    head_dim: int
    """Per-head size; independent of ``dim`` (Qwen3-0.6B: 16 heads * 128 = 2048 != 1024)
    [head_dim]."""
    hidden_dim: int
    """SwiGLU inner width [intermediate_size]."""
    vocab_size: int
    """Vocabulary size: rows of ``tok_embeddings`` and ``output`` [vocab_size]."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon [rms_norm_eps]."""
    rope_theta: float = 1e6
    """RoPE base [rope_theta]."""
    max_seq_len: int = 40960
    """Length of the RoPE tables: the longest sequence the model accepts
    [max_position_embeddings]."""
    tie_embeddings: bool = False
    """``output.weight is tok_embeddings.weight`` [tie_word_embeddings]."""
    init_std: float = 0.02
    """Std of the input projections and the embedding at init (``init_plan.py``)
    [initializer_range]."""
    output_init_std: float | None = None
    """Std of ``output.weight`` at init; ``None`` = the plan's default (tied: ``init_std``,
    untied: ``dim ** -0.5``). A debugging knob: ``1.0`` on a tied model reproduces the broken
    "output left at the embedding's std-1 init" (step-1 loss in the hundreds)."""

    def __post_init__(self) -> None:
        check.ints(self)
        check.multiple(self, "n_heads", "n_kv_heads")
        check.even(self, "head_dim")
        check.bools(self, "tie_embeddings")
        if self.output_init_std is not None:
            check.positive(self, "output_init_std")
        check.positive(self, "norm_eps", "init_std")
        check.rope(self, yarn=False)


# Debug: vocab 2048 = the bundled byte-level BPE tokenizer; trains on a CPU.
_DEBUG = Qwen3ModelArgs(
    dim=256,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    head_dim=64,
    hidden_dim=768,
    vocab_size=2048,
    max_seq_len=4096,
    tie_embeddings=True,
)


def _published(
    dim: int, n_layers: int, n_heads: int, hidden_dim: int, tie_embeddings: bool
) -> Qwen3ModelArgs:
    """A released dense Qwen3 size: the values shared by all their ``config.json`` files are fixed
    here (8 KV heads, head_dim 128, vocab 151936, rope_theta 1e6, rms_norm_eps 1e-6, 40960
    positions)."""
    return Qwen3ModelArgs(
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=8,
        head_dim=128,
        hidden_dim=hidden_dim,
        vocab_size=151936,
        norm_eps=1e-6,
        rope_theta=1e6,
        max_seq_len=40960,
        tie_embeddings=tie_embeddings,
    )


# Published sizes: config.json of the Hugging Face model cards Qwen/Qwen3-{0.6B,1.7B,4B,8B,14B,32B}
# (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, tie_word_embeddings); the
# original releases, not the 2507 updates (Qwen3-4B-Instruct-2507: rope_theta 5e6, 262144
# positions).
# Parameter totals (checked in tests/test_qwen3.py) as listed in keras-hub's qwen3_presets.py.
qwen3_flavors: dict[str, Qwen3ModelArgs] = {
    "debug": _DEBUG,
    "debug_untied": replace(_DEBUG, tie_embeddings=False),
    "0.6b": _published(dim=1024, n_layers=28, n_heads=16, hidden_dim=3072, tie_embeddings=True),
    "1.7b": _published(dim=2048, n_layers=28, n_heads=16, hidden_dim=6144, tie_embeddings=True),
    "4b": _published(dim=2560, n_layers=36, n_heads=32, hidden_dim=9728, tie_embeddings=True),
    "8b": _published(dim=4096, n_layers=36, n_heads=32, hidden_dim=12288, tie_embeddings=False),
    "14b": _published(dim=5120, n_layers=40, n_heads=40, hidden_dim=17408, tie_embeddings=False),
    "32b": _published(dim=5120, n_layers=64, n_heads=64, hidden_dim=25600, tie_embeddings=False),
}
