"""Expert dispatch without host syncs: the padded buffer's layout, grouped matmuls vs a per-token
loop."""

from __future__ import annotations

import functools

import torch
from sync_helpers import HostReads
from test_moe import reference_experts

from torchtitan_lite.models.common.experts import (
    GroupedExperts,
    GroupedSwiGLUExperts,
    clamped_swiglu,
)
from torchtitan_lite.models.common.token_dispatch import ALIGN, dispatch, grouped_mm_fits


def _routing(num_tokens=13, num_experts=4, top_k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    indices = torch.stack(
        [torch.randperm(num_experts - 1, generator=g)[:top_k] for _ in range(num_tokens)]
    )
    return indices, torch.rand(num_tokens, top_k, generator=g)  # expert num_experts-1 gets no token


def test_each_pair_gets_its_own_row_inside_its_experts_aligned_group():
    indices, _ = _routing()
    plan = dispatch(indices, 4)
    assert plan.num_rows == 13 * 2 + 4 * ALIGN and plan.offsets.dtype == torch.int32
    assert int(plan.offsets[-1]) == plan.num_rows
    starts = torch.cat([torch.zeros(1, dtype=torch.int32), plan.offsets[:-1]])
    assert (starts % ALIGN == 0).all()
    assert len(set(plan.rows.tolist())) == 26  # distinct rows
    expert_of_pair = indices.reshape(-1)[plan.order]
    assert torch.equal(plan.group_expert[plan.rows], expert_of_pair)
    assert torch.equal(plan.token_idx, plan.order // 2)
    counts = torch.bincount(indices.reshape(-1), minlength=4)
    assert torch.equal(
        torch.diff(starts.long(), append=torch.tensor([plan.num_rows])),
        torch.tensor([16, 16, 16, plan.num_rows - 48]),
    )  # 26 pairs on experts 0-2: < 16 each
    assert counts[3] == 0


def _experts_and_grads(experts, x, indices, weights):
    x, weights = x.clone().requires_grad_(), weights.clone().requires_grad_()
    with HostReads() as reads:
        out = experts(x, indices, weights)
        out.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in experts.named_parameters()}
    experts.zero_grad()
    return out, x.grad, weights.grad, grads, reads.count


def test_grouped_mm_experts_match_a_per_token_loop_without_a_host_sync():
    torch.manual_seed(1)
    experts = GroupedExperts(
        4, 8, 8, functools.partial(clamped_swiglu, limit=7.0)
    )  # widths fit grouped_mm
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.3)
    assert all(grouped_mm_fits(p) for p in (experts.mlp1_weight, experts.mlp2_weight))
    indices, weights = _routing()
    x = torch.randn(13, 8)
    out, gx, gw, grads, reads = _experts_and_grads(experts, x, indices, weights)
    assert reads == 0
    x2, w2 = x.clone().requires_grad_(), weights.clone().requires_grad_()
    ref = reference_experts(experts, x2, indices, w2)
    ref.square().sum().backward()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gx, x2.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gw, w2.grad, atol=1e-5, rtol=1e-5)
    for n, p in experts.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, atol=1e-5, rtol=1e-5, msg=n)
    assert (
        grads["mlp1_weight"][3].abs().max() == 0 and grads["mlp2_bias"][3].abs().max() == 0
    )  # idle expert


def test_swiglu_experts_take_one_path_and_unaligned_widths_fall_back_with_one_read_per_matmul():
    indices, weights = _routing()
    results = {}
    for hidden in (8, 6):  # 8: fits grouped_mm; 6: 24-byte rows, the loop fallback
        torch.manual_seed(2)
        experts = GroupedSwiGLUExperts(4, 8, hidden)
        with torch.no_grad():
            for p in experts.parameters():
                p.normal_(0, 0.3)
        x = torch.randn(13, 8)
        out, *_, reads = _experts_and_grads(experts, x, indices, weights)
        ref = torch.zeros(13, 8)
        for t in range(13):
            for j in range(2):
                e = int(indices[t, j])
                h = torch.nn.functional.silu(experts.w1[e] @ x[t]) * (experts.w3[e] @ x[t])
                ref[t] += weights[t, j] * (experts.w2[e] @ h)
        torch.testing.assert_close(out, ref.detach(), atol=1e-5, rtol=1e-5)
        results[hidden] = reads
    assert results[8] == 0
    assert (
        results[6] >= 3
    )  # w1, w3 (in 8, out 6) and w2 (in 6) cannot use grouped_mm: the counter sees it
