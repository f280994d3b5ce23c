"""Muon (``optimizer.name = "Muon"``) on one process: the step is ``torch.optim.Muon`` +
``torch.optim.AdamW`` on the same parameter split, bitwise; the split; Newton-Schulz's output; the
state through a checkpoint round trip."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from model_helpers import build_random
from torch import nn

from torchtitan_lite.components.muon import MuonWithAdamW, newton_schulz
from torchtitan_lite.components.optimizer import build_optimizer
from torchtitan_lite.models import get_model_spec
from torchtitan_lite.preflight.checks import parse_args

MUON = {
    "momentum": 0.95,
    "nesterov": True,
    "ns_coefficients": [3.4445, -4.7750, 2.0315],
    "ns_steps": 5,
    "muon_eps": 1e-7,
    "adjust_lr_fn": "match_rms_adamw",
}
HYPER = {
    "lr": 2e-3,
    "betas": (0.9, 0.95),
    "eps": 1e-8,
    "weight_decay": 0.1,
    "decay_embeddings": False,
    "decay_norms_and_biases": False,
    "implementation": "foreach",
}


def _deepseek() -> nn.Module:
    spec = get_model_spec("deepseek_v3")
    return build_random(spec.model_cls, spec.flavors["debug"], seed=3, std=0.05)


def _grads(model: nn.Module, step: int) -> None:
    gen = torch.Generator().manual_seed(100 + step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen) * 0.01


def test_split_puts_matrices_and_expert_stacks_on_muon_and_embedding_head_norms_on_adamw():
    model = _deepseek()
    opt = build_optimizer(model, **HYPER, muon=MUON)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for g in opt.param_groups if g["use_muon"] for p in g["params"]]
    adamw = {
        names[id(p)]: g["weight_decay"]
        for g in opt.param_groups
        if not g["use_muon"]
        for p in g["params"]
    }
    assert "layers.1.moe.experts.w1" in muon and "layers.1.moe.router.gate.weight" in muon
    assert "layers.0.attention.wq.weight" in muon
    assert (
        adamw["output.weight"] == 0.1
        and adamw["tok_embeddings.weight"] == 0.0
        and adamw["norm.weight"] == 0.0
    )
    assert all(
        p.ndim == 1
        for n, p in model.named_parameters()
        if n in adamw and "output" not in n and "tok_embeddings" not in n
    )
    assert len(muon) + len(adamw) == len(list(model.parameters()))


def test_muon_step_equals_torch_muon_plus_adamw_bitwise_per_expert_matrix():
    """The outside reference: ``torch.optim.Muon(adjust_lr_fn="match_rms_adamw")`` on every 2-D
    matrix and on each expert's matrix of the 3-D stacks as its own parameter, ``torch.optim.AdamW``
    (foreach) on the rest with the same groups; 3 steps, the learning rate changed between them (as
    the schedule does)."""
    model = _deepseek()
    ref = copy.deepcopy(model)
    opt = build_optimizer(model, **HYPER, muon=MUON)
    ids = {id(p): n for n, p in model.named_parameters()}
    ref_params = dict(ref.named_parameters())
    muon_names = [ids[id(p)] for g in opt.param_groups if g["use_muon"] for p in g["params"]]
    slices = {
        n: [nn.Parameter(m.detach().clone()) for m in ref_params[n].unbind(0)]
        if ref_params[n].ndim == 3
        else [ref_params[n]]
        for n in muon_names
    }
    ref_muon = torch.optim.Muon(
        [p for ps in slices.values() for p in ps],
        lr=HYPER["lr"],
        weight_decay=0.1,
        momentum=0.95,
        nesterov=True,
        ns_coefficients=(3.4445, -4.7750, 2.0315),
        eps=1e-7,
        ns_steps=5,
        adjust_lr_fn="match_rms_adamw",
    )
    ref_adamw = torch.optim.AdamW(
        [
            {
                "params": [ref_params[ids[id(p)]] for p in g["params"]],
                "weight_decay": g["weight_decay"],
            }
            for g in opt.param_groups
            if not g["use_muon"]
        ],
        lr=HYPER["lr"],
        betas=(0.9, 0.95),
        eps=1e-8,
        foreach=True,
    )
    for step, lr in enumerate((2e-3, 1e-3, 5e-4)):
        for o in (opt, ref_muon, ref_adamw):
            for g in o.param_groups:
                g["lr"] = lr
        _grads(model, step)
        _grads(ref, step)
        for n, ps in slices.items():
            if len(ps) > 1 or ps[0] is not ref_params[n]:
                for p, g in zip(ps, ref_params[n].grad.unbind(0), strict=False):
                    p.grad = g.clone()
        opt.step()
        ref_muon.step()
        ref_adamw.step()
    for name, p in model.named_parameters():
        expected = (
            torch.stack(slices[name])
            if name in slices and len(slices[name]) > 1
            else ref_params[name]
        )
        assert torch.equal(p, expected.detach()), name
    assert any(
        not torch.equal(p, q)
        for p, q in zip(model.parameters(), _deepseek().parameters(), strict=True)
    )


def test_newton_schulz_output_has_singular_values_near_one():
    """The quintic iteration's fixed band (Keller Jordan's Muon post: about ``[0.7, 1.2]``) on a 64
    x 256 Gaussian matrix, whose singular values spread over a factor of 3."""
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    s = torch.linalg.svdvals(newton_schulz(x, (3.4445, -4.7750, 2.0315), 5, 1e-7).float())
    assert s.min() > 0.6 and s.max() < 1.25, (s.min(), s.max())


def test_state_dict_round_trip_resumes_exactly():
    """A fresh optimizer loaded with the state after 2 steps takes step 3 exactly as the
    uninterrupted one (the inner AdamW re-linked to the loaded state and groups)."""
    model = _deepseek()
    opt = build_optimizer(model, **HYPER, muon=MUON)
    for step in range(2):
        _grads(model, step)
        opt.step()
    resumed_model = copy.deepcopy(model)
    resumed = build_optimizer(resumed_model, **HYPER, muon=MUON)
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert isinstance(resumed, MuonWithAdamW)
    for m, o in ((model, opt), (resumed_model, resumed)):
        _grads(m, 2)
        o.step()
    for (name, p), q in zip(model.named_parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(p, q), name
    state = opt.state[model.layers["1"].moe.experts.w1]
    assert set(state) == {"momentum_buffer"} and state["momentum_buffer"].shape == (8, 256, 256)
    assert set(opt.state[model.output.weight]) == {"step", "exp_avg", "exp_avg_sq"}


def test_bad_muon_setting_is_refused():
    with pytest.raises(ValueError, match="ns_coefficients"):
        build_optimizer(_deepseek(), **HYPER, muon={**MUON, "ns_coefficients": [1.0, 2.0]})


def test_moonlight_config_is_the_16b_job_with_moonlight_optimizer_settings():
    muon, adamw = (
        parse_args(["--job.config_file", f"train_configs/{name}.toml"])
        for name in ("deepseek_v3_16b_muon", "deepseek_v3_16b")
    )
    opt = muon.optimizer
    assert (opt.name, opt.momentum, opt.nesterov, opt.ns_steps, opt.adjust_lr_fn) == (
        "Muon",
        0.95,
        True,
        5,
        "match_rms_adamw",
    )
    assert opt.ns_coefficients == [3.4445, -4.7750, 2.0315] and opt.weight_decay == 0.1
    assert (opt.beta1, opt.beta2, opt.eps, opt.decay_embeddings, opt.decay_norms_and_biases) == (
        0.9,
        0.95,
        1e-8,
        True,
        True,
    )
    differ = {
        f.name for f in dataclasses.fields(muon) if getattr(muon, f.name) != getattr(adamw, f.name)
    }
    assert differ == {"job", "optimizer"}
    assert dataclasses.replace(muon.job, description="", config_file=None) == dataclasses.replace(
        adamw.job, description="", config_file=None
    )
