"""Qwen3: published sizes, forward/backward against an explicit reference, causality, ties, init
plan."""

import dataclasses
import functools
import math

import pytest
import torch
import torch.nn.functional as F
from model_helpers import (
    assert_plan_covers_exactly,
    build_random,
    random_token_loss,
    rms_norm,
    rotate_half,
    softmax_attention,
    swiglu,
)

from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.models import get_model_spec
from torchtitan_lite.models.common.attention_backends import causal_attention
from torchtitan_lite.models.common.rope import rope_cos_sin
from torchtitan_lite.models.qwen3 import Qwen3Model, Qwen3ModelArgs, qwen3_flavors, qwen3_init_plan
from torchtitan_lite.models.qwen3.flops import num_flops_per_token, qwen3_num_params

TINY = Qwen3ModelArgs(
    dim=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    hidden_dim=48,
    vocab_size=64,
    rope_theta=1e4,
    max_seq_len=16,
)

# Totals of the released checkpoints (keras-hub qwen3_presets.py "params"; Qwen3-0.6B also on its
# model card).
PUBLISHED_PARAMS = {
    "0.6b": 596_049_920,
    "1.7b": 1_720_574_976,
    "4b": 4_022_468_096,
    "8b": 8_190_735_360,
    "14b": 14_768_307_200,
    "32b": 32_762_123_264,
}


build = functools.partial(
    build_random, Qwen3Model, std=0.1
)  # (args, seed=0): N(0, 0.1) weights, fp32 CPU


def reference_forward(
    params: dict[str, torch.Tensor], tokens: torch.Tensor, args: Qwen3ModelArgs
) -> torch.Tensor:
    """Qwen3 written out: explicit masked softmax attention, RoPE as complex rotation of (i, i +
    d/2)."""
    bs, T = tokens.shape
    half = args.head_dim // 2
    freq = args.rope_theta ** (-torch.arange(half, dtype=torch.float64) * 2 / args.head_dim)
    angle = (torch.arange(T, dtype=torch.float64)[:, None] * freq).float()  # (T, half)
    c, s = angle.cos()[None, :, None], angle.sin()[None, :, None]
    eps = args.norm_eps
    h = params["tok_embeddings.weight"][tokens]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(args.n_layers):
        p = {
            k.removeprefix(f"layers.{i}."): v
            for k, v in params.items()
            if k.startswith(f"layers.{i}.")
        }
        x = rms_norm(h, p["attention_norm.weight"], eps)
        q = (x @ p["attention.wq.weight"].T).view(bs, T, args.n_heads, args.head_dim)
        k = (x @ p["attention.wk.weight"].T).view(bs, T, args.n_kv_heads, args.head_dim)
        v = (x @ p["attention.wv.weight"].T).view(bs, T, args.n_kv_heads, args.head_dim)
        q = rotate_half(rms_norm(q, p["attention.q_norm.weight"], eps), c, s)
        k = rotate_half(rms_norm(k, p["attention.k_norm.weight"], eps), c, s)
        h = (
            h + softmax_attention(q, k, v, mask) @ p["attention.wo.weight"].T
        )  # GQA: repeated kv heads
        x = rms_norm(h, p["ffn_norm.weight"], eps)
        h = h + swiglu(
            x, p["feed_forward.w1.weight"], p["feed_forward.w2.weight"], p["feed_forward.w3.weight"]
        )
    out_w = params["tok_embeddings.weight"] if args.tie_embeddings else params["output.weight"]
    return rms_norm(h, params["norm.weight"], eps) @ out_w.T


@pytest.mark.parametrize("flavor", sorted(PUBLISHED_PARAMS))
def test_parameter_count_on_meta_equals_published_total(flavor):
    args = qwen3_flavors[flavor]
    with torch.device("meta"):
        model = Qwen3Model(args)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED_PARAMS[flavor]
    assert qwen3_num_params(args) == PUBLISHED_PARAMS[flavor]


