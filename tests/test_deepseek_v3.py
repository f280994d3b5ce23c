"""DeepSeek-V3 family: published sizes, the V3 router, the sequence-wise loss, the full model vs a
float64 reference, the init plan and the step-1 loss."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
from model_helpers import (
    assert_matches_float64_reference,
    assert_plan_covers_exactly,
    build_planned,
    build_random,
    config_model_args,
    logit_change,
    poisoned_init,
    random_token_loss,
    rms_norm,
    swiglu,
)
from test_mla import reference_mla

from torchtitan_lite.models.common.balance_loss import sequence_balance_loss
from torchtitan_lite.models.common.moe import MoE, collect_expert_load
from torchtitan_lite.models.common.routers import TokenChoiceTopKRouter
from torchtitan_lite.models.deepseek_v3 import (
    DeepSeekV3Model,
    DeepSeekV3ModelArgs,
    deepseek_v3_flavors,
    deepseek_v3_init_plan,
)
from torchtitan_lite.models.deepseek_v3.flops import num_active_params, num_flops_per_token

TINY = DeepSeekV3ModelArgs(
    dim=16,
    n_layers=3,
    n_dense_layers=1,
    n_heads=2,
    vocab_size=32,
    hidden_dim=24,
    moe_inter_dim=8,
    num_experts=6,
    num_shared_experts=2,
    top_k=3,
    num_expert_groups=3,
    num_limited_groups=2,
    route_scale=2.5,
    q_lora_rank=6,
    kv_lora_rank=8,
    qk_nope_head_dim=4,
    qk_rope_head_dim=4,
    v_head_dim=6,
    max_seq_len=8,
    rope_original_max_seq_len=8,
    aux_loss_coeff=0.0,
)

# Published config.json values (deepseek-ai/DeepSeek-V3; moonshotai/Moonlight-16B-A3B), HF key
# names.
V3_CONFIG = dict(
    vocab_size=129280,
    hidden_size=7168,
    intermediate_size=18432,
    moe_intermediate_size=2048,
    num_hidden_layers=61,
    num_attention_heads=128,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    n_routed_experts=256,
    n_shared_experts=1,
    num_experts_per_tok=8,
    n_group=8,
    topk_group=4,
    first_k_dense_replace=3,
    routed_scaling_factor=2.5,
    scoring_func="sigmoid",
    norm_topk_prob=True,
    rope_theta=10000.0,
    max_position_embeddings=163840,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_scaling=dict(
        factor=40,
        original_max_position_embeddings=4096,
        beta_fast=32,
        beta_slow=1,
        mscale_all_dim=1.0,
    ),
)
MOONLIGHT_CONFIG = dict(
    vocab_size=163840,
    hidden_size=2048,
    intermediate_size=11264,
    moe_intermediate_size=1408,
    num_hidden_layers=27,
    num_attention_heads=16,
    q_lora_rank=None,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    n_routed_experts=64,
    n_shared_experts=2,
    num_experts_per_tok=6,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    routed_scaling_factor=2.446,
    scoring_func="sigmoid",
    norm_topk_prob=True,
    rope_theta=50000.0,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_scaling=None,
)


def config_param_counts(c: dict) -> tuple[int, int]:
    """(total, activated without the input embedding) from a config.json, tensor by tensor as HF
    names them."""
    d, heads, L, dense = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["num_hidden_layers"],
        c["first_k_dense_replace"],
    )
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    if c["q_lora_rank"]:
        rank = c["q_lora_rank"]
        q_proj = {"q_a_proj": d * rank, "q_a_layernorm": rank, "q_b_proj": rank * heads * qk}
    else:
        q_proj = {"q_proj": d * heads * qk}
    attn = sum(q_proj.values()) + sum(
        {
            "kv_a_proj_with_mqa": d * (c["kv_lora_rank"] + c["qk_rope_head_dim"]),
            "kv_a_layernorm": c["kv_lora_rank"],
            "kv_b_proj": c["kv_lora_rank"] * heads * (c["qk_nope_head_dim"] + c["v_head_dim"]),
            "o_proj": heads * c["v_head_dim"] * d,
        }.values()
    )
    norms = 2 * d  # input_layernorm, post_attention_layernorm
    mlp = lambda width: 3 * d * width  # gate_proj, up_proj, down_proj  # noqa: E731
    gate = (
        c["n_routed_experts"] * d
    )  # mlp.gate.weight (e_score_correction_bias is state, not a parameter here)
    routed = c["n_routed_experts"] * mlp(c["moe_intermediate_size"])
    shared = mlp(c["n_shared_experts"] * c["moe_intermediate_size"])
    embed, head = c["vocab_size"] * d, c["vocab_size"] * d
    total = embed + head + d + dense * (attn + norms + mlp(c["intermediate_size"]))
    total += (L - dense) * (attn + norms + gate + routed + shared)
    unchosen = (
        (L - dense)
        * (c["n_routed_experts"] - c["num_experts_per_tok"])
        * mlp(c["moe_intermediate_size"])
    )
    return total, total - embed - unchosen


build = functools.partial(
    build_random, DeepSeekV3Model
)  # (args, seed=0, std=0.3): random weights, zero state
build_from_plan = functools.partial(
    build_planned, DeepSeekV3Model, deepseek_v3_init_plan
)  # (args, seed=0)


def reference_route(s: torch.Tensor, bias: torch.Tensor, a: DeepSeekV3ModelArgs):
    """Token by token: groups by the sum of their 2 best biased scores, top-k within the kept
    groups."""
    per_group = a.num_experts // a.num_expert_groups
    all_idx, all_w = [], []
    for t in range(s.shape[0]):
        biased = (s[t] + bias).tolist()
        group_score = [
            sum(sorted(biased[g * per_group : (g + 1) * per_group])[-2:])
            for g in range(a.num_expert_groups)
        ]
        kept = sorted(range(a.num_expert_groups), key=lambda g: -group_score[g])[
            : a.num_limited_groups
        ]
        allowed = [e for e in range(a.num_experts) if e // per_group in kept]
        idx = sorted(allowed, key=lambda e: -biased[e])[: a.top_k]
        w = s[t, idx]
        all_idx.append(idx)
        all_w.append(w / w.sum() * a.route_scale)
    return torch.tensor(all_idx), torch.stack(all_w)


def reference_forward(
    p: dict[str, torch.Tensor],
    tokens: torch.Tensor,
    a: DeepSeekV3ModelArgs,
    biases: dict[str, torch.Tensor],
) -> torch.Tensor:
    """The whole model in float64: MLA (test_mla.reference_mla), dense or routed + shared SwiGLU
    experts."""
    inv = a.rope_theta ** (
        -torch.arange(0, a.qk_rope_head_dim, 2, dtype=torch.float64) / a.qk_rope_head_dim
    )
    h = p["tok_embeddings.weight"][tokens]
    bs, T = tokens.shape
    for layer in range(a.n_layers):
        pre = f"layers.{layer}."
        attn_p = {
            k[len(pre + "attention.") :]: v
            for k, v in p.items()
            if k.startswith(pre + "attention.")
        }
        x = rms_norm(h, p[pre + "attention_norm.weight"], a.norm_eps)
        h = h + reference_mla(attn_p, x, a, inv, a.qk_head_dim**-0.5)
        x = rms_norm(h, p[pre + "ffn_norm.weight"], a.norm_eps).reshape(-1, a.dim)
        if layer < a.n_dense_layers:
            out = swiglu(x, *(p[f"{pre}feed_forward.{w}.weight"] for w in ("w1", "w2", "w3")))
        else:
            idx, w = reference_route(
                torch.sigmoid(x @ p[pre + "moe.router.gate.weight"].T), biases[str(layer)], a
            )
            out = swiglu(x, *(p[f"{pre}moe.shared_experts.{n}.weight"] for n in ("w1", "w2", "w3")))
            routed = torch.zeros_like(x)
            for t in range(x.shape[0]):
                for j in range(a.top_k):
                    e = idx[t, j]
                    w1, w2, w3 = (p[f"{pre}moe.experts.{n}"][e] for n in ("w1", "w2", "w3"))
                    routed[t] = routed[t] + w[t, j] * swiglu(x[t], w1, w2, w3)
            out = out + routed
        h = h + out.view(bs, T, a.dim)
    return rms_norm(h, p["norm.weight"], a.norm_eps) @ p["output.weight"].T


# ---------------------------------------------------------------- published sizes


def test_flavors_carry_the_published_config_values():
    for flavor, c in (("671b", V3_CONFIG), ("16b", MOONLIGHT_CONFIG)):
        a = deepseek_v3_flavors[flavor]
        assert (a.vocab_size, a.dim, a.hidden_dim, a.moe_inter_dim, a.n_layers, a.n_heads) == (
            c["vocab_size"],
            c["hidden_size"],
            c["intermediate_size"],
            c["moe_intermediate_size"],
            c["num_hidden_layers"],
            c["num_attention_heads"],
        )
        assert (
            a.q_lora_rank,
            a.kv_lora_rank,
            a.qk_nope_head_dim,
            a.qk_rope_head_dim,
            a.v_head_dim,
        ) == (
            c["q_lora_rank"] or 0,
            c["kv_lora_rank"],
            c["qk_nope_head_dim"],
            c["qk_rope_head_dim"],
            c["v_head_dim"],
        )
        assert (
            a.num_experts,
            a.num_shared_experts,
            a.top_k,
            a.num_expert_groups,
            a.num_limited_groups,
            a.n_dense_layers,
        ) == (
            c["n_routed_experts"],
            c["n_shared_experts"],
            c["num_experts_per_tok"],
            c["n_group"],
            c["topk_group"],
            c["first_k_dense_replace"],
        )
        assert (
            a.route_scale,
            a.score_func,
            a.route_norm,
            a.rope_theta,
            a.max_seq_len,
            a.norm_eps,
        ) == (
            c["routed_scaling_factor"],
            c["scoring_func"],
            c["norm_topk_prob"],
            c["rope_theta"],
            c["max_position_embeddings"],
            c["rms_norm_eps"],
        )
        assert a.tie_embeddings == c["tie_word_embeddings"]
        assert a.uses_yarn == (c["rope_scaling"] is not None)
    v3, rs = deepseek_v3_flavors["671b"], V3_CONFIG["rope_scaling"]
    assert (
        v3.rope_factor,
        v3.rope_original_max_seq_len,
        v3.rope_beta_fast,
        v3.rope_beta_slow,
        v3.rope_mscale,
    ) == (
        rs["factor"],
        rs["original_max_position_embeddings"],
        rs["beta_fast"],
        rs["beta_slow"],
        rs["mscale_all_dim"],
    )


def test_parameter_counts_on_meta_equal_the_counts_derived_from_config_json():
    for flavor, c in (("671b", V3_CONFIG), ("16b", MOONLIGHT_CONFIG)):
        with torch.device("meta"):
            model = DeepSeekV3Model(deepseek_v3_flavors[flavor])
        total = sum(p.numel() for p in model.parameters())
        assert (total, num_active_params(deepseek_v3_flavors[flavor])) == config_param_counts(c), (
            flavor
        )
    with torch.device("meta"):
        assert (
            sum(p.numel() for p in DeepSeekV3Model(deepseek_v3_flavors["671b"]).parameters())
            == 671_026_404_352
        )
    assert (
        num_active_params(deepseek_v3_flavors["671b"]) == 36_625_603_584
    )  # + input embedding: 37.55B ("37B")
    assert config_param_counts(MOONLIGHT_CONFIG) == (
        15_960_108_544,
        2_579_230_208,
    )  # "16B", "A3B" (+ embedding 2.91B)


# ---------------------------------------------------------------- router


def make_router(
    n_groups=4, n_limited=2, top_k=3, score_func="sigmoid", route_norm=True, scale=2.5
) -> TokenChoiceTopKRouter:
    router = TokenChoiceTopKRouter(
        8, 16, top_k, n_groups, n_limited, score_func, route_norm, scale, 1e-3
    )
    with torch.no_grad():
        router.gate.weight.copy_(torch.randn(16, 8, generator=torch.Generator().manual_seed(0)))
        router.expert_bias.copy_(torch.randn(16, generator=torch.Generator().manual_seed(1)) * 0.3)
    return router


def test_router_picks_distinct_experts_within_the_limited_groups():
    router = make_router()
    x = torch.randn(512, 8, generator=torch.Generator().manual_seed(2))
    weights, indices, scores = router(x)
    assert indices.shape == (512, 3) and weights.shape == (512, 3)
    assert all(len(set(row)) == 3 for row in indices.tolist())  # distinct top-k experts per token
    groups = indices // 4
    assert all(
        len(set(row)) <= 2 for row in groups.tolist()
    )  # at most num_limited_groups groups per token
    assert len(set(groups.flatten().tolist())) == 4
    torch.testing.assert_close(
        weights.sum(-1), torch.full((512,), 2.5)
    )  # normalized, times route_scale
    torch.testing.assert_close(scores, torch.sigmoid(x @ router.gate.weight.T))
    same = dataclasses.replace(
        TINY, num_experts=16, num_expert_groups=4, num_limited_groups=2, top_k=3
    )
    ref_idx, _ = reference_route(scores.double(), router.expert_bias.double(), same)
    assert torch.equal(indices.sort(-1).values, ref_idx.sort(-1).values)


def test_bias_steers_the_choice_but_not_the_weights():
    router = make_router(n_groups=1, n_limited=1, top_k=2)
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        router.expert_bias.zero_()
        router.expert_bias[5] = 10.0  # every token now takes expert 5
    weights, indices, scores = router(x)
    assert (indices == 5).any(-1).all()
    chosen = scores.gather(1, indices)
    torch.testing.assert_close(
        weights, chosen / chosen.sum(-1, keepdim=True) * 2.5
    )  # unbiased scores


def test_softmax_router_without_normalization_uses_the_raw_probabilities():
    router = make_router(
        n_groups=1, n_limited=1, top_k=2, score_func="softmax", route_norm=False, scale=1.0
    )
    with torch.no_grad():
        router.expert_bias.zero_()
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(4))
    weights, indices, scores = router(x)
    probs = torch.softmax(x @ router.gate.weight.T, -1)
    torch.testing.assert_close(scores, probs)
    torch.testing.assert_close(weights, probs.topk(2, -1).values)


# ---------------------------------------------------------------- sequence-wise balance loss


def test_sequence_balance_loss_values():
    # Perfect balance: every expert chosen equally often, uniform scores -> 1.
    scores = torch.full((4, 4), 0.5)
    indices = torch.tensor([[0, 1], [2, 3], [0, 1], [2, 3]])
    assert sequence_balance_loss(scores, indices, seqlen=4).item() == pytest.approx(1.0)
    # Collapse in one sequence of 2 tokens, both on expert 0 (k = 1): f = [4, 0, 0, 0] (E / (k T) =
    # 2),
    # s' rows [0.7, 0.1, 0.1, 0.1] -> P_0 = 0.7, loss 2.8; the second sequence balanced on all ->
    # ~1.
    scores = torch.tensor([[0.7, 0.1, 0.1, 0.1]] * 2 + [[0.25] * 4] * 2)
    indices = torch.tensor([[0], [0], [1], [2]])
    per_sequence = [4 * 0.7, 2 * 0.25 + 2 * 0.25]
    assert sequence_balance_loss(scores, indices, seqlen=2).item() == pytest.approx(
        sum(per_sequence) / 2
    )


def test_sequence_aux_loss_changes_router_gradients_but_not_logits():
    tokens = torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(5))
    plain, aux = build(TINY), build(dataclasses.replace(TINY, aux_loss_coeff=0.1))
    out_plain, out_aux = plain(tokens), aux(tokens)
    assert torch.equal(out_plain, out_aux)
    out_plain.sum().backward()
    out_aux.sum().backward()
    gate = "layers.2.moe.router.gate.weight"
    grads = dict(plain.named_parameters())[gate].grad, dict(aux.named_parameters())[gate].grad
    assert (grads[0] - grads[1]).abs().max() > 1e-4
    losses = [m.aux_loss.item() for m in aux.modules() if isinstance(m, MoE)]
    worst = TINY.num_experts / TINY.top_k  # all tokens on the same k experts
    assert len(losses) == 2 and all(0.1 * 0.9 < v < 0.1 * worst for v in losses)


# ---------------------------------------------------------------- full model


def test_forward_and_backward_match_the_float64_reference():
    model = build(TINY, seed=0)
    with torch.no_grad():
        for key in ("1", "2"):
            model.layers[key].moe.router.expert_bias.copy_(
                torch.tensor([0.3, -0.2, 0.0, 0.1, -0.4, 0.2])
            )
    tokens = torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    logits = model(tokens)
    biases = {k: model.layers[k].moe.router.expert_bias.double() for k in ("1", "2")}
    assert logits.shape == (2, 8, TINY.vocab_size)
    assert_matches_float64_reference(
        model, logits, lambda p: reference_forward(p, tokens, TINY, biases), out_tol=2e-5
    )
    assert sum(v.sum().item() for v in collect_expert_load(model).values()) == 2 * 16 * 3


def test_logits_are_causal():
    tokens = torch.randint(0, TINY.vocab_size, (1, 8), generator=torch.Generator().manual_seed(4))
    diff = logit_change(build(TINY), tokens, 5)
    assert (diff[:5] < 1e-5).all() and (diff[5:] > 1e-4).all()  # < 1e-5: expert batching rounding


def test_too_long_input_is_rejected():
    with pytest.raises(ValueError, match="sequence length 9 exceeds max_seq_len 8"):
        build(TINY)(torch.zeros(1, 9, dtype=torch.long))


def test_dense_then_moe_blocks():
    with torch.device("meta"):
        model = DeepSeekV3Model(deepseek_v3_flavors["debug"])
    assert [hasattr(b, "moe") for b in model.layers.values()] == [False, True, True, True]
    assert model.layers["1"].moe.shared_experts.w1.weight.shape == (256, 256)  # 1 shared expert
    assert model.layers["1"].moe.experts.w1.shape == (8, 256, 256)


def test_flops_add_attention_with_qk_and_v_head_dims():
    a = deepseek_v3_flavors["debug"]
    per_token_of_context = 6 * a.n_layers * a.n_heads * (48 + 32)
    assert num_flops_per_token(a, 256) - num_flops_per_token(a, 128) == per_token_of_context * 128
    assert num_flops_per_token(a, 128) == 6 * num_active_params(a) + per_token_of_context * 128


# ---------------------------------------------------------------- init plan and step 1


def test_init_plan_covers_every_parameter_and_persistent_buffer_exactly():
    for args in (deepseek_v3_flavors["debug"], TINY):
        with torch.device("meta"):
            model = DeepSeekV3Model(args)
        plan = deepseek_v3_init_plan(args)
        assert_plan_covers_exactly(model, plan)
    state = dict(plan.entries)
    assert state["layers.*.moe.router.expert_bias"].kind == "zeros"
    assert state["layers.*.moe.tokens_per_expert"].kind == "zeros"


def test_nan_poisoned_materialization_is_fully_initialized_and_step_one_loss_is_ln_v():
    args = deepseek_v3_flavors["debug"]
    with torch.device("meta"):
        model = DeepSeekV3Model(args)
    poisoned_init(model, deepseek_v3_init_plan(args), seed=7)
    router = model.layers["1"].moe.router
    assert router.expert_bias.dtype == torch.float32 and router.expert_bias.abs().sum() == 0
    assert model.layers["1"].moe.tokens_per_expert.abs().sum() == 0
    assert 0.019 < model.layers["2"].moe.experts.w2.std().item() < 0.021
    torch.testing.assert_close(model.rope_cos[0], torch.ones(args.qk_rope_head_dim))

    loss = random_token_loss(model, args.vocab_size, seed=8)
    ln_v = math.log(args.vocab_size)
    assert ln_v - 0.1 < loss < ln_v + 0.15  # expected ln V + (0.02 * sqrt(256))^2 / 2 = ln V + 0.05


def test_init_is_a_function_of_the_seed_only():
    a, b, c = (
        build_from_plan(TINY, seed=3),
        build_from_plan(TINY, seed=3),
        build_from_plan(TINY, seed=4),
    )
    for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), n
    assert not torch.equal(a.layers["1"].moe.experts.w1, c.layers["1"].moe.experts.w1)


# ---------------------------------------------------------------- config


def test_debug_config_and_overrides_reach_the_model():
    args = config_model_args("deepseek_v3_debug", "--model.overrides.bias_update_speed=0")
    assert args == dataclasses.replace(deepseek_v3_flavors["debug"], bias_update_speed=0.0)
    with torch.device("meta"):
        model = DeepSeekV3Model(args)
    assert model.layers["1"].moe.router.bias_update_speed == 0.0
    for flavor, changes in (
        ("16b", {}),
        ("671b", {"max_seq_len": 4096}),
    ):  # 671b: 4K pretraining, no YaRN
        assert config_model_args(f"deepseek_v3_{flavor}") == dataclasses.replace(
            deepseek_v3_flavors[flavor], **changes
        )
