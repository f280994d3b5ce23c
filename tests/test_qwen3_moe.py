"""Qwen3-MoE family: published size, forward/backward vs a float64 reference, init plan, step-1 loss."""

from __future__ import annotations

import dataclasses
import math
from fnmatch import fnmatch
from pathlib import Path

import torch
import torch.nn.functional as F

import models
from models.common.moe import collect_expert_load
from models.qwen3_moe import Qwen3MoeModel, Qwen3MoeModelArgs, qwen3_moe_flavors, qwen3_moe_init_plan
from models.qwen3_moe.model import num_active_params, num_flops_per_token
from torchtitan_lite.init import init_weights, materialize

REPO = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)

TINY = Qwen3MoeModelArgs(
    dim=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=6, moe_inter_dim=8, num_experts=5, experts_per_token=2,
    vocab_size=32, max_seq_len=8, load_balance_coeff=0.0,
)

# Qwen/Qwen3-30B-A3B config.json (HF key names).
CONFIG = dict(
    hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
    moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, vocab_size=151936,
    rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=False,
    router_aux_loss_coef=0.001,
)


def build(args: Qwen3MoeModelArgs, seed: int = 0, std: float = 0.3) -> Qwen3MoeModel:
    """Meta build, CPU materialization, N(0, std) weights, N(1, std) norm weights, zero state."""
    with torch.device("meta"):
        model = Qwen3MoeModel(args)
    model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std + (1.0 if "norm" in name else 0.0))
        for buf in model.buffers():
            buf.zero_()
    model.init_buffers("cpu")
    return model


def reference_forward(p: dict[str, torch.Tensor], tokens: torch.Tensor, a: Qwen3MoeModelArgs) -> torch.Tensor:
    """HF Qwen3MoE written out: QK-norm before RoPE, GQA by repeating heads, softmax top-k renormalized."""

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + a.norm_eps) * w

    bs, T = tokens.shape
    inv = a.rope_theta ** (-torch.arange(0, a.head_dim, 2, dtype=torch.float64) / a.head_dim)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv
    c, s = ang.cos()[None, :, None], ang.sin()[None, :, None]

    def rope(x):
        x1, x2 = x.chunk(2, -1)
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    h = p["tok_embeddings.weight"][tokens]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for layer in range(a.n_layers):
        pre = f"layers.{layer}."
        x = rms(h, p[pre + "attention_norm.weight"])
        q = (x @ p[pre + "attention.wq.weight"].T).view(bs, T, a.n_heads, a.head_dim)
        k = (x @ p[pre + "attention.wk.weight"].T).view(bs, T, a.n_kv_heads, a.head_dim)
        q, k = rope(rms(q, p[pre + "attention.q_norm.weight"])), rope(rms(k, p[pre + "attention.k_norm.weight"]))
        v = (x @ p[pre + "attention.wv.weight"].T).view(bs, T, a.n_kv_heads, a.head_dim)
        rep = a.n_heads // a.n_kv_heads
        k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(a.head_dim)
        att = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores.masked_fill(~mask, float("-inf")), -1), v)
        h = h + att.reshape(bs, T, -1) @ p[pre + "attention.wo.weight"].T
        x = rms(h, p[pre + "ffn_norm.weight"]).reshape(-1, a.dim)
        probs = torch.softmax(x @ p[pre + "moe.router.gate.weight"].T, -1)
        top, idx = probs.topk(a.experts_per_token, -1)
        w = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(a.experts_per_token):
                e = idx[t, j]
                w1, w2, w3 = (p[f"{pre}moe.experts.{n}"][e] for n in ("w1", "w2", "w3"))
                out[t] = out[t] + w[t, j] * (w2 @ (F.silu(w1 @ x[t]) * (w3 @ x[t])))
        h = h + out.view(bs, T, a.dim)
    return rms(h, p["norm.weight"]) @ p["output.weight"].T


