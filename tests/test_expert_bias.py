"""Auxiliary-loss-free balancing (models/common/expert_bias.py): the update rule, once per step,
counts.

Run as a script under torchrun (``__main__`` below), this file is also the 2-rank worker of
``test_counts_are_summed_over_two_ranks_and_both_ranks_apply_the_same_update``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from dist_helpers import launch, leave_together, write_result

from torchtitan_lite.distributed.activation_checkpoint import apply_activation_checkpointing
from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.models.common.expert_bias import expert_bias_delta, update_expert_bias
from torchtitan_lite.models.common.experts import GroupedExperts, clamped_swiglu
from torchtitan_lite.models.common.moe import MoE, collect_expert_load
from torchtitan_lite.models.common.routers import TopKRouter
from torchtitan_lite.models.deepseek_v3 import (
    DeepSeekV3Model,
    DeepSeekV3ModelArgs,
    deepseek_v3_init_plan,
)

TINY = DeepSeekV3ModelArgs(
    dim=16,
    n_layers=3,
    n_dense_layers=1,
    n_heads=2,
    vocab_size=32,
    hidden_dim=24,
    moe_inter_dim=8,
    num_experts=4,
    num_shared_experts=1,
    top_k=2,
    num_expert_groups=2,
    num_limited_groups=1,
    q_lora_rank=0,
    kv_lora_rank=8,
    qk_nope_head_dim=4,
    qk_rope_head_dim=4,
    v_head_dim=4,
    max_seq_len=8,
    rope_original_max_seq_len=8,
    bias_update_speed=2**-10,
    aux_loss_coeff=0.0,
)
STEP = 2**-10


def build(args: DeepSeekV3ModelArgs = TINY, seed: int = 0) -> DeepSeekV3Model:
    with torch.device("meta"):
        model = DeepSeekV3Model(args)
    materialize(model, "cpu")
    init_weights(model, deepseek_v3_init_plan(args), seed, buffer_device="cpu")
    return model


def biases(model) -> dict[str, torch.Tensor]:
    return {n: b.clone() for n, b in model.named_buffers() if n.endswith("expert_bias")}


def test_update_rule_on_exact_counts():
    delta = expert_bias_delta(torch.tensor([9.0, 1.0, 1.0, 1.0]), STEP)
    # sign(3 - c) = [-1, 1, 1, 1]; times 2^-10, minus the mean 2^-11: all exact in fp32.
    assert delta.dtype == torch.float32
    assert delta.tolist() == [-1.5 * STEP, 0.5 * STEP, 0.5 * STEP, 0.5 * STEP]
    assert delta.sum().item() == 0.0
    assert (
        expert_bias_delta(torch.tensor([2, 2, 2, 2]), STEP).tolist() == [0.0] * 4
    )  # balanced: no change
    assert expert_bias_delta(torch.zeros(4), STEP).tolist() == [0.0] * 4  # no tokens: no change
    uneven = expert_bias_delta(torch.tensor([7.0, 0.0, 3.0, 1.0, 1.0, 0.0, 5.0]), 1e-3)
    assert abs(uneven.sum().item()) < 1e-9 and uneven[0] < 0 < uneven[1]


def test_update_moves_each_layer_by_its_own_counts_and_speed_zero_is_off():
    model = build()
    counts = {
        "layers.1.moe": torch.tensor([9.0, 1.0, 1.0, 1.0]),
        "layers.2.moe": torch.tensor([1.0, 1.0, 1.0, 9.0]),
    }
    assert update_expert_bias(model, counts) == 2
    assert model.layers["1"].moe.router.expert_bias.tolist() == [
        -1.5 * STEP,
        0.5 * STEP,
        0.5 * STEP,
        0.5 * STEP,
    ]
    assert model.layers["2"].moe.router.expert_bias.tolist() == [
        0.5 * STEP,
        0.5 * STEP,
        0.5 * STEP,
        -1.5 * STEP,
    ]
    assert update_expert_bias(model, counts) == 2
    assert model.layers["1"].moe.router.expert_bias.tolist() == [-3 * STEP, STEP, STEP, STEP]

    off = build(dataclasses.replace(TINY, bias_update_speed=0.0))
    update_expert_bias(off, counts)
    assert all(b.abs().sum() == 0 for b in biases(off).values())


def test_bias_is_a_persistent_fp32_buffer_not_a_parameter():
    model = build()
    router = model.layers["1"].moe.router
    assert router.expert_bias.dtype == torch.float32
    assert "layers.1.moe.router.expert_bias" in model.state_dict()
    assert not any("expert_bias" in n for n, _ in model.named_parameters())


def test_bad_counts_are_rejected_and_layers_without_bias_are_skipped():
    model = build()
    with pytest.raises(ValueError, match="\\['layers.0.moe'\\] are not MoE layers"):
        update_expert_bias(model, {"layers.0.moe": torch.ones(4)})
    with pytest.raises(
        ValueError, match="counts of layers.1.moe have shape \\(3,\\), expected \\(4,\\)"
    ):
        update_expert_bias(model, {"layers.1.moe": torch.ones(3)})
    plain = torch.nn.ModuleDict(
        {"moe": MoE(TopKRouter(4, 3, 1), GroupedExperts(3, 4, 2, clamped_swiglu))}
    )
    assert (
        update_expert_bias(plain, {"moe": torch.ones(3)}) == 0
    )  # GPT-OSS-style router: nothing to move


def test_one_update_per_step_with_gradient_accumulation():
    model = build()
    model.train()
    micro = [
        torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(i))
        for i in range(3)
    ]
    inputs = {"layers.1.moe": [], "layers.2.moe": []}
    for name in inputs:
        model.get_submodule(name).register_forward_pre_hook(
            lambda m, args, name=name: inputs[name].append(args[0])
        )
    for tokens in micro:  # the trainer's accumulation loop: forward + backward per micro-batch
        model(tokens).sum().backward()
    expected = {  # the same routing, counted independently through the router alone
        name: sum(
            torch.bincount(
                model.get_submodule(name).router(x.reshape(-1, TINY.dim)).indices.flatten(),
                minlength=4,
            )
            for x in xs
        ).float()
        for name, xs in inputs.items()
    }
    counts = collect_expert_load(model)  # once per optimizer step
    assert {k: v.tolist() for k, v in counts.items()} == {
        k: v.tolist() for k, v in expected.items()
    }
    assert all(
        v.sum() == 3 * 16 * 2 for v in counts.values()
    )  # 3 micro-batches x 16 tokens x top-2
    update_expert_bias(model, counts)
    for name, bias in biases(model).items():
        assert torch.equal(
            bias, expert_bias_delta(expected[name.removesuffix(".router.expert_bias")], STEP)
        ), name
    assert all(
        m.tokens_per_expert.sum() == 0 for m in model.modules() if isinstance(m, MoE)
    )  # reset for the next step


def test_counts_are_not_doubled_under_activation_checkpointing():
    tokens = torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(5))
    plain, wrapped = build(seed=1), build(seed=1)
    apply_activation_checkpointing(wrapped, "full")
    for model in (plain, wrapped):
        model(tokens).sum().backward()  # the wrapped blocks run their forward twice
    plain_counts, wrapped_counts = collect_expert_load(plain), collect_expert_load(wrapped)
    assert list(wrapped_counts) == ["layers.1.moe", "layers.2.moe"]
    assert all(torch.equal(plain_counts[k], wrapped_counts[k]) for k in plain_counts)
    assert all(v.sum() == 16 * 2 for v in wrapped_counts.values())
    update_expert_bias(wrapped, wrapped_counts)
    update_expert_bias(plain, plain_counts)
    assert all(
        torch.equal(a, b)
        for a, b in zip(biases(plain).values(), biases(wrapped).values(), strict=True)
    )


def test_evaluation_forwards_do_not_count():
    model = build()
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long))
    assert all(v.sum() == 0 for v in collect_expert_load(model).values())


@pytest.mark.multiprocess
def test_counts_are_summed_over_two_ranks_and_both_ranks_apply_the_same_update():
    results = launch(__file__, nproc=2, timeout=120).results()  # one result per rank
    assert len(results) == 2
    for r in results:
        assert r["counts_equal_reference"]
        assert r["count_total"] == 2 * (
            2 * 2 * 8 * 2
        )  # 2 layers x (2 ranks x 2 sequences x 8 tokens x top-2)
        assert r["bias_equal_reference"] and r["bias_nonzero"]
        assert r["expert_rows"] == [2, 2]  # the routed experts are sharded by FSDP2
        assert r["grad_diff"] < 1e-5
    assert results[0]["bias"] == results[1]["bias"]


def _two_rank_worker() -> None:
    """FSDP2 + full activation checkpointing on 2 gloo ranks, each with its own batch; every rank
    returns its result."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from torchtitan_lite.distributed.activation_checkpoint import apply_activation_checkpointing
    from torchtitan_lite.distributed.fsdp import apply_fsdp

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tokens = torch.randint(
        0, TINY.vocab_size, (2 * world, 8), generator=torch.Generator().manual_seed(9)
    )

    ref = build(seed=4)  # single process over both ranks' batches
    for r in range(world):
        ref(tokens[2 * r : 2 * r + 2]).sum().backward()
    ref_counts = {
        n.removesuffix(".tokens_per_expert"): b.clone()
        for n, b in ref.named_buffers()
        if "tokens_per" in n
    }
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    for name, m in ref.named_modules():
        if isinstance(m, MoE):
            m.router.expert_bias += expert_bias_delta(ref_counts[name], STEP)

    with torch.device("meta"):
        model = DeepSeekV3Model(TINY)
    apply_activation_checkpointing(model, "full")
    apply_fsdp(
        model,
        init_device_mesh("cpu", (world,)),
        param_dtype=torch.float32,
        reduce_dtype=torch.float32,
        reshard_after_forward=True,
    )
    materialize(model, "cpu")
    init_weights(model, deepseek_v3_init_plan(TINY), 4, buffer_device="cpu")
    model(tokens[2 * rank : 2 * rank + 2]).sum().backward()
    counts = collect_expert_load(model)
    update_expert_bias(model, counts)
    params = {n.replace("_checkpoint_wrapped_module.", ""): p for n, p in model.named_parameters()}
    rows = torch.zeros(world, dtype=torch.long)
    rows[rank] = params["layers.1.moe.experts.w1"].to_local().shape[0]
    dist.all_reduce(rows)
    got_bias = {
        n.replace("_checkpoint_wrapped_module.", ""): b
        for n, b in model.named_buffers()
        if "expert_bias" in n
    }
    want_bias = biases(ref)
    write_result(
        {
            "counts_equal_reference": sorted(counts) == sorted(ref_counts)
            and all(torch.equal(counts[k], ref_counts[k]) for k in counts),
            "count_total": sum(v.sum().item() for v in counts.values()),
            "bias_equal_reference": sorted(got_bias) == sorted(want_bias)
            and all(torch.equal(got_bias[k], want_bias[k]) for k in got_bias),
            "bias_nonzero": all(b.abs().sum().item() > 0 for b in got_bias.values()),
            "bias": {k: v.tolist() for k, v in sorted(got_bias.items())},
            "expert_rows": rows.tolist(),
            "grad_diff": max(
                (params[n].grad.full_tensor() - g).abs().max().item() for n, g in ref_grads.items()
            ),
        }
    )
    leave_together()


if __name__ == "__main__":
    _two_rank_worker()
