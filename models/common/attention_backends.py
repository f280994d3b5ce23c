"""One switch for the attention kernel of every family: ``model.attn_backend``.

Backends (each takes ``q`` ``(bs, seqlen, n_heads, head_dim)``, ``k``
``(bs, seqlen, n_kv_heads, head_dim)``, ``v`` ``(bs, seqlen, n_kv_heads, v_head_dim)``, optional
per-head ``sinks``, ``sliding_window`` and ``document_ids``):

* ``auto``: plain causal attention (no sinks, window or documents) through SDPA ``is_causal``
  (:func:`causal_attention`: flash / memory-efficient kernels on accelerators, the flash
  kernel on CPU); on CPU also full causal attention with sinks, the sink folded in as a key
  (:func:`~torchtitan_lite.models.common.sink_attention.sink_causal_attention`); anything else
  through ``flex`` on an accelerator and ``blockwise`` on CPU.
* ``flex``: FlexAttention with a ``BlockMask`` (``models/common/flex.py``); on CPU forward only
  (torch 2.13 has no CPU backward), so it serves CPU inference and the CPU exactness test.
* ``blockwise``: exact tiles with an online softmax, forward and backward, memory ``O(S x block)``
  (``models/common/blockwise.py``).
* ``reference``: dense boolean masks through SDPA (``models/common/sink_attention.py``): the
  ``O(S^2)`` test reference, not for training at length.

No backend ever lets a query see a later position, a key outside its window, or another document.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchtitan_lite.models.common.attention_checks import check_qkv
from torchtitan_lite.models.common.blockwise import block_attention
from torchtitan_lite.models.common.flex import flex_attention_op
from torchtitan_lite.models.common.sink_attention import sink_attention, sink_causal_attention
from torchtitan_lite.protocols.attention import ATTN_BACKENDS, AttentionKernel


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """Causal softmax attention, position ``t`` attending to positions ``0 .. t``.

    Runs :func:`torch.nn.functional.scaled_dot_product_attention` with ``is_causal=True`` and
    ``enable_gqa=True`` (forward and backward work on CPU in fp32, and on accelerators).

    Args:
        q: queries ``(bs, seqlen, n_heads, head_dim)``.
        k: keys ``(bs, seqlen, n_kv_heads, head_dim)``.
        v: values ``(bs, seqlen, n_kv_heads, v_head_dim)``.
        scale: softmax scale; default ``head_dim ** -0.5`` (Vaswani et al. 2017).

    Returns:
        ``(bs, seqlen, n_heads, v_head_dim)`` in the dtype of ``q``.

    Raises:
        ValueError: inputs not 4-D, mismatched batch/sequence sizes or head dims, or ``n_heads`` not
            a multiple of ``n_kv_heads``.
    """
    n_heads, n_kv_heads = check_qkv("causal_attention", q, k, v)[2], k.shape[2]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),  # (bs, n_heads, seqlen, head_dim)
        k.transpose(1, 2),  # (bs, n_kv_heads, seqlen, head_dim)
        v.transpose(1, 2),  # (bs, n_kv_heads, seqlen, v_head_dim)
        is_causal=True,
        scale=scale,
        enable_gqa=n_heads != n_kv_heads,
    )
    return out.transpose(1, 2)  # (bs, seqlen, n_heads, v_head_dim)


def resolve_backend(backend: str, device_type: str, plain: bool, sinks: bool = False) -> str:
    """The kernel that runs: ``sdpa``, ``flex``, ``blockwise`` or ``reference`` for a backend name
    (module docstring), a device type (``cpu``, ``cuda``, ...), whether the attention is ``plain``
    causal (no window, no documents) and has ``sinks``.

    Raises:
        ValueError: ``backend`` not one of
            :data:`~torchtitan_lite.protocols.attention.ATTN_BACKENDS`.
    """
    if backend not in ATTN_BACKENDS:
        raise ValueError(
            f"attention backend must be one of {', '.join(ATTN_BACKENDS)}, got {backend!r}"
        )
    if backend != "auto":
        return backend
    if plain and (not sinks or device_type == "cpu"):
        return "sdpa"
    return "blockwise" if device_type == "cpu" else "flex"


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sinks: torch.Tensor | None = None,
    sliding_window: int | None = None,
    document_ids: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Causal grouped-query attention through the chosen backend (module docstring).

    Query ``i`` sees key ``j`` iff ``j <= i``, ``i - j < sliding_window`` (when set) and
    ``document_ids[b, i] == document_ids[b, j]`` (when given); a sink adds ``exp(sinks[h])`` to head
    ``h``'s softmax denominator.

    Args:
        q, k, v: see the module docstring.
        sinks: ``(n_heads,)`` sink logits, or ``None``.
        sliding_window: keys visible to each query, itself included, or ``None``.
        document_ids: int32/int64 ``(bs, seqlen)``, the document of each position (non-decreasing),
            or ``None``.
        scale: softmax scale; default ``head_dim ** -0.5``.
        backend: one of :data:`~torchtitan_lite.protocols.attention.ATTN_BACKENDS`.

    Returns:
        ``(bs, seqlen, n_heads, v_head_dim)`` in the dtype of ``q``.

    Raises:
        ValueError: an unknown backend or inconsistent shapes.
    """
    plain = sliding_window is None and document_ids is None
    kernel = resolve_backend(backend, q.device.type, plain, sinks is not None)
    if kernel == "sdpa" and sinks is not None:
        return sink_causal_attention(q, k, v, sinks, scale=scale)
    if kernel == "sdpa":
        return causal_attention(q, k, v, scale=scale)
    if kernel == "flex":
        return flex_attention_op(
            q,
            k,
            v,
            sinks=sinks,
            sliding_window=sliding_window,
            document_ids=document_ids,
            scale=scale,
        )
    if kernel == "blockwise":
        return block_attention(
            q,
            k,
            v,
            sinks=sinks,
            sliding_window=sliding_window,
            document_ids=document_ids,
            scale=scale,
        )
    return sink_attention(
        q, k, v, sinks, sliding_window=sliding_window, document_ids=document_ids, scale=scale
    )


def chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_start: int,
    *,
    sinks: torch.Tensor | None = None,
    sliding_window: int | None = None,
    document_ids: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """:func:`attention` of the queries at positions ``q_start ..`` of the keys' span (a
    context-parallel chunk): ``q`` ``(bs, seqlen - q_start, n_heads, head_dim)``,
    ``k``/``v``/``document_ids`` over positions ``0 .. seqlen - 1``. The kernel, whatever
    ``attn_backend``: ``blockwise`` on CPU, ``flex`` on accelerators, both with the queries offset
    to their positions.

    Raises:
        ValueError: inconsistent shapes.
    """
    kernel = block_attention if q.device.type == "cpu" else flex_attention_op
    return kernel(
        q,
        k,
        v,
        sinks=sinks,
        sliding_window=sliding_window,
        document_ids=document_ids,
        scale=scale,
        q_start=q_start,
    )


class InnerAttention(AttentionKernel):
    """:func:`attention` as a parameterless module (torchtitan's ``inner_attention``): the kernel of
    a layer, a boundary where tensor parallelism hands it plain local tensors (the rank's heads and
    sinks).

    Args:
        sliding_window: keys visible to each query, or ``None`` for full causal attention.
        scale: softmax scale; ``None`` = ``head_dim ** -0.5``.

    ``attn_backend`` (default ``auto``) is set for a whole model by the engine
    (:func:`torchtitan_lite.components.attention.set_attn_backend`), and under context parallelism
    ``cp``, the rank's share of the window (``torchtitan_lite/distributed/context_parallel.py``):
    the layer then passes the keys and values of the whole window (:meth:`gather`) with its local
    queries and document ids.
    """

    def __init__(self, sliding_window: int | None = None, scale: float | None = None):
        super().__init__()
        self.sliding_window, self.scale = sliding_window, scale

    def gather(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each of ``tensors`` ``(bs, seqlen, ...)`` over the whole window (``cp.gather``, with
        autograd); as they are without context parallelism."""
        return tensors if self.cp is None else tuple(self.cp.gather(t) for t in tensors)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        sinks: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``q`` ``(bs, seqlen, n_heads, head_dim)``, ``k`` ``(bs, seqlen, n_kv_heads, head_dim)``,
        ``v`` ``(bs, seqlen, n_kv_heads, v_head_dim)`` -> ``(bs, seqlen, n_heads, v_head_dim)``.
        Under context parallelism ``k``/``v`` span the whole window (:meth:`gather`), ``q`` and
        ``document_ids`` the rank's chunks, and each chunk attends to the keys up to its end
        (:func:`chunk_attention`)."""
        if self.cp is None:
            return attention(
                q,
                k,
                v,
                sinks=sinks,
                sliding_window=self.sliding_window,
                document_ids=document_ids,
                scale=self.scale,
                backend=self.attn_backend,
            )
        docs = None if document_ids is None else self.cp.gather(document_ids)
        outs = []
        for start, end, position in self.cp.chunks:
            span = position + end - start  # keys 0 .. the chunk's last position
            outs.append(
                chunk_attention(
                    q[:, start:end],
                    k[:, :span],
                    v[:, :span],
                    position,
                    sinks=sinks,
                    sliding_window=self.sliding_window,
                    scale=self.scale,
                    document_ids=None if docs is None else docs[:, :span],
                )
            )
        return torch.cat(outs, dim=1)
