"""The MoE families' training hooks (models/common/moe_hooks.py): aux-loss scale, per-step expert load and bias
update, expert-load report written and printed by the engine."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from model_helpers import is_moe
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_expert_bias import STEP, TINY, biases, build

from models import get_model_spec, model_names
from models.common.expert_bias import expert_bias_delta
from models.common.moe import moe_layers
from models.common.moe_hooks import MoETrainingHooks, expert_load_report
from torchtitan_lite.components.metrics import MetricsLogger
from torchtitan_lite.protocols.model_spec import HookReport, TrainingHooks


def test_expert_load_is_relative_to_the_balanced_share(tmp_path, capsys):
    logger = MetricsLogger(tmp_path, enable_tensorboard=True, tb_subfolder="tb", rank=0, log_freq=10,
                           total_steps=100, world_size=2, num_flops_per_token=6e6, peak_flops=1e12)
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
    hooks = MoETrainingHooks(model, SimpleNamespace(dp_group=None, dp_degree=2, pp=1), micro_batches=4)
    assert [m.aux_loss_scale for m in moe_layers(model).values()] == [1 / 8, 1 / 8]
    tokens = torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(3))
    model(tokens).sum().backward()
    expected = {name: m.tokens_per_expert.clone() for name, m in moe_layers(model).items()}
    hooks.after_optimizer_step(1)
    assert {k: v.tolist() for k, v in hooks.loads.items()} == {k: v.tolist() for k, v in expected.items()}
    assert all(m.tokens_per_expert.sum() == 0 for m in moe_layers(model).values())  # reset for the next step
    for name, bias in biases(model).items():
        assert torch.equal(bias, expert_bias_delta(expected[name.removesuffix(".router.expert_bias")], STEP)), name
    report = hooks.report(1)
    assert set(report.scalars) == {f"moe/layers.{i}.moe/{k}_load" for i in (1, 2) for k in ("min", "max")}
    assert report.summary.startswith("step   1  expert load min/max  layers.1.moe ")


def test_dense_families_have_the_no_op_hooks_and_moe_families_the_moe_hooks():
    for name in model_names():
        spec = get_model_spec(name)
        hooks = spec.training_hooks(torch.nn.Linear(1, 1), SimpleNamespace(dp_group=None, dp_degree=1, pp=1), 1)
        assert isinstance(hooks, MoETrainingHooks) == is_moe(name), name
        if not is_moe(name):
            assert type(hooks) is TrainingHooks
            assert hooks.after_optimizer_step(1) is None and hooks.report(1) == HookReport({}, None)
