"""Qwen3-MoE family: published size, forward/backward vs a float64 reference, init plan, step-1
loss."""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
from model_helpers import (
    assert_matches_float64_reference,
    assert_plan_covers_exactly,
    build_random,
    config_model_args,
    poisoned_init,
    random_token_loss,
    rms_norm,
    rotate_half,
    softmax_attention,
    swiglu,
)

from torchtitan_lite.models.common.moe import collect_expert_load
from torchtitan_lite.models.qwen3_moe import (
    Qwen3MoeModel,
    Qwen3MoeModelArgs,
    qwen3_moe_flavors,
    qwen3_moe_init_plan,
)
from torchtitan_lite.models.qwen3_moe.flops import num_active_params, num_flops_per_token

TINY = Qwen3MoeModelArgs(
    dim=16,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=6,
    moe_inter_dim=8,
    num_experts=5,
    top_k=2,
    vocab_size=32,
    max_seq_len=8,
    aux_loss_coeff=0.0,
)

# Qwen/Qwen3-30B-A3B config.json (HF key names).
CONFIG = dict(
    hidden_size=2048,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    moe_intermediate_size=768,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    vocab_size=151936,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
    router_aux_loss_coef=0.001,
)

build = functools.partial(
    build_random, Qwen3MoeModel
)  # (args, seed=0, std=0.3): random weights, fp32 CPU


def reference_forward(
    p: dict[str, torch.Tensor], tokens: torch.Tensor, a: Qwen3MoeModelArgs
) -> torch.Tensor:
    """HF Qwen3MoE written out: QK-norm before RoPE, GQA by repeating heads, softmax top-k
    renormalized."""
    bs, T = tokens.shape
    inv = a.rope_theta ** (-torch.arange(0, a.head_dim, 2, dtype=torch.float64) / a.head_dim)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv
    c, s = ang.cos()[None, :, None], ang.sin()[None, :, None]
    h = p["tok_embeddings.weight"][tokens]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for layer in range(a.n_layers):
        pre = f"layers.{layer}."
        x = rms_norm(h, p[pre + "attention_norm.weight"], a.norm_eps)
        q = (x @ p[pre + "attention.wq.weight"].T).view(bs, T, a.n_heads, a.head_dim)
        k = (x @ p[pre + "attention.wk.weight"].T).view(bs, T, a.n_kv_heads, a.head_dim)
        q = rotate_half(rms_norm(q, p[pre + "attention.q_norm.weight"], a.norm_eps), c, s)
        k = rotate_half(rms_norm(k, p[pre + "attention.k_norm.weight"], a.norm_eps), c, s)
        v = (x @ p[pre + "attention.wv.weight"].T).view(bs, T, a.n_kv_heads, a.head_dim)
        h = h + softmax_attention(q, k, v, mask) @ p[pre + "attention.wo.weight"].T
        x = rms_norm(h, p[pre + "ffn_norm.weight"], a.norm_eps).reshape(-1, a.dim)
        probs = torch.softmax(x @ p[pre + "moe.router.gate.weight"].T, -1)
        top, idx = probs.topk(a.top_k, -1)
        w = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(a.top_k):
                e = idx[t, j]
                out[t] = out[t] + w[t, j] * swiglu(
                    x[t], *(p[f"{pre}moe.experts.{n}"][e] for n in ("w1", "w2", "w3"))
                )
        h = h + out.view(bs, T, a.dim)
    return rms_norm(h, p["norm.weight"], a.norm_eps) @ p["output.weight"].T


def test_30b_a3b_carries_the_config_json_values_and_its_published_parameter_count():
    a = qwen3_moe_flavors["30b-a3b"]
    c = CONFIG
    assert (a.dim, a.n_layers, a.n_heads, a.n_kv_heads, a.head_dim, a.moe_inter_dim) == (
        c["hidden_size"],
        c["num_hidden_layers"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
        c["moe_intermediate_size"],
    )
    assert (a.num_experts, a.top_k, a.route_norm, a.vocab_size, a.norm_eps, a.rope_theta) == (
        c["num_experts"],
        c["num_experts_per_tok"],
        c["norm_topk_prob"],
        c["vocab_size"],
        c["rms_norm_eps"],
        c["rope_theta"],
    )
    assert (a.max_seq_len, a.tie_embeddings, a.aux_loss_coeff) == (
        c["max_position_embeddings"],
        c["tie_word_embeddings"],
        c["router_aux_loss_coef"],
    )
    d, hd, L, E = c["hidden_size"], c["head_dim"], c["num_hidden_layers"], c["num_experts"]
    # q_proj + o_proj, k_proj + v_proj, q_norm + k_norm
    attention = (
        d * hd * c["num_attention_heads"] * 2 + d * hd * c["num_key_value_heads"] * 2 + 2 * hd
    )
    experts = E * 3 * d * c["moe_intermediate_size"]
    total = L * (attention + 2 * d + E * d + experts) + 2 * c["vocab_size"] * d + d
    with torch.device("meta"):
        model = Qwen3MoeModel(a)
    assert (
        sum(p.numel() for p in model.parameters()) == total == 30_532_122_624
    )  # model card: 30.5B
    unchosen = L * (E - c["num_experts_per_tok"]) * 3 * d * c["moe_intermediate_size"]
    assert (
        num_active_params(a) == total - c["vocab_size"] * d - unchosen == 3_041_867_776
    )  # card: 3.3B with embedding


def test_forward_and_backward_match_the_float64_reference():
    model = build(TINY)
    tokens = torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    assert_matches_float64_reference(
        model, model(tokens), lambda p: reference_forward(p, tokens, TINY), out_tol=2e-5
    )
    assert sum(v.sum().item() for v in collect_expert_load(model).values()) == 2 * 16 * 2


def test_flops_are_six_active_params_plus_attention():
    a = qwen3_moe_flavors["debug"]
    assert num_flops_per_token(a, 256) == 6 * num_active_params(a) + 12 * 4 * 4 * 64 * 256


def test_init_plan_coverage_nan_poison_and_step_one_loss_near_ln_v():
    args = qwen3_moe_flavors["debug"]
    with torch.device("meta"):
        model = Qwen3MoeModel(args)
    plan = qwen3_moe_init_plan(args)
    assert_plan_covers_exactly(model, plan)
    poisoned_init(model, plan, seed=7)
    loss = random_token_loss(model, args.vocab_size, seed=8)
    assert math.log(args.vocab_size) - 0.1 < loss < math.log(args.vocab_size) + 0.15


def test_debug_config_reaches_the_model():
    args = config_model_args("qwen3_moe_debug", "--model.overrides.top_k=3")
    assert args == dataclasses.replace(qwen3_moe_flavors["debug"], top_k=3)
