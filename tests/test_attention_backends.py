"""Every attention backend (models/common/attention_backends.py) equals the dense reference in fp32
on CPU within 1e-5, forward and backward (FlexAttention: forward only, torch 2.13 has no CPU
backward), for windows shorter and longer than the sequence, sequences that are not a multiple of
the tile, documents shorter than a tile, a document that began in the previous window, and GQA, sink
(GPT-OSS) and MLA (DeepSeek-V3: v_head_dim != head_dim) shapes."""

from __future__ import annotations

import pytest
import torch

from torchtitan_lite.components.attention import set_attn_backend
from torchtitan_lite.data.documents import document_ids_from_eos, document_positions
from torchtitan_lite.models.common.attention_backends import (
    InnerAttention,
    attention,
    resolve_backend,
)
from torchtitan_lite.models.common.blockwise import block_attention

SEQLEN, BLOCK = 37, 8  # 37 = 4 tiles of 8 and a partial one

# (n_heads, n_kv_heads, head_dim, v_head_dim, sinks)
SHAPES = {
    "gqa": (4, 2, 8, 8, False),
    "gqa_sinks": (4, 2, 8, 8, True),
    "mla": (3, 3, 12, 8, False),
}
# documents per row: lengths of the pieces (the first one began in the previous window)
DOCS = {
    "one": None,
    "short_and_spanning": [[3, 1, 5, 12, 16], [20, 2, 2, 13]],
}


def inputs(shape: str, docs: str, seed: int = 0):
    """fp32 ``q, k, v, sinks, document_ids, grad_out`` for two rows of ``SEQLEN`` positions."""
    n_heads, n_kv_heads, head_dim, v_head_dim, with_sinks = SHAPES[shape]
    gen = torch.Generator().manual_seed(seed)
    bs = 2
    q = torch.randn(bs, SEQLEN, n_heads, head_dim, generator=gen)
    k = torch.randn(bs, SEQLEN, n_kv_heads, head_dim, generator=gen)
    v = torch.randn(bs, SEQLEN, n_kv_heads, v_head_dim, generator=gen)
    sinks = torch.randn(n_heads, generator=gen) * 2 if with_sinks else None
    doc_ids = None
    if DOCS[docs] is not None:
        doc_ids = torch.stack(
            [
                torch.repeat_interleave(
                    torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths)
                )
                for lengths in DOCS[docs]
            ]
        )
    grad_out = torch.randn(bs, SEQLEN, n_heads, v_head_dim, generator=gen)
    return q, k, v, sinks, doc_ids, grad_out


