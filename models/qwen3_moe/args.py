"""Qwen3-MoE model arguments and flavors (Qwen3 technical report, arXiv 2505.09388, sec. 2)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from torchtitan_lite.models.common import arg_checks as check


@dataclass(frozen=True)
class Qwen3MoeModelArgs:
    """Hyperparameters of a Qwen3 MoE model (name of the field; HF ``config.json`` key in brackets).

    Defaults are the published Qwen3-30B-A3B values (``config.json`` of Qwen/Qwen3-30B-A3B): every
    block is an MoE (``decoder_sparse_step`` 1, no ``mlp_only_layers``), no shared experts (report
    sec. 2).

    Raises:
        ValueError: a size that is not a positive integer, ``n_heads`` not a multiple of
            ``n_kv_heads``, an odd ``head_dim``, ``top_k > num_experts``, ``rope_theta <= 1``, a
            non-bool flag, or a float out of its range.
    """

    dim: int = 2048
    """Model width [hidden_size]."""
    n_layers: int = 48
    """Number of transformer blocks [num_hidden_layers]."""
    n_heads: int = 32
    """Query heads [num_attention_heads]."""
    n_kv_heads: int = 4
    """Key/value heads, a divisor of ``n_heads`` (GQA) [num_key_value_heads]."""
    head_dim: int = 128
    """Per-head size (32 * 128 = 4096 != dim 2048) [head_dim]."""
    moe_inter_dim: int = 768
    """Inner width of each expert's SwiGLU [moe_intermediate_size]."""
    num_experts: int = 128
    """Experts per MoE layer [num_experts]."""
    top_k: int = 8
    """Experts each token is routed to [num_experts_per_tok]."""
    route_norm: bool = True
    """Renormalize the top-k softmax probabilities to sum 1 [norm_topk_prob]."""
    vocab_size: int = 151936
    """Vocabulary size [vocab_size]."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon [rms_norm_eps]."""
    rope_theta: float = 1e6
    """RoPE base [rope_theta]."""
    max_seq_len: int = 40960
    """Length of the RoPE tables [max_position_embeddings]."""
    tie_embeddings: bool = False
    """``output.weight is tok_embeddings.weight`` [tie_word_embeddings]."""
    init_std: float = 0.02
    """Std of the random initial weights [initializer_range]."""
    aux_loss_coeff: float = 0.001
    """Weight of each MoE layer's Switch load-balancing loss (``models/common/balance_loss.py``); 0
    = off. The release's ``router_aux_loss_coef`` 0.001 (HF applies it once to all layers' tokens
    together)."""

    def __post_init__(self) -> None:
        check.ints(self)
        check.multiple(self, "n_heads", "n_kv_heads")
        check.even(self, "head_dim")
        check.at_most(self, "top_k", "num_experts")
        check.bools(self, "route_norm", "tie_embeddings")
        check.positive(self, "norm_eps", "init_std")
        check.rope(self, yarn=False)
        check.non_negative(self, "aux_loss_coeff")


# Published: Qwen/Qwen3-30B-A3B config.json. 30,532,122,624 parameters on meta (model card: 30.5B),
# 3,041,867,776 activated without the input embedding (model card: 3.3B activated; with it
# 3,353,032,704).
_30B_A3B = Qwen3MoeModelArgs()

# Debug: vocab 2048 = the bundled byte-level BPE tokenizer; 8 experts, top-2.
_DEBUG = replace(
    _30B_A3B,
    dim=256,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    head_dim=64,
    moe_inter_dim=256,
    num_experts=8,
    top_k=2,
    vocab_size=2048,
    max_seq_len=4096,
)

qwen3_moe_flavors: dict[str, Qwen3MoeModelArgs] = {"debug": _DEBUG, "30b-a3b": _30B_A3B}
