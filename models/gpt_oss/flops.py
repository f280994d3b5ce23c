"""Active parameters and training FLOPs of GPT-OSS, computed from the args alone."""

from __future__ import annotations

from torchtitan_lite.models.gpt_oss.args import GptOssModelArgs


def num_active_params(args: GptOssModelArgs) -> int:
    """Parameters used per token: all but the embedding table and the unchosen experts.

    Each block counts its attention (weights, biases, sinks), norms, router and ``top_k``
    experts; ``output`` and the final norm are added, ``tok_embeddings`` is a lookup. Gives
    3,608,307,264 for 20b and 5,132,849,472 for 120b (model card: 3.61B and 5.13B active).
    """
    a = args
    qkv = (a.n_heads + 2 * a.n_kv_heads) * a.head_dim
    attention = a.dim * qkv + qkv + a.n_heads * a.head_dim * a.dim + a.dim + a.n_heads
    expert = a.dim * 2 * a.moe_inter_dim + 2 * a.moe_inter_dim + a.moe_inter_dim * a.dim + a.dim
    block = attention + 2 * a.dim + a.dim * a.num_experts + a.num_experts + a.top_k * expert
    return a.n_layers * block + a.dim + a.dim * a.vocab_size


def num_flops_per_token(args: GptOssModelArgs, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) for sequences of ``seq_len`` tokens.

    ``6 * num_active_params + 12 * n_heads * head_dim * sum(context)``: 6N for the matmuls of
    forward (2N) and backward (4N) as in PaLM (Chowdhery et al. 2022, app. B) and torchtitan, N the
    MoE's active parameters (:func:`num_active_params`: router and top-k experts, biases, sinks and
    norms included as torchtitan counts all parameters, the output projection, not the embedding
    lookup). Attention scores and weighted values add ``12 * n_heads * head_dim * context`` per
    layer (torchtitan's ``12 l h q t``), ``context = seq_len`` on full layers and
    ``min(sliding_window, seq_len)`` on sliding (even) ones: the keys a query can see, not the
    kernel's masked square (``tests/test_flops.py`` measures both).

    Raises:
        ValueError: ``seq_len`` is not positive.
    """
    if seq_len <= 0:
        raise ValueError(f"num_flops_per_token: seq_len must be > 0, got {seq_len}")
    a = args
    contexts = [
        min(a.sliding_window, seq_len) if i % 2 == 0 else seq_len for i in range(a.n_layers)
    ]
    return 6.0 * num_active_params(a) + 12.0 * a.n_heads * a.head_dim * sum(contexts)
