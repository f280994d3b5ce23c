"""GPT-OSS: published sizes, YaRN, sliding layers, forward/backward vs an explicit reference, init,
FSDP2.

Run as a script under torchrun (``__main__`` below), this file is also the 2-rank FSDP2 worker of
``test_fsdp_two_ranks_with_uneven_experts_matches_single_process``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
import torch.nn.functional as F
from dist_helpers import launch, leave_together, write_result
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
    rotate_half,
    softmax_attention,
)

from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.models.common.moe import MoE, collect_expert_load
from torchtitan_lite.models.common.yarn import yarn_attention_scaling, yarn_cos_sin, yarn_inv_freq
from torchtitan_lite.models.gpt_oss import (
    GptOssModel,
    GptOssModelArgs,
    gpt_oss_flavors,
    gpt_oss_init_plan,
)
from torchtitan_lite.models.gpt_oss.flops import num_active_params, num_flops_per_token

TINY = GptOssModelArgs(
    dim=16,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    moe_inter_dim=12,
    num_experts=4,
    top_k=2,
    vocab_size=32,
    sliding_window=3,
    max_seq_len=8,
    aux_loss_coeff=0.0,
)


build = functools.partial(
    build_random, GptOssModel
)  # (args, seed=0, std=0.3): random weights and biases
build_from_plan = functools.partial(build_planned, GptOssModel, gpt_oss_init_plan)  # (args, seed=0)


# ---------------------------------------------------------------- reference computation (float64)


def reference_yarn_inv_freq(head_dim, theta, factor, orig, beta_fast, beta_slow):
    """The reference's NTK-by-parts, element by element in Python floats."""
    half = head_dim / 2
    low = half * math.log(orig / (beta_fast * 2 * math.pi)) / math.log(theta)
    high = half * math.log(orig / (beta_slow * 2 * math.pi)) / math.log(theta)
    out = []
    for i in range(head_dim // 2):
        freq = theta ** (-2 * i / head_dim)
        keep = 1 - min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(freq / factor * (1 - keep) + freq * keep)
    return out


def reference_forward(
    p: dict[str, torch.Tensor], tokens: torch.Tensor, a: GptOssModelArgs
) -> torch.Tensor:
    """GPT-OSS written out: explicit softmax over [scores, sink], rotate-half RoPE, per-token
    experts."""
    conc = 0.1 * math.log(a.rope_factor) + 1
    inv = torch.tensor(
        reference_yarn_inv_freq(
            a.head_dim,
            a.rope_theta,
            a.rope_factor,
            a.rope_original_max_seq_len,
            a.rope_beta_fast,
            a.rope_beta_slow,
        ),
        dtype=torch.float64,
    )
    T = tokens.shape[1]
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv  # (T, half)
    c, s = (ang.cos() * conc)[None, :, None], (ang.sin() * conc)[None, :, None]

    def lin(x, name, bias=True):
        y = x @ p[f"{name}.weight"].T
        return y + p[f"{name}.bias"] if bias else y

    h = p["tok_embeddings.weight"][tokens]
    bs = tokens.shape[0]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    for layer in range(a.n_layers):
        pre = f"layers.{layer}."
        x = rms_norm(h, p[pre + "attention_norm.weight"], a.norm_eps)
        q = rotate_half(lin(x, pre + "attention.wq").view(bs, T, a.n_heads, a.head_dim), c, s)
        k = rotate_half(lin(x, pre + "attention.wk").view(bs, T, a.n_kv_heads, a.head_dim), c, s)
        v = lin(x, pre + "attention.wv").view(bs, T, a.n_kv_heads, a.head_dim)
        allowed = j <= i if layer % 2 else (j <= i) & (i - j < a.sliding_window)
        att = softmax_attention(q, k, v, allowed, sinks=p[pre + "attention.sinks"])
        h = h + lin(att, pre + "attention.wo")

        x = rms_norm(h, p[pre + "ffn_norm.weight"], a.norm_eps).reshape(-1, a.dim)
        logits = lin(x, pre + "moe.router.gate")
        top, idx = logits.topk(a.top_k, -1)
        w = torch.softmax(top, -1)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for kk in range(a.top_k):
                e = idx[t, kk]
                u = (
                    p[pre + "moe.experts.mlp1_weight"][e] @ x[t]
                    + p[pre + "moe.experts.mlp1_bias"][e]
                )
                gate, up = (
                    u[::2].clamp(max=a.swiglu_limit),
                    u[1::2].clamp(-a.swiglu_limit, a.swiglu_limit),
                )
                act = gate * torch.sigmoid(a.swiglu_alpha * gate) * (up + 1)
                y = (
                    p[pre + "moe.experts.mlp2_weight"][e] @ act
                    + p[pre + "moe.experts.mlp2_bias"][e]
                )
                out[t] = out[t] + w[t, kk] * y
        h = h + out.view(bs, T, a.dim)
    return lin(rms_norm(h, p["norm.weight"], a.norm_eps), "output", bias=False)


# ---------------------------------------------------------------- published sizes


def test_published_flavors_have_the_model_card_parameter_totals():
    totals, active = {}, {}
    for flavor in ("20b", "120b"):
        a = gpt_oss_flavors[flavor]
        with torch.device("meta"):
            model = GptOssModel(a)
        totals[flavor] = sum(p.numel() for p in model.parameters())
        experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
        unchosen = experts * (a.num_experts - a.top_k) // a.num_experts
        active[flavor] = totals[flavor] - model.tok_embeddings.weight.numel() - unchosen
        assert num_active_params(a) == active[flavor]
    assert totals == {"20b": 20_914_757_184, "120b": 116_829_156_672}  # model card: 20.91B, 116.83B
    assert active == {
        "20b": 3_608_307_264,
        "120b": 5_132_849_472,
    }  # model card: 3.61B, 5.13B active


def test_published_flavors_carry_the_config_json_values():
    a = gpt_oss_flavors["20b"]
    assert (a.dim, a.n_layers, a.n_heads, a.n_kv_heads, a.head_dim, a.moe_inter_dim) == (
        2880,
        24,
        64,
        8,
        64,
        2880,
    )
    assert (a.num_experts, a.top_k, a.vocab_size, a.sliding_window) == (32, 4, 201088, 128)
    assert (a.rope_theta, a.rope_factor, a.rope_original_max_seq_len) == (150000.0, 32.0, 4096)
    assert (a.rope_beta_fast, a.rope_beta_slow, a.swiglu_limit, a.norm_eps) == (
        32.0,
        1.0,
        7.0,
        1e-5,
    )
    assert not a.tie_embeddings and a.max_seq_len == 131072
    b = gpt_oss_flavors["120b"]
    assert (b.n_layers, b.num_experts) == (36, 128)
    assert dataclasses.replace(b, n_layers=24, num_experts=32) == a


def test_debug_flavor_is_longer_than_its_window():
    a = gpt_oss_flavors["debug"]
    assert a.max_seq_len == 256 > a.sliding_window == 128 and a.vocab_size == 2048


def test_bad_args_raise_naming_the_field():
    with pytest.raises(ValueError, match="top_k \\(5\\) must be <= num_experts \\(4\\)"):
        dataclasses.replace(TINY, top_k=5)
    with pytest.raises(ValueError, match="swiglu_limit must be > 0"):
        dataclasses.replace(TINY, swiglu_limit=0.0)
    with pytest.raises(ValueError, match="num_experts must be a positive integer"):
        dataclasses.replace(TINY, num_experts=0)


# ---------------------------------------------------------------- YaRN


def test_yarn_frequencies_match_the_reference_formula():
    got = yarn_inv_freq(64, 150000.0, 32.0, 4096, 32.0, 1.0)
    want = torch.tensor(
        reference_yarn_inv_freq(64, 150000.0, 32.0, 4096, 32.0, 1.0), dtype=torch.float64
    )
    assert got.dtype == torch.float32 and got.shape == (32,)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    base = 150000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    turns = 4096 * base / (2 * math.pi)  # rotations over the original context
    fast, slow = turns > 32, turns < 1
    assert fast.sum() == 9 and slow.sum() == 14  # both ends non-empty with the published values
    torch.testing.assert_close(got.double()[fast], base[fast], rtol=1e-6, atol=0)  # kept
    torch.testing.assert_close(
        got.double()[slow], base[slow] / 32, rtol=1e-6, atol=0
    )  # interpolated


def test_yarn_attention_scaling_multiplies_cos_and_sin():
    assert yarn_attention_scaling(32.0) == pytest.approx(1.3465735902799727)
    assert yarn_attention_scaling(1.0) == 1.0
    cos, sin = yarn_cos_sin(64, 10, 150000.0, 32.0, 4096, 32.0, 1.0)
    torch.testing.assert_close(cos[0], torch.full((64,), 1.3465735902799727))
    torch.testing.assert_close(
        cos.square() + sin.square(), torch.full((10, 64), 1.3465735902799727**2)
    )
    inv = yarn_inv_freq(64, 150000.0, 32.0, 4096, 32.0, 1.0)
    torch.testing.assert_close(sin[7, :32], torch.sin(7 * inv) * 1.3465735902799727)


# ---------------------------------------------------------------- model structure and forward


def test_even_layers_slide_and_odd_layers_attend_fully():
    with torch.device("meta"):
        model = GptOssModel(gpt_oss_flavors["debug"])
    windows = [layer.attention.inner_attention.sliding_window for layer in model.layers.values()]
    assert windows == [128, None, 128, None]


def test_forward_and_backward_match_the_explicit_reference():
    model = build(TINY, seed=0)
    tokens = torch.randint(
        0, TINY.vocab_size, (2, TINY.max_seq_len), generator=torch.Generator().manual_seed(1)
    )
    logits = model(tokens)
    assert logits.shape == (2, TINY.max_seq_len, TINY.vocab_size)
    assert_matches_float64_reference(
        model, logits, lambda p: reference_forward(p, tokens, TINY), out_tol=2e-5
    )


def test_sliding_layer_sees_only_the_window_and_full_layer_sees_everything():
    tokens = torch.randint(0, TINY.vocab_size, (1, 8), generator=torch.Generator().manual_seed(3))
    diff = logit_change(
        build(dataclasses.replace(TINY, n_layers=1)), tokens, 0
    )  # layer 0: sliding, window 3
    assert (diff[:3] > 1e-4).all() and (diff[3:] < 1e-5).all()  # < 1e-5: expert batching rounding
    diff = logit_change(build(TINY), tokens, 0)  # layer 1: full causal
    assert (diff > 1e-4).all()


def test_logits_are_causal():
    tokens = torch.randint(0, TINY.vocab_size, (1, 8), generator=torch.Generator().manual_seed(4))
    diff = logit_change(build(TINY), tokens, 5)
    assert (diff[:5] < 1e-5).all() and (diff[5:] > 1e-4).all()  # < 1e-5: expert batching rounding


def test_too_long_input_is_rejected():
    model = build(TINY)
    with pytest.raises(ValueError, match="sequence length 9 exceeds max_seq_len 8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_aux_loss_changes_gradients_but_not_logits():
    tokens = torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(5))
    plain, aux = build(TINY), build(dataclasses.replace(TINY, aux_loss_coeff=0.1))
    out_plain, out_aux = plain(tokens), aux(tokens)
    assert torch.equal(out_plain, out_aux)
    out_plain.sum().backward()
    out_aux.sum().backward()
    gate = "layers.1.moe.router.gate.weight"
    assert (
        dict(plain.named_parameters())[gate].grad - dict(aux.named_parameters())[gate].grad
    ).abs().max() > 1e-4
    losses = [m.aux_loss.item() for m in aux.modules() if isinstance(m, MoE)]
    assert len(losses) == 2 and all(0.1 * 2 * 0.99 < v < 0.1 * 4 for v in losses)  # coeff * [~k, E]
    assert sum(v.sum().item() for v in collect_expert_load(aux).values()) == 2 * 16 * 2


def test_flops_count_the_window_on_sliding_layers():
    a = gpt_oss_flavors["debug"]
    per_context_token = 12 * a.n_heads * a.head_dim
    # 128 -> 256 tokens: only the 2 full layers see more context (sliding ones stay at 128).
    assert num_flops_per_token(a, 256) - num_flops_per_token(a, 128) == per_context_token * 2 * 128
    assert num_flops_per_token(a, 128) == 6 * num_active_params(a) + per_context_token * 4 * 128


# ---------------------------------------------------------------- config reaches the computation


def test_swiglu_limit_from_config_overrides_reaches_the_experts():
    args = config_model_args("gpt_oss_debug", "--model.overrides.swiglu_limit=0.5")
    assert args == dataclasses.replace(gpt_oss_flavors["debug"], swiglu_limit=0.5)

    tiny_low = dataclasses.replace(TINY, swiglu_limit=args.swiglu_limit)
    model = build(tiny_low)
    act = model.layers["0"].moe.experts.activation(torch.tensor([100.0, 100.0]))
    torch.testing.assert_close(act, torch.tensor([0.5 / (1 + math.exp(-1.702 * 0.5)) * 1.5]))
    tokens = torch.randint(0, TINY.vocab_size, (1, 8), generator=torch.Generator().manual_seed(6))
    params = {n: p.detach().double() for n, p in model.named_parameters()}
    torch.testing.assert_close(
        model(tokens).double(), reference_forward(params, tokens, tiny_low), atol=2e-5, rtol=2e-5
    )
    assert (
        model(tokens) - build(TINY)(tokens)
    ).abs().max() > 1e-3  # same weights, limit 7: different


# ---------------------------------------------------------------- init plan


def test_init_plan_covers_every_parameter_and_persistent_buffer_exactly():
    with torch.device("meta"):
        model = GptOssModel(gpt_oss_flavors["debug"])
    plan = gpt_oss_init_plan(gpt_oss_flavors["debug"])
    names = assert_plan_covers_exactly(model, plan)
    assert len(names) == len(set(names)) == 4 * 18 + 3  # per block 17 params + tokens_per_expert
    router_bias = dict(plan.entries)["layers.*.moe.router.gate.bias"]
    assert router_bias.kind == "normal" and router_bias.std == 0.02


def test_nan_poisoned_materialization_is_fully_initialized_and_step_one_loss_is_ln_v():
    args = gpt_oss_flavors["debug"]
    with torch.device("meta"):
        model = GptOssModel(args)
    poisoned_init(model, gpt_oss_init_plan(args), seed=7)
    assert model.layers["0"].moe.tokens_per_expert.abs().sum() == 0
    torch.testing.assert_close(model.rope_cos[0], torch.full((args.head_dim,), 1.3465735902799727))
    bias = torch.cat([layer.moe.router.gate.bias for layer in model.layers.values()])
    assert 0.01 < bias.std().item() < 0.03

    loss = random_token_loss(model, args.vocab_size, seed=8, seqlen=args.max_seq_len)
    ln_v = math.log(args.vocab_size)
    assert ln_v - 0.1 < loss < ln_v + 0.15  # expected ln V + (0.02 * sqrt(256))^2 / 2 = ln V + 0.05


def test_init_is_a_function_of_the_seed_only():
    a, b = build_from_plan(TINY, seed=3), build_from_plan(TINY, seed=3)
    c = build_from_plan(TINY, seed=4)
    for (n, p), q, _ in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(p, q), n
    assert not torch.equal(
        a.layers["0"].moe.experts.mlp1_weight, c.layers["0"].moe.experts.mlp1_weight
    )


# ---------------------------------------------------------------- FSDP2 on 2 ranks


@pytest.mark.multiprocess
def test_fsdp_two_ranks_with_uneven_experts_matches_single_process():
    results = launch(__file__, nproc=2, timeout=120).result()  # rank 0's list, one entry per mode
    assert [r["ac_mode"] for r in results] == ["none", "full"]
    for r in results:
        assert r["expert_rows"] == [2, 1]  # 3 experts on 2 ranks: Shard(0) gives 2 + 1
        assert r["init_diff"] == 0.0  # same init for 1 and 2 processes
        assert r["logit_diff"] < 1e-5
        assert r["grad_diff"] < 1e-5 and r["grad_scale"] > 1e-3
        assert (
            r["loads_equal"] and r["load_total"] == 2 * 4 * 8 * 2
        )  # 2 layers, 4 sequences x 8, top-2


def _fsdp_worker() -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from torchtitan_lite.distributed.activation_checkpoint import apply_activation_checkpointing
    from torchtitan_lite.distributed.fsdp import apply_fsdp

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    args = dataclasses.replace(TINY, num_experts=3, aux_loss_coeff=0.05)
    tokens = torch.randint(
        0, args.vocab_size, (2 * world, 9), generator=torch.Generator().manual_seed(9)
    )
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    count = targets.numel()

    # Single-process reference, fed rank by rank so each aux loss sees the same tokens as its rank.
    ref = build_from_plan(args, seed=11)
    for m in ref.modules():
        if isinstance(m, MoE):
            m.aux_loss_scale = 1 / world
    ref_logits = []
    for r in range(world):
        logits = ref(inputs[2 * r : 2 * r + 2])
        F.cross_entropy(
            logits.flatten(0, 1), targets[2 * r : 2 * r + 2].flatten(), reduction="sum"
        ).div(count).backward()
        ref_logits.append(logits.detach())
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    # read directly: collect_expert_load would all-reduce the (identical) reference over the ranks
    ref_loads = {
        n[: -len(".tokens_per_expert")]: b.clone()
        for n, b in ref.named_buffers()
        if "tokens_per_expert" in n
    }

    results = []
    for ac_mode in ("none", "full"):
        with torch.device("meta"):
            model = GptOssModel(args)
        apply_activation_checkpointing(model, ac_mode)
        apply_fsdp(
            model,
            mesh,
            param_dtype=torch.float32,
            reduce_dtype=torch.float32,
            reshard_after_forward=True,
        )
        materialize(model, "cpu")
        init_weights(model, gpt_oss_init_plan(args), 11, buffer_device="cpu")
        for m in model.modules():
            if isinstance(m, MoE):
                m.aux_loss_scale = 1 / world
        params = {
            n.replace("_checkpoint_wrapped_module.", ""): p for n, p in model.named_parameters()
        }
        assert sorted(params) == sorted(ref_grads), "sharded and reference parameter names differ"
        init_diff = max(
            (params[n].full_tensor() - p.detach()).abs().max().item()
            for n, p in ref.named_parameters()
        )
        local = slice(2 * rank, 2 * rank + 2)
        logits = model(inputs[local])
        F.cross_entropy(logits.flatten(0, 1), targets[local].flatten(), reduction="sum").div(
            count
        ).backward()
        grads = {n: p.grad.full_tensor() for n, p in params.items()}
        loads = collect_expert_load(model)
        rows = torch.zeros(world, dtype=torch.long)
        rows[rank] = params["layers.0.moe.experts.mlp1_weight"].to_local().shape[0]
        dist.all_reduce(rows, op=dist.ReduceOp.SUM)
        results.append(
            {
                "ac_mode": ac_mode,
                "expert_rows": rows.tolist(),
                "init_diff": init_diff,
                "logit_diff": (logits.detach() - ref_logits[rank]).abs().max().item(),
                "grad_diff": max((grads[n] - g).abs().max().item() for n, g in ref_grads.items()),
                "grad_scale": max(g.abs().max().item() for g in ref_grads.values()),
                "loads_equal": sorted(loads) == sorted(ref_loads)
                and all(torch.equal(loads[n], ref_loads[n]) for n in loads),
                "load_total": sum(v.sum().item() for v in loads.values()),
            }
        )
    if rank == 0:
        write_result(results)
    leave_together()


if __name__ == "__main__":
    _fsdp_worker()
