"""Active parameters and training FLOPs of DeepSeek-V3, computed from the args alone."""

from __future__ import annotations

from dataclasses import replace

from torchtitan_lite.models.deepseek_v3.args import DeepSeekV3ModelArgs


def num_active_params(args: DeepSeekV3ModelArgs) -> int:
    """Parameters used per token: all but the ``tok_embeddings`` lookup and the unchosen routed
    experts.

    Gives 36,625,603,584 for 671b (report: 37B activated, which counts the input embedding too:
    37,552,300,544) and 2,579,230,208 for 16b.
    """
    a = args
    if a.q_lora_rank == 0:
        q = a.dim * a.n_heads * a.qk_head_dim
    else:
        q = a.dim * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * a.n_heads * a.qk_head_dim
    kv = a.dim * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank
    kv += a.kv_lora_rank * a.n_heads * (a.qk_nope_head_dim + a.v_head_dim)
    block = q + kv + a.n_heads * a.v_head_dim * a.dim + 2 * a.dim
    expert = 3 * a.dim * a.moe_inter_dim
    moe = a.dim * a.num_experts + (a.top_k + a.num_shared_experts) * expert
    n_moe = a.n_layers - a.n_dense_layers
    return (
        a.n_layers * block
        + a.n_dense_layers * 3 * a.dim * a.hidden_dim
        + n_moe * moe
        + a.dim
        + a.dim * a.vocab_size
    )


def num_flops_per_token(args: DeepSeekV3ModelArgs, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) for sequences of ``seq_len`` tokens.

    ``6 * num_active_params + 6 * n_layers * n_heads * (qk_head_dim + v_head_dim) * seq_len``.
    ``6N`` for the matmuls as in PaLM (Chowdhery et al. 2022, app. B) and torchtitan, N the active
    parameters (:func:`num_active_params`: router, top-k routed and the shared experts; norms
    included as torchtitan counts all parameters; the output, not the embedding lookup).
    Attention adds ``6 * n_heads * (qk_head_dim + v_head_dim) * seq_len`` per layer (scores with
    ``qk_head_dim``, weighted values with ``v_head_dim``; torchtitan's ``12 l h q t`` when both are
    ``q``).

    With ``mtp_num_layers`` = D, depth ``k`` adds the same count for its block, ``eh_proj``, norms
    and output on ``seq_len - k`` of the ``seq_len`` positions (``models/common/mtp.py``).

    Raises:
        ValueError: ``seq_len`` is not positive.
    """
    if seq_len <= 0:
        raise ValueError(f"num_flops_per_token: seq_len must be > 0, got {seq_len}")
    a = args
    attention = 6.0 * a.n_layers * a.n_heads * (a.qk_head_dim + a.v_head_dim) * seq_len
    main = 6.0 * num_active_params(a) + attention
    if not a.mtp_num_layers:
        return main
    # MTP depth k (models/common/mtp.py) runs one MoE block, eh_proj, three norms and the output on
    # seq_len - k
    # positions of each window: per token of the window, (seq_len - k) / seq_len of that work.
    moe_block = (
        num_active_params(replace(a, n_layers=1, n_dense_layers=0)) - a.dim - a.dim * a.vocab_size
    )
    per_position = moe_block + 2 * a.dim * a.dim + 3 * a.dim + a.dim * a.vocab_size
    mtp = 0.0
    for k in range(1, a.mtp_num_layers + 1):
        n = max(seq_len - k, 0)
        mtp += (
            n
            / seq_len
            * (6.0 * per_position + 6.0 * a.n_heads * (a.qk_head_dim + a.v_head_dim) * n)
        )
    return main + mtp
