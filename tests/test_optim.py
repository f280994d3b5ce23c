"""AdamW param groups, the WSD learning-rate schedule and gradient clipping."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from torchtitan_lite.components.lr_schedule import (
    build_lr_scheduler,
    warmup_clipped_line,
    wsd_lr_factor,
)
from torchtitan_lite.components.optimizer import (
    build_optimizer,
    clip_grad_norm_,
    fused_adamw_runs,
    split_decay_params,
)
from torchtitan_lite.models.common.norm import RMSNorm


class TinyTied(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4)
        self.frozen = nn.Linear(4, 4, bias=False)
        self.frozen.weight.requires_grad_(False)
        self.norm = RMSNorm(4)
        self.register_buffer("counts", torch.zeros(3))
        self.output = nn.Linear(4, 10, bias=False)
        self.output.weight = self.tok_embeddings.weight


def _names(named):
    return [n for n, _ in named]


def test_default_groups_decay_only_linear_matrices():
    decay, no_decay = split_decay_params(
        TinyTied(), decay_embeddings=False, decay_norms_and_biases=False
    )
    assert _names(decay) == ["proj.weight"]
    assert _names(no_decay) == ["tok_embeddings.weight", "proj.bias", "norm.weight"]


def test_decay_flags_move_embeddings_and_norms_biases():
    decay, no_decay = split_decay_params(
        TinyTied(), decay_embeddings=True, decay_norms_and_biases=True
    )
    assert _names(decay) == ["tok_embeddings.weight", "proj.weight", "proj.bias", "norm.weight"]
    assert no_decay == []


def test_optimizer_holds_each_trainable_tensor_once_with_group_decay():
    model = TinyTied()
    opt = build_optimizer(
        model,
        lr=1e-3,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=0.1,
        decay_embeddings=False,
        decay_norms_and_biases=False,
    )
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert opt.param_groups[0]["params"][0] is model.proj.weight
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(ids) == sorted(
        {
            id(model.tok_embeddings.weight),
            id(model.proj.weight),
            id(model.proj.bias),
            id(model.norm.weight),
        }
    )
    assert (
        opt.defaults["fused"] is True and not opt.defaults["foreach"]
    )  # auto on CPU: torch 2.13 has fused


def _seeded_tiny() -> TinyTied:
    torch.manual_seed(0)
    model = TinyTied()
    with torch.no_grad():
        for param in model.parameters():  # RMSNorm's weight starts uninitialized
            param.copy_(torch.randn_like(param))
    return model


def _train_three_steps(implementation: str) -> list[torch.Tensor]:
    model = _seeded_tiny()
    opt = build_optimizer(
        model,
        lr=1e-2,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=0.1,
        decay_embeddings=False,
        decay_norms_and_biases=False,
        implementation=implementation,
    )
    for step in range(3):
        x = torch.arange(6).reshape(2, 3) + step
        model.output(model.norm(model.proj(model.tok_embeddings(x)))).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


def test_fused_and_foreach_adamw_agree():
    fused, foreach = _train_three_steps("fused"), _train_three_steps("foreach")
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(fused, foreach, strict=True))
    initial = [p.detach() for p in _seeded_tiny().parameters() if p.requires_grad]
    assert not any(
        torch.allclose(a, b, rtol=0, atol=1e-4) for a, b in zip(fused, initial, strict=False)
    )  # they did move


def test_fused_on_a_device_without_fused_kernels_is_refused(monkeypatch):
    import torchtitan_lite.components.optimizer as optim

    monkeypatch.setattr(optim, "fused_adamw_runs", lambda device, dtype: device.type == "cuda")
    with pytest.raises(
        ValueError, match="no fused AdamW for cpu parameters; use 'foreach' or 'auto'"
    ):
        build_optimizer(
            TinyTied(),
            lr=1e-3,
            betas=(0.9, 0.95),
            eps=1e-8,
            weight_decay=0.1,
            decay_embeddings=False,
            decay_norms_and_biases=False,
            implementation="fused",
        )
    opt = build_optimizer(
        TinyTied(),
        lr=1e-3,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=0.1,
        decay_embeddings=False,
        decay_norms_and_biases=False,
        implementation="auto",
    )
    assert opt.defaults["foreach"] is True and not opt.defaults["fused"]


def test_the_fused_adamw_probe_runs_torchs_kernel_where_it_exists():
    assert fused_adamw_runs(torch.device("cpu"), torch.float32)  # torch 2.13 has fused AdamW on CPU
    assert fused_adamw_runs(torch.device("cpu"), torch.bfloat16)
    assert not fused_adamw_runs(torch.device("meta"), torch.float32)
    with torch.device("meta"):
        model = TinyTied()
    with pytest.raises(
        ValueError, match="no fused AdamW for meta parameters; use 'foreach' or 'auto'"
    ):
        build_optimizer(
            model,
            lr=1e-3,
            betas=(0.9, 0.95),
            eps=1e-8,
            weight_decay=0.1,
            decay_embeddings=False,
            decay_norms_and_biases=False,
            implementation="fused",
        )


def test_optimizer_rejects_bad_hyperparameters_by_name():
    with pytest.raises(ValueError, match=r"betas .* got \(0.9, 1.0\)"):
        build_optimizer(
            TinyTied(),
            lr=1e-3,
            betas=(0.9, 1.0),
            eps=1e-8,
            weight_decay=0.1,
            decay_embeddings=False,
            decay_norms_and_biases=False,
        )
    with pytest.raises(ValueError, match="lr must be finite and > 0, got 0.0"):
        build_optimizer(
            TinyTied(),
            lr=0.0,
            betas=(0.9, 0.95),
            eps=1e-8,
            weight_decay=0.1,
            decay_embeddings=False,
            decay_norms_and_biases=False,
        )


WSD = dict(
    warmup_steps=10, steps=100, decay_ratio=0.2, min_lr_factor=0.1
)  # decay over steps 81..100


@pytest.mark.parametrize("decay_type", ["linear", "cosine", "sqrt"])
def test_warmup_and_stable_phase_values(decay_type):
    f = lambda s: wsd_lr_factor(s, decay_type=decay_type, **WSD)  # noqa: E731
    assert f(1) == 0.1 and f(5) == 0.5 and f(10) == 1.0
    assert f(11) == 1.0 and f(50) == 1.0 and f(80) == 1.0
    assert f(100) == pytest.approx(0.1, abs=1e-15) and f(101) == pytest.approx(0.1, abs=1e-15)


@pytest.mark.parametrize(
    "decay_type, at_85, at_90",
    [
        ("linear", 0.1 + 0.9 * 0.75, 0.1 + 0.9 * 0.5),
        ("cosine", 0.1 + 0.9 * (1 + math.sqrt(0.5)) / 2, 0.1 + 0.9 * 0.5),
        ("sqrt", 0.1 + 0.9 * 0.5, 0.1 + 0.9 * (1 - math.sqrt(0.5))),
    ],
)
def test_decay_phase_values(decay_type, at_85, at_90):
    assert wsd_lr_factor(85, decay_type=decay_type, **WSD) == pytest.approx(at_85, abs=1e-12)
    assert wsd_lr_factor(90, decay_type=decay_type, **WSD) == pytest.approx(at_90, abs=1e-12)


def test_scheduler_lr_follows_training_steps():
    opt = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=1e-3)
    sched = build_lr_scheduler(opt, decay_type="linear", **WSD)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert (
        lrs[0] == pytest.approx(1e-4)
        and lrs[9] == pytest.approx(1e-3)
        and lrs[79] == pytest.approx(1e-3)
    )
    assert lrs[84] == pytest.approx(1e-3 * 0.775) and lrs[99] == pytest.approx(1e-4)


def test_warmup_longer_than_the_steps_before_decay_is_clipped_and_the_decay_kept():
    kw = dict(warmup_steps=90, steps=100, decay_ratio=0.2, decay_type="linear", min_lr_factor=0.0)
    clipped = dict(kw, warmup_steps=80)  # 100 - round(0.2 * 100)
    assert [wsd_lr_factor(s, **kw) for s in range(1, 101)] == [
        wsd_lr_factor(s, **clipped) for s in range(1, 101)
    ]
    assert (
        wsd_lr_factor(1, **kw) == 1 / 80
        and wsd_lr_factor(80, **kw) == 1.0
        and wsd_lr_factor(90, **kw) == 0.5
    )
    # the shortest runs: one step at the full LR (no decay step: round(0.2) == 0); 5 steps warm up
    # for 4, decay 1
    assert wsd_lr_factor(1, **dict(kw, steps=1)) == 1.0
    assert [wsd_lr_factor(s, **dict(kw, steps=5)) for s in range(1, 6)] == [
        0.25,
        0.5,
        0.75,
        1.0,
        0.0,
    ]
    assert warmup_clipped_line(warmup_steps=20, steps=20, decay_ratio=0.3) == (
        "lr schedule: warming up for 14 steps, not lr_scheduler.warmup_steps 20, so that the "
        "warmup and the 6 decay steps (lr_scheduler.decay_ratio 0.3) fit in training.steps 20"
    )
    assert warmup_clipped_line(warmup_steps=20, steps=400, decay_ratio=0.3) is None
    assert warmup_clipped_line(warmup_steps=5, steps=2, decay_ratio=0.3).startswith(
        "lr schedule: warming up for 1 step, not lr_scheduler.warmup_steps 5"
    )


def test_schedule_rejects_an_unknown_decay_type():
    with pytest.raises(ValueError, match="decay_type must be one of .* got 'exp'"):
        wsd_lr_factor(
            1, warmup_steps=1, steps=10, decay_ratio=0.2, decay_type="exp", min_lr_factor=0.0
        )


def test_no_decay_and_no_warmup_is_constant():
    kw = dict(warmup_steps=0, steps=10, decay_ratio=0.0, decay_type="cosine", min_lr_factor=0.0)
    assert [wsd_lr_factor(s, **kw) for s in (1, 10, 11)] == [1.0, 1.0, 1.0]


def _two_params(g1, g2):
    a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(1, 1))
    a.grad, b.grad = torch.tensor(g1), torch.tensor(g2)
    return a, b


def test_clip_matches_hand_computation():
    a, b = _two_params([3.0, 4.0], [[12.0]])  # norm sqrt(9 + 16 + 144) = 13
    norm = clip_grad_norm_([a, b], max_norm=6.5)
    assert norm.item() == 13.0
    scale = 6.5 / (13.0 + 1e-6)
    assert torch.allclose(a.grad, torch.tensor([3.0, 4.0]) * scale, rtol=0, atol=1e-7)
    assert torch.allclose(b.grad, torch.tensor([[12.0]]) * scale, rtol=0, atol=1e-7)


def test_clip_below_max_norm_leaves_grads():
    a, b = _two_params([3.0, 4.0], [[12.0]])
    assert clip_grad_norm_([a, b], max_norm=100.0).item() == 13.0
    assert torch.equal(a.grad, torch.tensor([3.0, 4.0]))


def test_clip_reports_non_finite_norm_and_leaves_grads():
    a, b = _two_params([3.0, float("inf")], [[12.0]])
    assert clip_grad_norm_([a, b], max_norm=1.0).item() == math.inf
    assert torch.equal(b.grad, torch.tensor([[12.0]]))
    a, b = _two_params([3.0, float("nan")], [[12.0]])
    assert math.isnan(clip_grad_norm_([a, b], max_norm=1.0).item())


def test_clip_without_grads_is_zero_and_bad_max_norm_rejected():
    assert clip_grad_norm_([nn.Parameter(torch.zeros(2))], max_norm=1.0).item() == 0.0
    with pytest.raises(ValueError, match="max_norm must be finite and > 0, got -1.0"):
        clip_grad_norm_([], max_norm=-1.0)


def test_clipping_fsdp2_dtensor_grads_is_one_foreach_norm_and_one_foreach_scale(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.counts[str(func)] = self.counts.get(str(func), 0) + 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(5)])
    for layer in model:
        fully_shard(layer, mesh=init_device_mesh("cpu", (1,)))
    model(torch.randn(3, 8)).square().sum().backward()
    with OpCounts() as ops:
        norm = clip_grad_norm_(model.parameters(), max_norm=1e-3)
    assert (
        ops.counts["aten._foreach_norm.Scalar"] == 1
        and ops.counts["aten._foreach_mul_.Tensor"] == 1
    )
    assert (
        "aten.linalg_vector_norm.default" in ops.counts
        and ops.counts["aten.linalg_vector_norm.default"] == 1
    )
    clipped = torch.linalg.vector_norm(
        torch.stack([p.grad.full_tensor().norm() for p in model.parameters()])
    )
    assert norm > 1e-3 and abs(clipped.item() - 1e-3) < 1e-8