def test_published_flavors_share_the_qwen3_config_values():
    for flavor in PUBLISHED_PARAMS:
        args = qwen3_flavors[flavor]
        assert (args.head_dim, args.n_kv_heads, args.vocab_size) == (128, 8, 151936)
        assert (args.rope_theta, args.norm_eps, args.max_seq_len) == (1e6, 1e-6, 40960)
        assert args.tie_embeddings == (flavor in ("0.6b", "1.7b", "4b"))
    assert (
        qwen3_flavors["0.6b"].dim != qwen3_flavors["0.6b"].n_heads * qwen3_flavors["0.6b"].head_dim
    )


@pytest.mark.parametrize("tie", [False, True])
def test_forward_and_backward_match_explicit_reference(tie):
    args = dataclasses.replace(TINY, tie_embeddings=tie)
    model = build(args)
    tokens = torch.randint(0, args.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, args.vocab_size, (2, 11), generator=torch.Generator().manual_seed(2))

    logits = model(tokens)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()

    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    ref_logits = reference_forward(params, tokens, args)
    F.cross_entropy(ref_logits.flatten(0, 1), targets.flatten()).backward()

    assert logits.shape == (2, 11, args.vocab_size)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, params[name].grad, atol=1e-5, rtol=0, msg=name)


def test_qk_norm_sees_unrotated_projections_before_rope():
    model = build(TINY)
    attention = model.layers["0"].attention
    seen = {}
    attention.q_norm.register_forward_hook(lambda mod, inp, out: seen.update(q_in=inp[0]))
    attention.k_norm.register_forward_hook(lambda mod, inp, out: seen.update(k_in=inp[0]))
    tokens = torch.randint(0, TINY.vocab_size, (1, 9), generator=torch.Generator().manual_seed(3))
    model(tokens)
    x = model.layers["0"].attention_norm(model.tok_embeddings(tokens))
    torch.testing.assert_close(seen["q_in"], attention.wq(x).view(1, 9, 4, 16), atol=0, rtol=0)
    torch.testing.assert_close(seen["k_in"], attention.wk(x).view(1, 9, 2, 16), atol=0, rtol=0)


def test_changing_token_t_leaves_earlier_logits_unchanged():
    model = build(TINY)
    tokens = torch.randint(0, TINY.vocab_size, (1, 12), generator=torch.Generator().manual_seed(4))
    changed = tokens.clone()
    changed[0, 7] = (tokens[0, 7] + 1) % TINY.vocab_size
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7], atol=0, rtol=0)
    assert (a[:, 7:] - b[:, 7:]).abs().amax(-1).min() > 1e-4


def test_tied_flavor_shares_one_tensor_on_meta_and_untied_does_not():
    with torch.device("meta"):
        tied = Qwen3Model(qwen3_flavors["debug"])
        untied = Qwen3Model(qwen3_flavors["debug_untied"])
    assert tied.output.weight is tied.tok_embeddings.weight
    assert untied.output.weight is not untied.tok_embeddings.weight
    names = [n for n, _ in tied.named_parameters(remove_duplicate=False)]
    assert "output.weight" in names and "tok_embeddings.weight" in names


def test_gqa_shapes_of_debug_flavor():
    args = qwen3_flavors["debug"]
    assert args.n_kv_heads < args.n_heads
    with torch.device("meta"):
        attention = Qwen3Model(args).layers["0"].attention
    assert attention.wq.weight.shape == (args.n_heads * args.head_dim, args.dim)
    assert (
        attention.wk.weight.shape
        == attention.wv.weight.shape
        == (args.n_kv_heads * args.head_dim, args.dim)
    )
    assert attention.q_norm.weight.shape == (args.head_dim,)


def test_init_buffers_fills_fp32_rope_tables_that_are_not_saved():
    with torch.device("meta"):
        model = Qwen3Model(TINY)
    model.to_empty(device="cpu")
    model.init_buffers("cpu")
    cos, sin = rope_cos_sin(TINY.head_dim, TINY.max_seq_len, TINY.rope_theta)
    assert model.rope_cos.dtype == model.rope_sin.dtype == torch.float32
    torch.testing.assert_close(model.rope_cos, cos, atol=0, rtol=0)
    torch.testing.assert_close(model.rope_sin, sin, atol=0, rtol=0)
    assert not any("rope" in k for k in model.state_dict())


