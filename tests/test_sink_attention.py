"""Sink attention (models/common/sink_attention.py) against an explicit float64 softmax over
[scores, sink]."""

from __future__ import annotations

import pytest
import torch

from torchtitan_lite.models.common.sink_attention import sink_attention, sliding_window_causal_mask


def reference_sink_attention(q, k, v, sinks, sliding_window, scale):
    """Explicit softmax over [masked scores, sink], the sink column dropped (reference ``sdpa``)."""
    bs, seqlen, n_heads, head_dim = q.shape
    rep = n_heads // k.shape[2]
    k = k.repeat_interleave(rep, dim=2)
    v = v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    i = torch.arange(seqlen)[:, None]
    j = torch.arange(seqlen)[None, :]
    allowed = (j <= i) if sliding_window is None else (j <= i) & (j > i - sliding_window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    sink = sinks.view(1, n_heads, 1, 1).expand(bs, n_heads, seqlen, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


@pytest.mark.parametrize("sliding_window", [None, 3])
@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim", [(4, 2, 8), (3, 3, 6)])
def test_outputs_and_gradients_match_explicit_float64_softmax(
    sliding_window, n_heads, n_kv_heads, head_dim
):
    gen = torch.Generator().manual_seed(0)
    bs, seqlen = 2, 7
    q = torch.randn(bs, seqlen, n_heads, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(bs, seqlen, n_kv_heads, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(bs, seqlen, n_kv_heads, head_dim, generator=gen, dtype=torch.float64)
    sinks = torch.randn(n_heads, generator=gen, dtype=torch.float64) * 2
    grad_out = torch.randn(bs, seqlen, n_heads, head_dim, generator=gen, dtype=torch.float64)
    scale = head_dim**-0.5

    ref_inputs = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    ref = reference_sink_attention(*ref_inputs, sliding_window, scale)
    ref.backward(grad_out)

    inputs = [t.float().requires_grad_() for t in (q, k, v, sinks)]
    out = sink_attention(*inputs, sliding_window=sliding_window)
    out.backward(grad_out.float())

    assert out.dtype == torch.float32 and out.shape == ref.shape
    torch.testing.assert_close(out.double(), ref.detach(), atol=1e-5, rtol=1e-5)
    for name, got, want in zip("q k v sinks".split(), inputs, ref_inputs, strict=False):
        torch.testing.assert_close(
            got.grad.double(), want.grad, atol=1e-5, rtol=1e-5, msg=f"grad of {name}"
        )


def test_sink_takes_the_weight_it_is_given():
    # One key of value 1, score 0: weight on it is 1 / (1 + exp(sink)).
    q = torch.zeros(1, 1, 1, 4)
    k = torch.zeros(1, 1, 1, 4)
    v = torch.ones(1, 1, 1, 4)
    sinks = torch.tensor([0.0, 2.0]).view(2)
    out = sink_attention(q.expand(1, 1, 2, 4), k, v, sinks)
    expected = 1 / (1 + torch.exp(sinks))
    torch.testing.assert_close(out[0, 0, :, 0], expected)


def test_very_negative_sink_gives_plain_causal_attention():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 5, 2, 8, generator=gen) for _ in range(3))
    out = sink_attention(q, k, v, torch.full((2,), -1e4))
    plain = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    torch.testing.assert_close(out, plain, atol=1e-6, rtol=1e-6)


def test_sliding_window_mask_sees_the_window_most_recent_keys_including_itself():
    mask = sliding_window_causal_mask(6, 3)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [0, 1, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)
    assert mask.sum(dim=1).tolist() == [1, 2, 3, 3, 3, 3]


def test_full_causal_mask_is_lower_triangular():
    assert torch.equal(
        sliding_window_causal_mask(5, None), torch.ones(5, 5, dtype=torch.bool).tril()
    )
    # A window at least as long as the sequence is the full causal mask.
    assert torch.equal(sliding_window_causal_mask(5, 5), sliding_window_causal_mask(5, None))


def test_window_128_limits_position_200_to_keys_73_to_200():
    mask = sliding_window_causal_mask(256, 128)
    visible = mask[200].nonzero().flatten()
    assert visible.min().item() == 73 and visible.max().item() == 200 and visible.numel() == 128


def test_bad_inputs_raise_clear_errors():
    q = torch.zeros(1, 4, 4, 8)
    kv = torch.zeros(1, 4, 3, 8)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        sink_attention(q, kv, kv, torch.zeros(4))
    kv = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match=r"sinks must have shape \(n_heads,\) = \(4,\)"):
        sink_attention(q, kv, kv, torch.zeros(2))
    with pytest.raises(ValueError, match="sliding_window must be > 0"):
        sliding_window_causal_mask(4, 0)
