"""Active parameters and training FLOPs of Qwen3-MoE, computed from the args alone."""

from __future__ import annotations

from torchtitan_lite.models.qwen3_moe.args import Qwen3MoeModelArgs


def num_active_params(args: Qwen3MoeModelArgs) -> int:
    """Parameters used per token: all but the ``tok_embeddings`` lookup and the unchosen experts.

    3,041,867,776 for 30b-a3b (model card "3.3B activated" counts the input embedding:
    3,353,032,704).
    """
    a = args
    attention = a.dim * a.head_dim * (2 * a.n_heads + 2 * a.n_kv_heads) + 2 * a.head_dim
    moe = a.dim * a.num_experts + a.top_k * 3 * a.dim * a.moe_inter_dim
    return a.n_layers * (attention + 2 * a.dim + moe) + a.dim + a.dim * a.vocab_size


def num_flops_per_token(args: Qwen3MoeModelArgs, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) for sequences of ``seq_len`` tokens.

    ``6 * num_active_params + 12 * n_layers * n_heads * head_dim * seq_len``: 6N for the matmuls of
    forward (2N) and backward (4N), N the active parameters (:func:`num_active_params`: router and
    top-k experts; norms included as torchtitan counts all parameters; the output, not the embedding
    lookup), and ``12 * h * d * T`` per layer for the attention scores and weighted values over the
    full ``T x T`` square (PaLM, Chowdhery et al. 2022, app. B; torchtitan
    ``get_dense_model_nparams_and_flops``).

    Raises:
        ValueError: ``seq_len`` is not positive.
    """
    if seq_len <= 0:
        raise ValueError(f"num_flops_per_token: seq_len must be > 0, got {seq_len}")
    a = args
    return 6.0 * num_active_params(a) + 12.0 * a.n_layers * a.n_heads * a.head_dim * seq_len