def test_30b_a3b_carries_the_config_json_values_and_its_published_parameter_count():
    a = qwen3_moe_flavors["30b-a3b"]
    c = CONFIG
    assert (a.dim, a.n_layers, a.n_heads, a.n_kv_heads, a.head_dim, a.moe_inter_dim) == (
        c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
        c["moe_intermediate_size"])
    assert (a.num_experts, a.experts_per_token, a.route_norm, a.vocab_size, a.norm_eps, a.rope_theta) == (
        c["num_experts"], c["num_experts_per_tok"], c["norm_topk_prob"], c["vocab_size"], c["rms_norm_eps"],
        c["rope_theta"])
    assert (a.max_seq_len, a.tie_embeddings, a.load_balance_coeff) == (
        c["max_position_embeddings"], c["tie_word_embeddings"], c["router_aux_loss_coef"])
    d, hd, L, E = c["hidden_size"], c["head_dim"], c["num_hidden_layers"], c["num_experts"]
    # q_proj + o_proj, k_proj + v_proj, q_norm + k_norm
    attention = d * hd * c["num_attention_heads"] * 2 + d * hd * c["num_key_value_heads"] * 2 + 2 * hd
    experts = E * 3 * d * c["moe_intermediate_size"]
    total = L * (attention + 2 * d + E * d + experts) + 2 * c["vocab_size"] * d + d
    with torch.device("meta"):
        model = Qwen3MoeModel(a)
    assert sum(p.numel() for p in model.parameters()) == total == 30_532_122_624  # model card: 30.5B
    unchosen = L * (E - c["num_experts_per_tok"]) * 3 * d * c["moe_intermediate_size"]
    assert num_active_params(a) == total - c["vocab_size"] * d - unchosen == 3_041_867_776  # card: 3.3B with embedding


def test_forward_and_backward_match_the_float64_reference():
    model = build(TINY)
    tokens = torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    logits = model(tokens)
    target = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2))
    (logits * target).sum().backward()
    params = {n: p.detach().double().requires_grad_() for n, p in model.named_parameters()}
    ref = reference_forward(params, tokens, TINY)
    (ref * target.double()).sum().backward()
    torch.testing.assert_close(logits.double(), ref.detach(), atol=2e-5, rtol=2e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad.double(), params[name].grad, atol=1e-4, rtol=1e-4, msg=name)
    assert sum(v.sum().item() for v in collect_expert_load(model).values()) == 2 * 16 * 2


def test_flops_are_six_active_params_plus_attention():
    a = qwen3_moe_flavors["debug"]
    assert num_flops_per_token(a, 256) == 6 * num_active_params(a) + 12 * 4 * 4 * 64 * 256


def test_init_plan_coverage_nan_poison_and_step_one_loss_near_ln_v():
    args = qwen3_moe_flavors["debug"]
    with torch.device("meta"):
        model = Qwen3MoeModel(args)
    plan = qwen3_moe_init_plan(args)
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers() if "rope" not in n]
    for name in names:
        assert any(fnmatch(name, pat) for pat, _ in plan.entries), name
    for pattern, spec in plan.entries:
        assert any(fnmatch(name, pattern) for name in names) and spec.source, pattern
    materialize(model, "cpu")
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            t.fill_(float("nan"))
    init_weights(model, plan, seed=7, buffer_device="cpu")
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert torch.isfinite(t).all(), name
    tokens = torch.randint(0, args.vocab_size, (2, 257), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).item()
    assert math.log(args.vocab_size) - 0.1 < loss < math.log(args.vocab_size) + 0.15


def test_debug_config_reaches_the_model(monkeypatch):
    from torchtitan_lite.config import build_model_args, parse_args

    if "qwen3_moe" not in models.model_names():
        monkeypatch.setattr(models, "_FAMILIES", (*models._FAMILIES, "qwen3_moe"))
    config = parse_args(["--job.config_file", str(REPO / "train_configs" / "qwen3_moe_debug.toml"),
                         "--model.overrides.experts_per_token=3"])
    assert build_model_args(config) == dataclasses.replace(qwen3_moe_flavors["debug"], experts_per_token=3)
