"""RoPE tables and rotation (models/common/rope.py)."""

import math

import pytest
import torch
from torchtitan_lite.models.common.rope import apply_rope, rope_cos_sin


def test_tables_are_fp32_with_default_frequencies():
    cos, sin = rope_cos_sin(head_dim=8, max_seq_len=5, theta=1e6)
    assert cos.dtype == sin.dtype == torch.float32
    assert cos.shape == sin.shape == (5, 8)
    inv_freq = [1e6 ** (-2 * i / 8) for i in range(4)]
    for p in range(5):
        for i, f in enumerate(inv_freq):
            for col in (i, i + 4):
                assert cos[p, col].item() == pytest.approx(math.cos(p * f), abs=1e-6)
                assert sin[p, col].item() == pytest.approx(math.sin(p * f), abs=1e-6)


def test_rotation_is_complex_multiplication_of_pairs_i_and_i_plus_half():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 3, 8, generator=g)
    cos, sin = rope_cos_sin(8, 6, theta=10_000.0)
    out = apply_rope(x, cos, sin)
    inv_freq = 10_000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    angle = torch.arange(6, dtype=torch.float64)[:, None] * inv_freq  # (seqlen, 4)
    z = (
        torch.complex(x[..., :4].double(), x[..., 4:].double())
        * torch.polar(torch.ones_like(angle), angle)[None, :, None]
    )
    expected = torch.cat([z.real, z.imag], dim=-1).float()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_dot_product_depends_only_on_relative_offset():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 1, 16, generator=g)
    k = torch.randn(1, 1, 1, 16, generator=g)
    cos, sin = rope_cos_sin(16, 64, theta=1e6)

    def score(m: int, n: int) -> float:
        qm = apply_rope(q, cos[m : m + 1], sin[m : m + 1])
        kn = apply_rope(k, cos[n : n + 1], sin[n : n + 1])
        return (qm * kn).sum().item()

    for offset in (0, 3, 17):
        reference = score(offset, 0)
        for start in (5, 20, 40):
            assert score(start + offset, start) == pytest.approx(reference, abs=1e-4)
    assert score(3, 0) != pytest.approx(score(0, 0), abs=1e-3)


def test_position_zero_is_identity_and_norm_is_preserved():
    x = torch.randn(1, 4, 2, 8, generator=torch.Generator().manual_seed(2))
    cos, sin = rope_cos_sin(8, 4, theta=1e6)
    out = apply_rope(x, cos, sin)
    torch.testing.assert_close(out[:, 0], x[:, 0], atol=0, rtol=0)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), atol=1e-5, rtol=1e-5)


def test_custom_inv_freq_replaces_theta():
    inv_freq = torch.tensor([1.0, 0.5])
    cos, sin = rope_cos_sin(4, 3, theta=1e6, inv_freq=inv_freq)
    assert cos[2].tolist() == pytest.approx(
        [math.cos(2.0), math.cos(1.0), math.cos(2.0), math.cos(1.0)]
    )
    assert sin[1].tolist() == pytest.approx(
        [math.sin(1.0), math.sin(0.5), math.sin(1.0), math.sin(0.5)]
    )


def test_output_keeps_input_dtype():
    x = torch.randn(1, 3, 1, 8).bfloat16()
    cos, sin = rope_cos_sin(8, 3, theta=1e6)
    assert apply_rope(x, cos, sin).dtype == torch.bfloat16


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(head_dim=7, max_seq_len=4, theta=1e6),
            "head_dim must be a positive even number, got 7",
        ),
        (dict(head_dim=8, max_seq_len=0, theta=1e6), "max_seq_len must be > 0, got 0"),
        (dict(head_dim=8, max_seq_len=4, theta=0.0), "theta"),
        (
            dict(head_dim=8, max_seq_len=4, theta=1e6, inv_freq=torch.ones(3)),
            r"inv_freq must have shape \(4,\)",
        ),
    ],
)
def test_bad_table_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rope_cos_sin(**kwargs)


def test_mismatched_table_length_raises():
    cos, sin = rope_cos_sin(8, 10, theta=1e6)
    with pytest.raises(ValueError, match=r"slice the tables with \[:seqlen\]"):
        apply_rope(torch.zeros(1, 4, 2, 8), cos, sin)
