"""Shape checks shared by the attention backends (``models/common/attention_backends.py``)."""

from __future__ import annotations

import torch


def check_qkv(
    name: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
) -> tuple[int, int, int, int]:
    """``(bs, seqlen, n_heads, head_dim)`` of ``q`` after checking the inputs of an attention
    backend ``name``.

    Expected: ``q`` ``(bs, seqlen, n_heads, head_dim)``, ``k``
    ``(bs, seqlen, n_kv_heads, head_dim)``, ``v`` ``(bs, seqlen, n_kv_heads, v_head_dim)`` with
    ``n_heads`` a multiple of ``n_kv_heads``, ``sinks`` ``(n_heads,)``, ``document_ids`` integer
    ``(bs, seqlen)``.

    Raises:
        ValueError: the first input that breaks the above, with its shape.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"{name}: q, k, v must be (bs, seqlen, heads, head_dim), got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"{name}: q, k, v must agree on (bs, seqlen), k and v on n_kv_heads, q and k on "
            f"head_dim; got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    bs, seqlen, n_heads, head_dim = q.shape
    if n_heads % k.shape[2]:
        raise ValueError(
            f"{name}: n_heads ({n_heads}) must be a multiple of n_kv_heads ({k.shape[2]})"
        )
    if sinks is not None and tuple(sinks.shape) != (n_heads,):
        raise ValueError(
            f"{name}: sinks must have shape (n_heads,) = ({n_heads},), got {tuple(sinks.shape)}"
        )
    if document_ids is not None and (
        tuple(document_ids.shape) != (bs, seqlen) or document_ids.is_floating_point()
    ):
        raise ValueError(
            f"{name}: document_ids must be integer (bs, seqlen) = ({bs}, {seqlen}), got "
            f"{document_ids.dtype} {tuple(document_ids.shape)}"
        )
    return bs, seqlen, n_heads, head_dim
