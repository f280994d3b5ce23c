"""MoE pieces (models/common/): clamped SwiGLU, router, grouped experts, aux loss, load counters."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import checkpoint

from torchtitan_lite.distributed.activation_checkpoint import checkpoint_contexts
from torchtitan_lite.models.common.balance_loss import load_balance_loss, switch_aux_loss
from torchtitan_lite.models.common.experts import GroupedExperts, clamped_swiglu
from torchtitan_lite.models.common.moe import MoE, collect_expert_load
from torchtitan_lite.models.common.routers import TopKRouter

DIM, HIDDEN, EXPERTS, TOP_K = 8, 6, 4, 2


def make_moe(coeff: float = 0.0, seed: int = 0, limit: float = 7.0) -> MoE:
    """A small MoE with N(0, 0.5) weights and N(0, 0.1) biases."""
    moe = MoE(
        TopKRouter(DIM, EXPERTS, TOP_K),
        GroupedExperts(EXPERTS, DIM, HIDDEN, functools.partial(clamped_swiglu, limit=limit)),
        aux_loss=switch_aux_loss,
        aux_loss_coeff=coeff,
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in moe.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.1 if "bias" in name else 0.5))
    moe.tokens_per_expert.zero_()
    return moe


def reference_experts(experts: GroupedExperts, x, indices, weights):
    """Per-token, per-choice loop (the reference's einsum semantics), for tests only."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(indices.shape[1]):
            e = indices[t, j]
            h = experts.mlp1_weight[e] @ x[t] + experts.mlp1_bias[e]
            h = clamped_swiglu(h)
            out[t] = out[t] + weights[t, j] * (experts.mlp2_weight[e] @ h + experts.mlp2_bias[e])
    return out


def test_clamped_swiglu_values_at_large_positive_and_negative_inputs():
    alpha = 1.702
    # interleaved: (gate, up) pairs
    x = torch.tensor([[10.0, 10.0, -10.0, -10.0, 1.0, 0.5, 10.0, -3.0]])
    out = clamped_swiglu(x)
    expected = [
        7.0 * (1 / (1 + math.exp(-alpha * 7.0))) * (7.0 + 1),  # gate clamped to 7, up clamped to 7
        -10.0 * (1 / (1 + math.exp(alpha * 10.0))) * (-7.0 + 1),  # gate not clamped below; up to -7
        1.0 * (1 / (1 + math.exp(-alpha))) * 1.5,
        7.0 * (1 / (1 + math.exp(-alpha * 7.0))) * (-3.0 + 1),
    ]
    torch.testing.assert_close(out, torch.tensor([expected]))


def test_clamped_swiglu_gradients_vanish_where_clamped():
    alpha = 1.702
    x = torch.tensor([10.0, 10.0, -10.0, 3.0, 2.0, -8.0, 0.5, 0.25], requires_grad=True)
    clamped_swiglu(x).sum().backward()
    g = x.grad
    assert g[0] == 0 and g[1] == 0  # gate 10 > 7, up 10 > 7
    sig = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    # gate -10 is not clamped: d/dg [g sig(a g)] (up + 1), up = 3
    dgate = sig(-alpha * 10) + alpha * -10 * sig(-alpha * 10) * (1 - sig(-alpha * 10))
    torch.testing.assert_close(g[2], torch.tensor(dgate * 4.0))
    torch.testing.assert_close(g[3], torch.tensor(-10 * sig(-alpha * 10)))
    assert g[5] == 0  # up -8 < -7
    torch.testing.assert_close(g[7], torch.tensor(0.5 * sig(alpha * 0.5)))


def test_clamped_swiglu_reads_gate_from_even_and_up_from_odd_positions():
    x = torch.tensor([2.0, 0.0, 0.0, 2.0])  # pair 0: gate 2, up 0; pair 1: gate 0, up 2
    out = clamped_swiglu(x)
    torch.testing.assert_close(out, torch.tensor([2.0 / (1 + math.exp(-1.702 * 2)), 0.0]))


def test_router_weights_are_softmax_over_top_k_logits_and_bias_steers_choice():
    moe = make_moe()
    router = moe.router
    x = torch.randn(5, DIM, generator=torch.Generator().manual_seed(3))
    weights, indices, probs = router(x)
    logits = router.gate(x)
    top, top_idx = logits.topk(TOP_K, dim=-1)
    assert torch.equal(indices, top_idx)
    torch.testing.assert_close(weights, torch.softmax(top, dim=-1))
    torch.testing.assert_close(weights.sum(-1), torch.ones(5))
    torch.testing.assert_close(probs, torch.softmax(logits, dim=-1))
    with torch.no_grad():
        router.gate.bias[3] = 100.0
    assert (router(x).indices[:, 0] == 3).all()


def test_grouped_experts_match_per_token_loop_in_outputs_and_gradients():
    moe = make_moe(seed=1)
    experts = moe.experts
    g = torch.Generator().manual_seed(2)
    x = torch.randn(9, DIM, generator=g)
    indices = torch.randint(0, EXPERTS - 1, (9, TOP_K), generator=g)  # expert 3 gets no token
    indices[:, 1] = (indices[:, 0] + 1) % (EXPERTS - 1)
    weights = torch.rand(9, TOP_K, generator=g)

    x1, w1 = x.clone().requires_grad_(), weights.clone().requires_grad_()
    out = experts(x1, indices, w1)
    out.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in experts.named_parameters()}
    experts.zero_grad()

    x2, w2 = x.clone().requires_grad_(), weights.clone().requires_grad_()
    ref = reference_experts(experts, x2, indices, w2)
    ref.square().sum().backward()

    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w1.grad, w2.grad, atol=1e-5, rtol=1e-5)
    for n, p in experts.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, atol=1e-5, rtol=1e-5, msg=n)
    assert grads["mlp1_weight"][3].abs().max() == 0  # the idle expert gets a zero gradient