def test_init_plan_covers_every_parameter_and_every_entry_matches():
    for flavor in ("debug", "debug_untied"):
        args = qwen3_flavors[flavor]
        with torch.device("meta"):
            model = Qwen3Model(args)
        plan = qwen3_init_plan(args)
        assert_plan_covers_exactly(model, plan)
        assert plan.entries[-1][0] == "output.weight"


def test_init_plan_stds():
    plan = dict(qwen3_init_plan(qwen3_flavors["debug_untied"]).entries)
    assert plan["tok_embeddings.weight"].std == 0.02
    assert plan["layers.*.attention.wo.weight"].std == pytest.approx(0.02 / math.sqrt(8))
    assert plan["layers.*.feed_forward.w2.weight"].std == pytest.approx(0.02 / math.sqrt(8))
    assert plan["output.weight"].std == pytest.approx(256**-0.5)
    assert plan["output.weight"].cutoff == 3.0
    assert dict(qwen3_init_plan(qwen3_flavors["debug"]).entries)["output.weight"].std == 0.02


@pytest.mark.parametrize("flavor", ["debug", "debug_untied"])
def test_step1_loss_on_random_tokens_is_near_ln_vocab(flavor):
    args = dataclasses.replace(qwen3_flavors[flavor], max_seq_len=256)
    with torch.device("meta"):
        model = Qwen3Model(args)
    materialize(model, "cpu")
    result = init_weights(model, qwen3_init_plan(args), seed=0, buffer_device="cpu")
    assert result.initialized_tensors == 11 * args.n_layers + 2 + (0 if args.tie_embeddings else 1)
    assert result.initialized_elements == qwen3_num_params(args)
    loss = random_token_loss(model, args.vocab_size, seed=5)
    ln_v = math.log(args.vocab_size)
    assert ln_v - 0.1 <= loss <= ln_v + 1.0


def test_num_flops_per_token_for_qwen3_0_6b_at_4096():
    args = qwen3_flavors["0.6b"]
    # tied: the 151936 x 1024 table counts once, as the output matmul; 12 * 28 * 16 * 128 * 4096
    #     attention
    assert num_flops_per_token(args, 4096) == 6 * 596_049_920 + 12 * 28 * 16 * 128 * 4096
    untied = qwen3_flavors["8b"]
    assert (
        num_flops_per_token(untied, 1) == 6 * (8_190_735_360 - 151936 * 4096) + 12 * 36 * 32 * 128
    )


def test_registry_returns_the_qwen3_spec():
    spec = get_model_spec("qwen3")
    assert spec.model_cls is Qwen3Model and spec.init_plan is qwen3_init_plan
    assert {"debug", "debug_untied", *PUBLISHED_PARAMS} == set(spec.flavors)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(n_kv_heads=3), r"n_heads \(4\) must be a multiple of n_kv_heads \(3\)"),
        (dict(head_dim=15), "head_dim must be even"),
        (dict(dim=0), "dim must be a positive integer, got 0"),
        (dict(vocab_size=2.5), "vocab_size must be a positive integer, got 2.5"),
        (dict(norm_eps=0.0), "norm_eps must be > 0"),
        (dict(tie_embeddings="yes"), "tie_embeddings must be true or false, got 'yes'"),
    ],
)
def test_bad_args_raise_clear_errors(changes, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TINY, **changes)


def test_causal_attention_rejects_head_counts_that_do_not_group():
    q, kv = torch.zeros(1, 3, 4, 8), torch.zeros(1, 3, 3, 8)
    with pytest.raises(ValueError, match=r"n_heads \(4\) must be a multiple of n_kv_heads \(3\)"):
        causal_attention(q, kv, kv)


def test_sequence_longer_than_max_seq_len_raises():
    model = build(TINY)
    with pytest.raises(ValueError, match="sequence length 17 exceeds max_seq_len 16"):
        model(torch.zeros(1, 17, dtype=torch.long))