def run(fn, q, k, v, sinks, grad_out):
    """``fn``'s output and the gradients of ``q, k, v`` (and ``sinks``)."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    sink_leaf = None if sinks is None else sinks.clone().requires_grad_()
    out = fn(*leaves, sink_leaf)
    out.backward(grad_out)
    return out.detach(), [t.grad for t in leaves] + ([] if sink_leaf is None else [sink_leaf.grad])


@pytest.mark.parametrize("docs", sorted(DOCS))
@pytest.mark.parametrize("sliding_window", [None, 5, 64])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_blockwise_equals_the_dense_reference_forward_and_backward(shape, sliding_window, docs):
    q, k, v, sinks, doc_ids, grad_out = inputs(shape, docs)
    scale = 0.3 if shape == "mla" else None  # MLA's own softmax scale (DeepSeek-V3 softmax_scale)

    def reference(q, k, v, s):
        return attention(
            q,
            k,
            v,
            sinks=s,
            sliding_window=sliding_window,
            document_ids=doc_ids,
            scale=scale,
            backend="reference",
        )

    ref_out, ref_grads = run(reference, q, k, v, sinks, grad_out)

    def blockwise(q, k, v, s):
        return block_attention(
            q,
            k,
            v,
            sinks=s,
            sliding_window=sliding_window,
            document_ids=doc_ids,
            scale=scale,
            block_size=BLOCK,
        )

    out, grads = run(blockwise, q, k, v, sinks, grad_out)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    assert len(grads) == len(ref_grads)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("docs,sliding_window", [("one", None), ("short_and_spanning", 5)])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_flex_forward_equals_the_dense_reference(shape, sliding_window, docs):
    q, k, v, sinks, doc_ids, _ = inputs(shape, docs)
    scale = 0.3 if shape == "mla" else None
    kwargs = dict(sinks=sinks, sliding_window=sliding_window, document_ids=doc_ids, scale=scale)
    out = attention(q, k, v, backend="flex", **kwargs)
    torch.testing.assert_close(
        out, attention(q, k, v, backend="reference", **kwargs), atol=1e-5, rtol=1e-5
    )


def test_plain_causal_auto_is_sdpa_and_equals_the_reference():
    q, k, v, _, _, grad_out = inputs("gqa", "one")
    assert resolve_backend("auto", "cpu", plain=True) == "sdpa"
    ref_out, ref_grads = run(
        lambda q, k, v, s: attention(q, k, v, backend="reference"), q, k, v, None, grad_out
    )
    out, grads = run(lambda q, k, v, s: attention(q, k, v), q, k, v, None, grad_out)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_full_causal_sinks_auto_is_sdpa_on_cpu_and_equals_the_reference():
    q, k, v, sinks, _, grad_out = inputs("gqa_sinks", "one")
    assert resolve_backend("auto", "cpu", plain=True, sinks=True) == "sdpa"
    reference = lambda q, k, v, s: attention(q, k, v, sinks=s, backend="reference")  # noqa: E731
    ref_out, ref_grads = run(reference, q, k, v, sinks, grad_out)
    out, grads = run(lambda q, k, v, s: attention(q, k, v, sinks=s), q, k, v, sinks, grad_out)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    assert len(grads) == len(ref_grads) == 4
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_auto_picks_blockwise_on_cpu_and_flex_on_accelerators():
    assert resolve_backend("auto", "cpu", plain=False) == "blockwise"
    assert resolve_backend("auto", "cuda", plain=False) == "flex"
    assert resolve_backend("auto", "cuda", plain=True, sinks=True) == "flex"
    assert resolve_backend("reference", "cuda", plain=True) == "reference"
    with pytest.raises(
        ValueError, match="attention backend must be one of auto, flex, blockwise, reference"
    ):
        resolve_backend("dense", "cpu", plain=True)


def test_set_attn_backend_reaches_every_inner_attention():
    model = torch.nn.Sequential(
        InnerAttention(sliding_window=4), torch.nn.Sequential(InnerAttention())
    )
    set_attn_backend(model, "reference")
    assert [m.attn_backend for m in model.modules() if isinstance(m, InnerAttention)] == [
        "reference",
        "reference",
    ]
    with pytest.raises(
        ValueError, match="attention backend must be one of auto, flex, blockwise, reference"
    ):
        set_attn_backend(model, "dense")


def test_a_query_sees_nothing_of_another_document():
    # Changing keys/values of document 0 leaves every output of document 1 unchanged.
    q, k, v, sinks, _, _ = inputs("gqa_sinks", "one")
    doc_ids = torch.tensor([[0] * 20 + [1] * 17] * 2, dtype=torch.int32)
    out = block_attention(q, k, v, sinks=sinks, document_ids=doc_ids, block_size=BLOCK)
    k2, v2 = k.clone(), v.clone()
    k2[:, :20], v2[:, :20] = torch.randn(2, 20, 2, 8), torch.randn(2, 20, 2, 8)
    out2 = block_attention(q, k2, v2, sinks=sinks, document_ids=doc_ids, block_size=BLOCK)
    assert torch.equal(out[:, 20:], out2[:, 20:])
    assert not torch.equal(out[:, :20], out2[:, :20])


def test_document_ids_and_positions_from_eos():
    eos = 9
    tokens = torch.tensor([[1, 2, eos, 3, eos, 4], [eos, 5, 6, 7, 8, 1]])
    ids = document_ids_from_eos(tokens, eos)
    assert ids.dtype == torch.int32
    assert ids.tolist() == [[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, 1, 1]]
    assert document_positions(ids).tolist() == [[0, 1, 2, 0, 1, 0], [0, 0, 1, 2, 3, 4]]
