"""MoE training against transformers, step by step: for Qwen3-MoE, GPT-OSS and DeepSeek-V3 (the
published configs scaled down, ``hf_published.py``), our model with random weights is exported
through its state-dict adapter and loaded by ``Qwen3MoeForCausalLM`` / ``GptOssForCausalLM`` /
``DeepseekV3ForCausalLM``; both train 20 steps on the same batches (4 batches of random tokens,
cycled) with torch's AdamW (fp32, CPU, clip 1.0). Per step the losses, the grad norms and every MoE
layer's expert counts agree, with the auxiliary loss off and on (DeepSeek-V3 also with its
expert-bias update, applied to ``e_score_correction_bias`` with the same rule).

transformers' models have no per-layer balance loss (DeepSeek-V3's none at all): in the "on" cases
the reference adds our formula (``models/common/balance_loss.py``, one loss per MoE layer, summed)
computed from its own router logits and choices. Its own ``load_balancing_loss_func`` (Qwen3-MoE,
GPT-OSS: counts and probabilities summed over all layers' tokens before the product) is computed
beside ours at every step and checked equal to the same formula over our router outputs; which
formula each published recipe uses: docs/models.md, "Balance losses against transformers".

Measured bounds (CPU fp32, 20 steps, 128 tokens a step, torch 2.13, transformers 5.25): loss |diff|
<= 1.9e-6, grad-norm relative diff <= 6.6e-6 (DeepSeek-V3; Qwen3-MoE and GPT-OSS <= 3.2e-7); with
scalar kernels (``ATEN_CPU_CAPABILITY=default``, CI's first run) <= 2.9e-6 and <= 1.7e-5; expert
counts identical at every step and layer in both. Asserted: loss 1e-4, grad norm 1e-4 relative,
counts exactly equal.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
import transformers
from hf_published import PUBLISHED, SCALED_VOCAB, scaled
from hf_reference import random_ours

from torchtitan_lite.components.hf.export import hf_tensors, write_safetensors
from torchtitan_lite.init.apply import canonical_name, named_state_tensors
from torchtitan_lite.models import get_model_spec
from torchtitan_lite.models.common.balance_loss import load_balance_loss, sequence_balance_loss
from torchtitan_lite.models.common.expert_bias import expert_bias_delta, update_expert_bias
from torchtitan_lite.models.common.moe import collect_expert_load, moe_layers

STEPS = 20
BATCH, SEQLEN = 4, 32
POOL = 4
"""Batches cycled (random tokens), so the models can learn them and the loss falls."""
LOSS_TOL, GRAD_NORM_RTOL = 1e-4, 1e-4
CASES = {  # id: (published name, aux_loss_coeff, bias_update_speed)
    "qwen3_moe-aux_off": ("Qwen3-30B-A3B", 0.0, None),
    "qwen3_moe-aux_on": ("Qwen3-30B-A3B", 0.01, None),
    "gpt_oss-aux_off": ("gpt-oss-20b", 0.0, None),
    "gpt_oss-aux_on": ("gpt-oss-20b", 0.01, None),
    "deepseek_v3-aux_off": ("DeepSeek-V3", 0.0, 0.0),
    "deepseek_v3-aux_on-bias": ("DeepSeek-V3", 0.01, 0.01),
}


def build_pair(name: str, aux: float, bias_speed: float | None, folder):
    """``(ours, theirs, config)``: our model of the scaled config with random weights (seed 1),
    and transformers' loaded from its export (safetensors + the adapter's ``config.json``);
    both in train mode."""
    config, family = scaled(name), PUBLISHED[name][1]
    spec = get_model_spec(family)
    extra = {"aux_loss_coeff": aux}
    if bias_speed is not None:
        extra["bias_update_speed"] = bias_speed
    args = dataclasses.replace(
        spec.flavors["debug"], **spec.state_dict_adapter.args_from_hf_config(config), **extra
    )
    ours, adapter = random_ours(family, args, seed=1)
    full = {canonical_name(n): t.detach() for n, t in named_state_tensors(ours)}
    buffers = {canonical_name(n) for n, _ in ours.named_buffers()}
    write_safetensors(hf_tensors(full, adapter, torch.float32, buffers), str(folder), 1 << 40)
    (folder / "config.json").write_text(
        json.dumps({**adapter.to_hf_config(), "torch_dtype": "float32"})
    )
    theirs, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    return ours.train(), theirs.float().train(), config


def record_routers(model: torch.nn.Module) -> list:
    """Per router call, in order, ``(scores, indices)``: transformers' routers return
    ``(logits, weights, indices)`` (the logits recorded), ours a ``RouterOutput`` (its
    probabilities)."""
    calls = []
    for module in model.modules():
        name = type(module).__name__
        if name.endswith(("TopKRouter", "TopkRouter")):
            module.register_forward_hook(
                lambda _m, _i, out: calls.append(
                    (out.probs, out.indices) if hasattr(out, "probs") else (out[0], out[2])
                )
            )
    return calls


def their_aux(family: str, calls: list, config: dict, seqlen: int) -> torch.Tensor:
    """Our per-layer balance loss (summed over layers, unweighted) from transformers' router
    outputs."""
    total = torch.zeros(())
    for logits, indices in calls:
        counts = torch.bincount(indices.reshape(-1), minlength=logits.shape[-1]).float()
        if family == "deepseek_v3":
            total = total + sequence_balance_loss(torch.sigmoid(logits.float()), indices, seqlen)
        else:
            total = total + load_balance_loss(torch.softmax(logits.float(), -1), counts)
    return total


def global_switch_loss(probs: list[torch.Tensor], top_k: int) -> torch.Tensor:
    """transformers' ``load_balancing_loss_func`` written from router probabilities: the counts
    and the probability sums of all layers' tokens together, then ``E * sum_e f_e P_e``."""
    stacked = torch.cat(probs)
    counts = torch.bincount(
        stacked.topk(top_k, -1).indices.reshape(-1), minlength=stacked.shape[-1]
    ).float()
    return stacked.shape[-1] * (counts / stacked.shape[0] * stacked.mean(0)).sum()


