"""Parameter counts and training FLOPs of a decoder of
:class:`torchtitan_lite.models.common.dense_block.DenseBlock` blocks (Qwen3, Llama 3), computed from
the args alone."""

from __future__ import annotations

from typing import Any


def dense_num_params(args: Any, qk_norm: bool, include_embedding: bool = True) -> int:
    """Number of distinct parameters of the decoder (a tied table counted once).

    Args:
        args: reads ``dim``, ``n_layers``, ``n_heads``, ``n_kv_heads``, ``head_dim``,
            ``hidden_dim``, ``vocab_size``, ``tie_embeddings``.
        qk_norm: the blocks' attention has QK-norm (two ``head_dim`` weights per layer).
        include_embedding: count the ``tok_embeddings`` table (``vocab_size * dim``); when False and
            the output is tied, the shared table is not counted either.
    """
    projections = args.dim * args.head_dim * (2 * args.n_heads + 2 * args.n_kv_heads)
    attention = projections + (2 * args.head_dim if qk_norm else 0)
    block = attention + 3 * args.dim * args.hidden_dim + 2 * args.dim
    table = args.vocab_size * args.dim
    n_tables = (1 if args.tie_embeddings else 2) - (0 if include_embedding else 1)
    return args.n_layers * block + args.dim + n_tables * table


def dense_flops_per_token(args: Any, seq_len: int, qk_norm: bool) -> float:
    """Training FLOPs per token (forward + backward) for sequences of ``seq_len`` tokens.

    ``6 * N + 12 * n_layers * n_heads * head_dim * seq_len`` with ``N`` the non-embedding
    parameters (norm weights included, as torchtitan counts all parameters) plus the output
    projection's (a tied table costs a matmul as output, not as a lookup):
    6N for the matmuls of forward (2N) and backward (4N), and 12 * L * H * d_head * T for the
    attention scores and weighted sums (PaLM, Chowdhery et al. 2022, appendix B; torchtitan
    ``get_dense_model_nparams_and_flops``).

    Raises:
        ValueError: ``seq_len`` is not positive.
    """
    if seq_len <= 0:
        raise ValueError(f"num_flops_per_token: seq_len must be > 0, got {seq_len}")
    output = (
        args.vocab_size * args.dim if args.tie_embeddings else 0
    )  # untied: already in the count
    n_matmul = dense_num_params(args, qk_norm, include_embedding=False) + output
    return 6.0 * n_matmul + 12.0 * args.n_layers * args.n_heads * args.head_dim * seq_len
