"""Multi-head latent attention (models/deepseek_v3/model.py) against a float64 reference written out
here."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from model_helpers import assert_matches_float64_reference, rms_norm, rotate_half

from torchtitan_lite.models.common.rope import rope_cos_sin
from torchtitan_lite.models.common.yarn import yarn_inv_freq
from torchtitan_lite.models.deepseek_v3.args import DeepSeekV3ModelArgs, deepseek_v3_flavors
from torchtitan_lite.models.deepseek_v3.model import MLA, softmax_scale

BASE = DeepSeekV3ModelArgs(
    dim=24,
    n_layers=1,
    n_dense_layers=1,
    n_heads=3,
    vocab_size=16,
    hidden_dim=8,
    moe_inter_dim=8,
    num_experts=4,
    top_k=2,
    num_expert_groups=1,
    num_limited_groups=1,
    q_lora_rank=10,
    kv_lora_rank=12,
    qk_nope_head_dim=6,
    qk_rope_head_dim=4,
    v_head_dim=5,
    max_seq_len=16,
    rope_original_max_seq_len=16,
)


def build(args: DeepSeekV3ModelArgs, seed: int = 0) -> MLA:
    """An MLA with N(0, 0.3) weights and N(1, 0.3) norm weights."""
    mla = MLA(args)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in mla.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if "norm" in name else 0.0))
    return mla


def tables(args: DeepSeekV3ModelArgs) -> tuple[torch.Tensor, torch.Tensor]:
    inv = None
    if args.uses_yarn:
        inv = yarn_inv_freq(
            args.qk_rope_head_dim,
            args.rope_theta,
            args.rope_factor,
            args.rope_original_max_seq_len,
            args.rope_beta_fast,
            args.rope_beta_slow,
        )
    return rope_cos_sin(args.qk_rope_head_dim, args.max_seq_len, args.rope_theta, inv_freq=inv)


def reference_mla(
    p: dict[str, torch.Tensor],
    x: torch.Tensor,
    a: DeepSeekV3ModelArgs,
    inv_freq: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Report eq. 1-11 head by head: latent c_kv, per-head k/v up-projections, RoPE on the decoupled
    parts, one shared RoPE key, explicit causal softmax."""
    bs, T, _ = x.shape
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq.double()[None, :]  # (T, r/2)
    c, s = (
        ang.cos(),
        ang.sin(),
    )  # pairs (i, i + r/2) of the rope features turn by position * inv_freq[i]
    if a.q_lora_rank:
        c_q = rms_norm(x @ p["wq_a.weight"].T, p["q_norm.weight"], a.norm_eps)
        q_all = c_q @ p["wq_b.weight"].T
    else:
        q_all = x @ p["wq.weight"].T
    kv_a = x @ p["wkv_a.weight"].T
    c_kv, k_rope = (
        kv_a[..., : a.kv_lora_rank],
        rotate_half(kv_a[..., a.kv_lora_rank :], c, s),
    )  # one for all heads
    c_kv = rms_norm(c_kv, p["kv_norm.weight"], a.norm_eps)
    w_kv = p["wkv_b.weight"].view(a.n_heads, a.qk_nope_head_dim + a.v_head_dim, a.kv_lora_rank)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    heads = []
    for h in range(a.n_heads):
        q_h = q_all[..., h * a.qk_head_dim : (h + 1) * a.qk_head_dim]
        q_nope, q_rope = (
            q_h[..., : a.qk_nope_head_dim],
            rotate_half(q_h[..., a.qk_nope_head_dim :], c, s),
        )
        k_nope = c_kv @ w_kv[h, : a.qk_nope_head_dim].T
        v = c_kv @ w_kv[h, a.qk_nope_head_dim :].T
        scores = (
            q_nope @ k_nope.transpose(-1, -2) + q_rope @ k_rope.transpose(-1, -2)
        ) * scale  # (bs, T, T)
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
        heads.append(probs @ v)
    return torch.cat(heads, -1) @ p["wo.weight"].T