def train(name: str, aux: float, bias_speed: float | None, folder) -> dict[str, list]:
    """Both models trained :data:`STEPS` steps; per step and side: loss, grad norm, counts per
    layer, and (Qwen3-MoE, GPT-OSS) transformers' global loss from each side's routers."""
    torch.manual_seed(0)
    ours, theirs, config = build_pair(name, aux, bias_speed, folder)
    family = PUBLISHED[name][1]
    our_calls, their_calls = record_routers(ours), record_routers(theirs)
    optimizers = [
        torch.optim.AdamW(m.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
        for m in (ours, theirs)
    ]
    gen = torch.Generator().manual_seed(7)
    pool = torch.randint(2, SCALED_VOCAB, (POOL, BATCH, SEQLEN + 1), generator=gen)
    top_k = config["num_experts_per_tok"]
    out = {k: [] for k in ("loss", "norm", "counts", "their_global", "our_global")}
    for step in range(STEPS):
        tokens = pool[step % POOL]
        inputs, labels = tokens[:, :-1], tokens[:, 1:].reshape(-1)
        our_calls.clear(), their_calls.clear()
        our_lm = F.cross_entropy(ours(inputs).flatten(0, 1), labels)
        their_lm = F.cross_entropy(theirs(input_ids=inputs).logits.flatten(0, 1), labels)
        their_balance = their_aux(family, their_calls, config, SEQLEN)
        our_balance = sum(
            (m.aux_loss for m in moe_layers(ours).values() if m.aux_loss is not None),
            torch.zeros(()),
        )
        losses = (our_lm + our_balance, their_lm + aux * their_balance)
        our_lm.backward()  # the MoE layers add their balance losses' gradients themselves
        losses[1].backward()
        norms = [
            torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm=1.0) for m in (ours, theirs)
        ]
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
        our_counts = collect_expert_load(ours)
        their_counts = [
            torch.bincount(i.reshape(-1), minlength=logits.shape[-1]).float()
            for logits, i in their_calls
        ]
        update_expert_bias(ours, our_counts)
        if bias_speed:
            routers = [m for m in theirs.modules() if type(m).__name__.endswith("TopkRouter")]
            with torch.no_grad():
                for router, counts in zip(routers, their_counts, strict=True):
                    router.e_score_correction_bias += expert_bias_delta(counts, bias_speed)
        if family != "deepseek_v3":
            their_probs = [torch.softmax(logits.detach().float(), -1) for logits, _ in their_calls]
            out["their_global"].append(
                transformers.models.qwen3_moe.modeling_qwen3_moe.load_balancing_loss_func(
                    tuple(logits.detach() for logits, _ in their_calls),
                    config.get("num_experts", config.get("num_local_experts")),
                    top_k,
                ).item()
            )
            out["our_global"].append(
                global_switch_loss([p.detach() for p, _ in our_calls], top_k).item()
            )
            assert torch.allclose(
                global_switch_loss(their_probs, top_k), torch.tensor(out["their_global"][-1])
            )
        out["loss"].append(tuple(x.item() for x in losses))
        out["norm"].append(tuple(n.item() for n in norms))
        out["counts"].append((list(our_counts.values()), their_counts))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_training_matches_transformers_step_by_step(case, tmp_path):
    name, aux, bias_speed = CASES[case]
    out = train(name, aux, bias_speed, tmp_path)
    loss_diff = max(abs(a - b) for a, b in out["loss"])
    norm_rdiff = max(abs(a - b) / b for a, b in out["norm"])
    print(f"{case}: loss |diff| {loss_diff:.1e}, grad-norm rel diff {norm_rdiff:.1e}")
    assert loss_diff <= LOSS_TOL and norm_rdiff <= GRAD_NORM_RTOL
    for step, (mine, theirs) in enumerate(out["counts"], 1):
        assert len(mine) == len(theirs) > 0
        for layer, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            assert torch.equal(a, b), (step, layer, a, b)
    assert out["loss"][-1][0] < out["loss"][0][0] - 0.05  # it trained
    if out["their_global"]:
        assert (
            max(abs(a - b) for a, b in zip(out["our_global"], out["their_global"], strict=True))
            <= 1e-5
        )