def test_load_balance_loss_is_top_k_when_balanced_and_matches_hf_formula():
    T = 8
    probs = torch.full((T, EXPERTS), 1 / EXPERTS)
    counts = torch.full((EXPERTS,), T * TOP_K / EXPERTS)
    torch.testing.assert_close(load_balance_loss(probs, counts), torch.tensor(float(TOP_K)))

    logits = torch.randn(T, EXPERTS, generator=torch.Generator().manual_seed(4))
    probs = torch.softmax(logits, -1)
    chosen = probs.topk(TOP_K, -1).indices
    # HF load_balancing_loss_func: one-hot (T, k, E) averaged over tokens, times mean probs, summed,
    # * E
    one_hot = F.one_hot(chosen, EXPERTS).float()
    hf = (one_hot.mean(0) * probs.mean(0)[None]).sum() * EXPERTS
    counts = torch.bincount(chosen.flatten(), minlength=EXPERTS)
    torch.testing.assert_close(load_balance_loss(probs, counts), hf)


def test_aux_loss_leaves_output_unchanged_and_adds_its_gradient():
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(5))
    with_aux, without = make_moe(coeff=0.3), make_moe(coeff=0.0)
    out_a = with_aux(x)
    out_b = without(x)
    assert torch.equal(out_a, out_b)

    out_a.sum().backward()
    # Same gradients as adding coeff * loss by hand to the objective.
    weights, indices, probs = without.router(x.reshape(-1, DIM))
    counts = torch.bincount(indices.flatten(), minlength=EXPERTS)
    manual = 0.3 * load_balance_loss(probs, counts)
    (out_b.sum() + manual).backward()
    torch.testing.assert_close(with_aux.aux_loss, manual.detach())
    for (n, pa), pb in zip(with_aux.named_parameters(), without.parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad, msg=n)
    assert with_aux.router.gate.weight.grad is not None
    assert without.aux_loss is None


def test_aux_loss_scale_scales_only_the_aux_gradient():
    x = torch.randn(1, 6, DIM, generator=torch.Generator().manual_seed(6))
    grads = []
    for coeff, scale in [(0.0, 1.0), (0.2, 1.0), (0.2, 0.5)]:
        moe = make_moe(coeff=coeff)
        moe.aux_loss_scale = scale
        moe(x).sum().backward()
        grads.append(moe.router.gate.bias.grad)
    base, full, half = grads
    torch.testing.assert_close(half - base, (full - base) / 2)
    assert (full - base).abs().max() > 1e-4


def test_negative_coefficient_is_rejected():
    with pytest.raises(ValueError, match="aux_loss_coeff must be >= 0"):
        make_moe(coeff=-0.1)


def test_tokens_per_expert_counts_each_assignment_once_even_with_checkpoint_recompute():
    x = torch.randn(3, 4, DIM, generator=torch.Generator().manual_seed(7), requires_grad=True)
    plain, ckpt = make_moe(coeff=0.1), make_moe(coeff=0.1)
    plain(x).sum().backward()
    checkpoint(
        ckpt, x, use_reentrant=False, context_fn=checkpoint_contexts
    ).sum().backward()  # the engine's AC

    expected = torch.bincount(
        plain.router(x.reshape(-1, DIM)).indices.flatten(), minlength=EXPERTS
    ).float()
    assert expected.sum() == 12 * TOP_K
    assert torch.equal(plain.tokens_per_expert, expected)
    assert torch.equal(ckpt.tokens_per_expert, expected)
    for p, q in zip(plain.parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)

    plain.eval()
    plain(x)
    assert torch.equal(plain.tokens_per_expert, expected)  # eval forwards are not counted


def test_collect_expert_load_returns_per_layer_counts_and_resets():
    layers = torch.nn.ModuleDict({"0": make_moe(seed=0), "1": checkpoint_wrapper(make_moe(seed=1))})
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(8))
    layers["0"](x)
    layers["0"](x)
    layers["1"](x)
    loads = collect_expert_load(layers)
    assert list(loads) == ["0", "1"]
    assert loads["0"].sum() == 2 * 10 * TOP_K and loads["1"].sum() == 10 * TOP_K
    expected0 = 2 * torch.bincount(
        layers["0"].router(x.reshape(-1, DIM)).indices.flatten(), minlength=EXPERTS
    )
    assert torch.equal(loads["0"], expected0.float())
    assert all(m.tokens_per_expert.sum() == 0 for m in layers.modules() if isinstance(m, MoE))
    assert collect_expert_load(torch.nn.Linear(2, 2)) == {}
