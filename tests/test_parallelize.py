"""FSDP2 sharding, activation checkpointing and per-block compile (torchtitan_lite.distributed)."""

from __future__ import annotations

import pytest
import torch
from dist_fsdp_worker import ToyLM
from dist_helpers import REPO, launch
from torch import nn

from torchtitan_lite.distributed.activation_checkpoint import apply_activation_checkpointing
from torchtitan_lite.distributed.compile import apply_compile


def _seeded_toy() -> ToyLM:
    torch.manual_seed(0)
    model = ToyLM()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
    return model


@pytest.mark.multiprocess
def test_fsdp_two_ranks_gloo_matches_single_process_gradients_and_adamw_steps():
    results = launch(
        REPO / "tests" / "dist_fsdp_worker.py", nproc=2, timeout=120
    ).result()  # one entry per mode
    assert [r["ac_mode"] for r in results] == ["none", "full"]
    for r in results:
        assert r["params_are_dtensor"]
        assert r["tied_group_is_one"]
        assert (
            r["grad_diff"] < 1e-6
        )  # sum over ranks of (local sum / global count) == single process
        assert r["grad_norms"][0] > 0.5  # clipping at 0.5 was active in both steps
        assert r["norm_diff"] < 1e-6 * r["grad_norms"][0]
        assert r["weight_diff"] < 1e-6  # after two clipped AdamW steps
        assert r["tied_after_to_empty"] and r["tied_after_steps"] and r["tied_names_equal"]
        assert r["embedding_moved"] > 1e-3  # the tied weight did train


def test_full_activation_checkpointing_keeps_keys_and_values():
    model = _seeded_toy()
    tokens = torch.randint(0, 33, (2, 5), generator=torch.Generator().manual_seed(0))
    model(tokens).square().sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    apply_activation_checkpointing(model, "full")
    assert list(model.layers.keys()) == ["0", "1"]
    names = [n for n, _ in model.named_parameters()]
    assert "layers.0._checkpoint_wrapped_module.w1.weight" in names
    model(tokens).square().sum().backward()
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, ref_grads[n.replace("_checkpoint_wrapped_module.", "")])


def test_activation_checkpointing_none_is_identity_and_bad_mode_names_value():
    model = _seeded_toy()
    before = [n for n, _ in model.named_parameters()]
    assert apply_activation_checkpointing(model, "none") is model
    assert [n for n, _ in model.named_parameters()] == before
    with pytest.raises(ValueError, match="one of \\('none', 'full', 'selective'\\), got 'partial'"):
        apply_activation_checkpointing(model, "partial")


def test_compile_keeps_parameter_names_and_outputs():
    model = _seeded_toy()
    tokens = torch.randint(0, 33, (2, 5), generator=torch.Generator().manual_seed(0))
    expected = model(tokens)
    names = [n for n, _ in model.named_parameters()]
    apply_compile(model, backend="eager")
    assert [n for n, _ in model.named_parameters()] == names
    assert torch.equal(model(tokens), expected)


def test_model_without_moduledict_layers_is_rejected():
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(2, 2)])
    with pytest.raises(TypeError, match="ModuleList"):
        apply_compile(model)
