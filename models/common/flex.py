"""Causal attention with sinks, sliding windows and documents through FlexAttention and a
``BlockMask``.

The mask is a ``mask_mod`` (causal, ``q_idx - kv_idx < window``, same document) turned into a
``BlockMask``, so fully hidden ``128 x 128`` blocks are skipped and no ``S x S`` tensor exists.
Sinks come from the returned log-sum-exp, as torchtitan's GPT-OSS does: with
``lse_i = log sum_j exp(s_ij)`` over the visible keys, adding ``exp(sink)`` to the denominator
rescales the output by ``exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink)`` (gradients flow
through ``lse``). On accelerators the kernel is compiled (``torch.compile``, Triton); on CPU it runs
the forward only, unfused (torch 2.13 has no CPU backward), for inference and tests.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

from torchtitan_lite.models.common.attention_checks import check_qkv


@functools.cache
def _compiled_flex():
    """``flex_attention`` compiled once per process (FlexAttention needs compilation to run
    fused)."""
    return torch.compile(flex_attention, dynamic=False)


def block_mask(
    seqlen: int,
    sliding_window: int | None,
    document_ids: torch.Tensor | None,
    device: torch.device,
    q_start: int = 0,
) -> object:
    """The ``BlockMask`` of causal attention limited to ``sliding_window`` keys and to each query's
    document (``document_ids`` int ``(bs, seqlen)`` or ``None``), for ``seqlen`` keys and the
    queries at positions ``q_start .. seqlen - 1`` on ``device``."""

    def mask_mod(b, h, q_idx, kv_idx):
        pos = q_idx + q_start
        visible = kv_idx <= pos
        if sliding_window is not None:
            visible = visible & (pos - kv_idx < sliding_window)
        if document_ids is not None:
            visible = visible & (document_ids[b, pos] == document_ids[b, kv_idx])
        return visible

    batch = None if document_ids is None else document_ids.shape[0]
    return create_block_mask(mask_mod, batch, None, seqlen - q_start, seqlen, device=device)


def flex_attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sinks: torch.Tensor | None = None,
    sliding_window: int | None = None,
    document_ids: torch.Tensor | None = None,
    scale: float | None = None,
    q_start: int = 0,
) -> torch.Tensor:
    """Causal grouped-query attention through FlexAttention (module docstring); arguments and result
    as :func:`torchtitan_lite.models.common.attention_backends.attention`; with ``q_start`` > 0 the
    queries are the positions ``q_start ..`` of the keys' span (as
    :func:`torchtitan_lite.models.common.blockwise.block_attention`).

    Raises:
        ValueError: inconsistent shapes.
    """
    n_heads = check_qkv(
        "flex_attention",
        q,
        k[:, q_start:],
        v[:, q_start:],
        sinks,
        None if document_ids is None else document_ids[:, q_start:],
    )[2]
    mask = block_mask(k.shape[1], sliding_window, document_ids, q.device, q_start)
    kernel = flex_attention if q.device.type == "cpu" else _compiled_flex()
    with warnings.catch_warnings():  # on CPU the unfused forward is the intent (module docstring)
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out, aux = kernel(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            block_mask=mask,
            scale=scale,
            enable_gqa=n_heads != k.shape[2],
            return_aux=AuxRequest(lse=True),
        )
    # out (bs, n_heads, seqlen, v_head_dim), aux.lse (bs, n_heads, seqlen) in natural-log units
    if sinks is not None:
        out = out * torch.sigmoid(aux.lse - sinks.float().view(1, n_heads, 1)).unsqueeze(-1).to(
            out.dtype
        )
    return out.transpose(1, 2)
