"""The MoE families' training hooks (models/common/moe_hooks.py): aux-loss scale, per-step expert
load and bias update, expert-load report written and printed by the engine."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from model_helpers import is_moe
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_expert_bias import STEP, TINY, biases, build

from torchtitan_lite.components.metrics import MetricsLogger
from torchtitan_lite.models import get_model_spec, model_names
from torchtitan_lite.models.common import moe_hooks
from torchtitan_lite.models.common.expert_bias import expert_bias_delta
from torchtitan_lite.models.common.moe import moe_layers
from torchtitan_lite.models.common.moe_hooks import (
    DEAD_EXPERT_STEPS,
    MoETrainingHooks,
    dead_expert_notes,
    expert_load_report,
)
from torchtitan_lite.protocols.model_spec import HookReport, TrainingHooks


def test_expert_load_is_relative_to_the_balanced_share(tmp_path, capsys):
    logger = MetricsLogger(
        tmp_path,
        enable_tensorboard=True,
        tb_subfolder="tb",
        rank=0,
        log_freq=10,
        total_steps=100,
        world_size=2,
        num_flops_per_token=6e6,
        peak_flops=1e12,
    )
    report = expert_load_report(3, {"layers.1.moe": torch.tensor([6.0, 2.0, 0.0, 0.0])})
    logger.log_scalars(3, report.scalars)
    logger.log_line(report.summary)
    logger.close()
    line = report.summary
    assert line == "step   3  expert load min/max  layers.1.moe 0.00/3.00"
    assert capsys.readouterr().out.strip() == line
    acc = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert [e.value for e in acc.Scalars("moe/layers.1.moe/max_load")] == [3.0]
    assert [e.value for e in acc.Scalars("moe/layers.1.moe/min_load")] == [0.0]


def test_hooks_scale_the_aux_loss_then_sum_the_step_and_move_the_biases():
    model = build()
    model.train()
    hooks = MoETrainingHooks(
        model, SimpleNamespace(loss_group=None, loss_degree=2, pp=1), micro_batches=4
    )
    assert [m.aux_loss_scale for m in moe_layers(model).values()] == [1 / 8, 1 / 8]
    tokens = torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(3))
    model(tokens).sum().backward()
    expected = {name: m.tokens_per_expert.clone() for name, m in moe_layers(model).items()}
    hooks.after_optimizer_step(1)
    assert {k: v.tolist() for k, v in hooks.loads.items()} == {
        k: v.tolist() for k, v in expected.items()
    }
    assert all(
        m.tokens_per_expert.sum() == 0 for m in moe_layers(model).values()
    )  # reset for the next step
    for name, bias in biases(model).items():
        assert torch.equal(
            bias, expert_bias_delta(expected[name.removesuffix(".router.expert_bias")], STEP)
        ), name
    report = hooks.report(1)
    n = next(iter(expected.values())).numel()
    assert set(report.scalars) == {
        f"moe/layers.{i}.moe/{k}" for i in (1, 2) for k in ("min_load", "max_load", "idle_experts")
    } | {f"moe/layers.{i}.moe/load/{e}" for i in (1, 2) for e in range(n)}
    assert report.summary.startswith("step   1  expert load min/max  layers.1.moe ")
    assert " idle " in report.summary and " moved " not in report.summary  # no earlier window


def test_the_report_counts_idle_experts_and_moved_assignments_over_the_window():
    loads = {"layers.1.moe": torch.tensor([6.0, 2.0, 0.0, 0.0])}
    window = {"layers.1.moe": torch.tensor([10.0, 6.0, 4.0, 0.0])}
    previous = {"layers.1.moe": torch.tensor([5.0, 5.0, 5.0, 5.0])}
    report = expert_load_report(3, loads, window, previous, {"layers.1.moe": 0.0125})
    # shares 0.5/0.3/0.2/0 against 0.25 each: |0.25| + |0.05| + |0.05| + |0.25| = 0.6, half moved
    assert report.summary == (
        "step   3  expert load min/max  layers.1.moe 0.00/3.00 idle 1 moved 0.30 aux 0.0125"
    )
    assert report.scalars["moe/layers.1.moe/idle_experts"] == 1
    assert abs(report.scalars["moe/layers.1.moe/routing_moved"] - 0.3) < 1e-6
    assert [report.scalars[f"moe/layers.1.moe/load/{e}"] for e in range(4)] == [
        2.0,
        pytest.approx(1.2),
        pytest.approx(0.8),
        0.0,
    ]


def test_hooks_report_the_window_since_the_last_report_and_the_balance_loss():
    model = build(dataclasses.replace(TINY, aux_loss_coeff=0.01))
    model.train()
    hooks = MoETrainingHooks(
        model, SimpleNamespace(loss_group=None, loss_degree=1, pp=1), micro_batches=1
    )
    layers = moe_layers(model)
    n = next(iter(layers.values())).tokens_per_expert.numel()
    for step, counts in enumerate(([0.0] + [4.0] * (n - 1), [4.0] * (n - 1) + [0.0]), 1):
        for layer in layers.values():
            layer.tokens_per_expert.copy_(torch.tensor(counts))
        hooks.after_optimizer_step(step)
    first = hooks.report(2)  # both steps: every expert got tokens in one of them
    assert all(first.scalars[f"moe/{name}/idle_experts"] == 0 for name in layers)
    tokens = torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(3))
    model(tokens)  # a training forward sets each layer's aux_loss
    for layer in layers.values():
        layer.tokens_per_expert.copy_(torch.tensor([8.0] + [0.0] * (n - 1)))
    hooks.after_optimizer_step(3)
    second = hooks.report(3)
    for name, layer in layers.items():
        assert second.scalars[f"moe/{name}/idle_experts"] == n - 1
        # expert 0 had 4 of the 8 (n - 1) assignments of the window before, now all of them
        assert second.scalars[f"moe/{name}/routing_moved"] == pytest.approx(1 - 1 / (2 * (n - 1)))
        assert second.scalars[f"moe/{name}/aux_loss"] == layer.aux_loss.item() > 0


def test_dense_families_have_the_no_op_hooks_and_moe_families_the_moe_hooks():
    for name in model_names():
        spec = get_model_spec(name)
        hooks = spec.training_hooks(
            torch.nn.Linear(1, 1), SimpleNamespace(loss_group=None, loss_degree=1, pp=1), 1
        )
        assert isinstance(hooks, MoETrainingHooks) == is_moe(name), name
        if not is_moe(name):
            assert type(hooks) is TrainingHooks
            assert hooks.after_optimizer_step(1) is None and hooks.report(1) == HookReport({}, None)


def test_an_expert_without_tokens_for_dead_expert_steps_is_named_once_with_its_layer_and_count():
    named, idle = {}, {"layers.1.moe": torch.tensor([0, DEAD_EXPERT_STEPS - 1, 3, 0])}
    assert dead_expert_notes(9, idle, named) == ()  # expert 1: one step short
    idle = {"layers.1.moe": torch.tensor([0, DEAD_EXPERT_STEPS, DEAD_EXPERT_STEPS + 4, 0])}
    assert dead_expert_notes(10, idle, named) == (
        "warning: step  10  layers.1.moe: 2 of 4 experts (1, 2) received no tokens for "
        f"{DEAD_EXPERT_STEPS} steps; raise the load balancing (model.overrides.aux_loss_coeff)",
    )
    assert dead_expert_notes(11, idle, named) == ()  # named already
    idle = {
        "layers.1.moe": torch.tensor([0, 0, DEAD_EXPERT_STEPS + 5, 0])
    }  # expert 1 got tokens again
    assert dead_expert_notes(12, idle, named) == ()
    idle = {
        "layers.1.moe": torch.tensor([0, DEAD_EXPERT_STEPS, DEAD_EXPERT_STEPS + 6, 0])
    }  # and lost them
    assert dead_expert_notes(22, idle, named)[0].startswith(
        "warning: step  22  layers.1.moe: 1 of 4 experts (1) "
    )


def test_hooks_count_the_steps_each_expert_has_gone_without_a_token():
    model = build()
    hooks = MoETrainingHooks(
        model, SimpleNamespace(loss_group=None, loss_degree=1, pp=1), micro_batches=1
    )
    layers = moe_layers(model)
    n = next(iter(layers.values())).tokens_per_expert.numel()
    for step in range(1, DEAD_EXPERT_STEPS + 1):
        for layer in layers.values():
            layer.tokens_per_expert.copy_(torch.arange(n) % 2 * 5.0)  # the even experts get nothing
        hooks.after_optimizer_step(step)
        notes = hooks.report(step).notes
        assert notes == () or step == DEAD_EXPERT_STEPS
    assert {k: v.tolist() for k, v in hooks.idle.items()} == {
        name: [DEAD_EXPERT_STEPS if e % 2 == 0 else 0 for e in range(n)] for name in layers
    }
    evens = ", ".join(str(e) for e in range(0, n, 2))
    assert notes == tuple(
        f"warning: step {DEAD_EXPERT_STEPS:>3}  {name}: {len(range(0, n, 2))} of {n} experts "
        f"({evens}) received no tokens for {DEAD_EXPERT_STEPS} steps; raise the load balancing "
        "(model.overrides.aux_loss_coeff)"
        for name in layers
    )


def test_under_pipeline_parallelism_the_report_gathers_each_stage_s_layers(monkeypatch):
    model = build(dataclasses.replace(TINY, aux_loss_coeff=0.01))
    model.train()
    hooks = MoETrainingHooks(
        model, SimpleNamespace(loss_group=None, loss_degree=1, pp=1), micro_batches=1
    )
    tokens = torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(3))
    model(tokens)
    hooks.after_optimizer_step(1)
    aux = {name: m.aux_loss.item() for name, m in moe_layers(model).items()}
    expected = expert_load_report(1, hooks.loads, hooks.window, None, aux)
    stages = []

    def two_stages(local, group):  # layers.1 on stage 0, layers.2 on stage 1
        stages.append(group)
        return [{k: v for k, v in local.items() if k == name} for name in sorted(local)]

    monkeypatch.setattr(moe_hooks, "gather_stages", two_stages)
    hooks.pp_group = "pp"
    report = hooks.report(1)
    assert stages == ["pp"] and report.summary == expected.summary
    assert report.scalars == expected.scalars and "moe/layers.2.moe/aux_loss" in report.scalars