@pytest.mark.parametrize("q_lora_rank, yarn", [(0, False), (10, False), (10, True)])
def test_mla_matches_the_reference_in_outputs_and_gradients(q_lora_rank, yarn):
    args = dataclasses.replace(BASE, q_lora_rank=q_lora_rank)
    if yarn:  # 16 > 8 positions: YaRN frequencies and the mscale^2 softmax correction
        args = dataclasses.replace(args, rope_original_max_seq_len=8, rope_factor=4.0)
    mla = build(args)
    cos, sin = tables(args)
    x = torch.randn(2, 9, args.dim, generator=torch.Generator().manual_seed(1))
    out = mla(x, cos[:9], sin[:9])
    inv = (
        yarn_inv_freq(
            4, args.rope_theta, args.rope_factor, args.rope_original_max_seq_len, 32.0, 1.0
        )
        if yarn
        else args.rope_theta ** (-torch.arange(0, 4, 2, dtype=torch.float64) / 4)
    )
    scale = 10**-0.5 * ((0.1 * math.log(4.0) + 1) ** 2 if yarn else 1.0)
    assert out.shape == (2, 9, args.dim) and mla.inner_attention.scale == pytest.approx(
        scale, rel=1e-12
    )
    assert_matches_float64_reference(
        mla, out, lambda p: reference_mla(p, x.double(), args, inv, scale), out_tol=1e-5
    )


def test_rope_rotates_only_the_rope_slice_and_the_rope_key_is_shared_by_heads():
    mla = build(BASE)
    cos, sin = tables(BASE)
    x = torch.randn(1, 5, BASE.dim, generator=torch.Generator().manual_seed(3))
    nope = BASE.qk_nope_head_dim
    q0, k0, v0 = mla.qkv(x, cos[:5], sin[:5])  # positions 0..4
    q7, k7, v7 = mla.qkv(x, cos[7:12], sin[7:12])  # the same tokens at positions 7..11
    assert torch.equal(q0[..., :nope], q7[..., :nope]) and torch.equal(
        k0[..., :nope], k7[..., :nope]
    )
    assert torch.equal(v0, v7)
    assert (q0[..., nope:] - q7[..., nope:]).abs().amax() > 1e-2
    assert (k0[..., nope:] - k7[..., nope:]).abs().amax() > 1e-2
    assert torch.equal(k0[:, :, 0, nope:], k0[:, :, 2, nope:])  # one RoPE key for all heads
    # A rotation keeps norms: the rope slice moves on a circle.
    torch.testing.assert_close(q0[..., nope:].norm(dim=-1), q7[..., nope:].norm(dim=-1))
    # Relative positions: the rope part of q.k depends on the position difference only.
    torch.testing.assert_close(
        torch.einsum("bqhd,bkhd->bhqk", q0[..., nope:], k0[..., nope:]),
        torch.einsum("bqhd,bkhd->bhqk", q7[..., nope:], k7[..., nope:]),
        atol=1e-5,
        rtol=1e-5,
    )


def test_published_softmax_scale_includes_the_yarn_mscale_squared():
    v3 = deepseek_v3_flavors["671b"]
    assert v3.uses_yarn and softmax_scale(v3) == pytest.approx(
        192**-0.5 * (0.1 * math.log(40) + 1) ** 2, rel=1e-15
    )
    moonlight = deepseek_v3_flavors["16b"]
    assert not moonlight.uses_yarn and softmax_scale(moonlight) == 192**-0.5


def test_config_validation_rejects_odd_rope_dim_and_inconsistent_sizes():
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even .* got 5"):
        dataclasses.replace(BASE, qk_rope_head_dim=5)
    with pytest.raises(ValueError, match="kv_lora_rank must be a positive integer, got 0"):
        dataclasses.replace(BASE, kv_lora_rank=0)
    with pytest.raises(ValueError, match="n_dense_layers \\(2\\) must be <= n_layers \\(1\\)"):
        dataclasses.replace(BASE, n_dense_layers=2)
    with pytest.raises(
        ValueError, match="num_experts \\(4\\) must split into num_expert_groups \\(3\\)"
    ):
        dataclasses.replace(BASE, num_expert_groups=3)
    with pytest.raises(ValueError, match="groups of 2 experts hold fewer than top_k \\(3\\)"):
        dataclasses.replace(BASE, num_expert_groups=2, top_k=3)
    with pytest.raises(ValueError, match="score_func must be 'sigmoid' or 'softmax', got 'relu'"):
        dataclasses.replace(BASE, score_func="relu")
    assert dataclasses.replace(BASE, q_lora_rank=0).q_lora_rank == 0  # 0 = direct query projection
