"""Llama 3: published sizes, RoPE scaling against Meta's formula and transformers' bitwise, forward
and backward against transformers' ``LlamaForCausalLM``, init plan stds, step-1 loss, FLOPs (the
plan's coverage of every family: ``test_import_boundary.py``)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from model_helpers import build_planned, build_random, random_token_loss
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from torchtitan_lite.models import get_model_spec
from torchtitan_lite.models.common.rope import rope_cos_sin
from torchtitan_lite.models.llama3 import (
    Llama3Model,
    Llama3ModelArgs,
    llama3_flavors,
    llama3_init_plan,
)
from torchtitan_lite.models.llama3.flops import llama3_num_params, num_flops_per_token
from torchtitan_lite.models.llama3.model import llama3_inv_freq
from torchtitan_lite.models.llama3.state_dict_adapter import Llama3StateDictAdapter

TINY = Llama3ModelArgs(
    dim=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    hidden_dim=48,
    vocab_size=64,
    max_seq_len=16,
)
"""head_dim 8 at rope_theta 5e5: wavelengths 6, 167, 4443 and 118,000 positions, so one frequency of
each band of the scaling (kept below 2048, interpolated, divided by 8 above 8192)."""

PUBLISHED_PARAMS = {  # totals of meta-llama/Llama-3.2-1B, -3.2-3B, -3.1-8B, -3.1-70B
    "1b": 1_235_814_400,
    "3b": 3_212_749_824,
    "8b": 8_030_261_248,
    "70b": 70_553_706_496,
}


def meta_scaled_frequencies(args: Llama3ModelArgs) -> torch.Tensor:
    """Meta's ``apply_scaling`` (llama-models ``reference_impl/model.py``), element by element in
    float64."""
    low_wavelen = args.rope_original_max_seq_len / args.rope_low_freq_factor
    high_wavelen = args.rope_original_max_seq_len / args.rope_high_freq_factor
    out = []
    for i in range(0, args.head_dim, 2):
        freq = 1.0 / args.rope_theta ** (i / args.head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(freq)
        elif wavelen > low_wavelen:
            out.append(freq / args.rope_factor)
        else:
            smooth = (args.rope_original_max_seq_len / wavelen - args.rope_low_freq_factor) / (
                args.rope_high_freq_factor - args.rope_low_freq_factor
            )
            out.append((1 - smooth) * freq / args.rope_factor + smooth * freq)
    return torch.tensor(out, dtype=torch.float64)


def transformers_model(args: Llama3ModelArgs, ours: torch.nn.Module) -> torch.nn.Module:
    """``LlamaForCausalLM`` of our exported config, holding our model's values (fp32, eval mode)."""
    adapter = Llama3StateDictAdapter(args)
    config = adapter.to_hf_config()
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).float().eval()
    state = {
        kind.hf_name: ours.get_parameter(name).detach().clone()
        for name, kind in adapter.tensors.items()
    }
    assert model.load_state_dict(state, strict=False).missing_keys == (
        [] if not args.tie_embeddings else ["lm_head.weight"]
    )
    return model


@pytest.mark.parametrize("flavor", sorted(PUBLISHED_PARAMS))
def test_parameter_count_on_meta_equals_published_total(flavor):
    args = llama3_flavors[flavor]
    with torch.device("meta"):
        model = Llama3Model(args)
    assert (
        sum(p.numel() for p in model.parameters())
        == PUBLISHED_PARAMS[flavor]
        == llama3_num_params(args)
    )


def test_published_flavors_share_the_llama3_config_values():
    for flavor in PUBLISHED_PARAMS:
        a = llama3_flavors[flavor]
        assert (a.n_kv_heads, a.vocab_size, a.rope_theta, a.norm_eps, a.max_seq_len) == (
            8,
            128256,
            5e5,
            1e-5,
            131072,
        )
        assert (
            a.rope_scaling,
            a.rope_low_freq_factor,
            a.rope_high_freq_factor,
            a.rope_original_max_seq_len,
        ) == (True, 1.0, 4.0, 8192)
        assert a.dim == a.n_heads * a.head_dim
        assert (a.rope_factor, a.tie_embeddings) == (
            (32.0, True) if flavor in ("1b", "3b") else (8.0, False)
        )


@pytest.mark.parametrize("flavor", ["8b", "1b", "debug"])
def test_scaled_frequencies_are_transformers_bitwise_and_metas_formula(flavor):
    args = llama3_flavors[flavor]
    ours = llama3_inv_freq(args)
    config = transformers.LlamaConfig(**Llama3StateDictAdapter(args).to_hf_config())
    theirs, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    assert torch.equal(ours, theirs) and attention_factor == 1.0
    torch.testing.assert_close(ours.double(), meta_scaled_frequencies(args), rtol=1e-6, atol=0)
    plain = 1.0 / args.rope_theta ** (torch.arange(0, args.head_dim, 2).double() / args.head_dim)
    ratio = ours.double() / plain
    kept, divided = (ratio - 1).abs() < 1e-6, (ratio - 1 / args.rope_factor).abs() < 1e-6
    assert (
        kept.any() and divided.any() and (~kept & ~divided).any()
    )  # every band of the scaling is used


def test_rope_tables_are_the_scaled_ones_and_plain_without_scaling():
    with torch.device("meta"):
        model = Llama3Model(TINY)
    model.to_empty(device="cpu")
    model.init_buffers("cpu")
    cos, sin = rope_cos_sin(
        TINY.head_dim, TINY.max_seq_len, TINY.rope_theta, inv_freq=llama3_inv_freq(TINY)
    )
    assert torch.equal(model.rope_cos, cos) and torch.equal(model.rope_sin, sin)
    plain = dataclasses.replace(TINY, rope_scaling=False)
    with torch.device("meta"):
        model = Llama3Model(plain)
    model.to_empty(device="cpu")
    model.init_buffers("cpu")
    assert torch.equal(
        model.rope_cos, rope_cos_sin(TINY.head_dim, TINY.max_seq_len, TINY.rope_theta)[0]
    )
    assert not torch.equal(model.rope_cos, cos)


@pytest.mark.parametrize("tie", [False, True])
def test_forward_and_backward_match_transformers_llama(tie):
    args = dataclasses.replace(TINY, tie_embeddings=tie)
    ours = build_random(Llama3Model, args, std=0.1)
    theirs = transformers_model(args, ours)
    tokens = torch.randint(0, args.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, args.vocab_size, (2, 11), generator=torch.Generator().manual_seed(2))
    logits, their_logits = ours(tokens), theirs(tokens).logits
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    F.cross_entropy(their_logits.flatten(0, 1), targets.flatten()).backward()
    torch.testing.assert_close(logits, their_logits, atol=1e-5, rtol=0)
    for name, kind in Llama3StateDictAdapter(args).tensors.items():
        their_grad = theirs.get_parameter(kind.hf_name).grad
        torch.testing.assert_close(
            ours.get_parameter(name).grad, their_grad, atol=1e-5, rtol=0, msg=name
        )


def test_blocks_have_no_qk_norm_and_the_8b_shapes():
    with torch.device("meta"):
        block = Llama3Model(llama3_flavors["8b"]).layers["0"]
    assert block.attention.q_norm is None and block.attention.k_norm is None
    shapes = {name: tuple(p.shape) for name, p in block.named_parameters()}
    assert shapes == {
        "attention_norm.weight": (4096,),
        "attention.wq.weight": (4096, 4096),
        "attention.wk.weight": (1024, 4096),
        "attention.wv.weight": (1024, 4096),
        "attention.wo.weight": (4096, 4096),
        "ffn_norm.weight": (4096,),
        "feed_forward.w1.weight": (14336, 4096),
        "feed_forward.w2.weight": (4096, 14336),
        "feed_forward.w3.weight": (14336, 4096),
    }


def test_init_plan_stds():
    args = llama3_flavors["8b"]
    plan = dict(llama3_init_plan(args).entries)
    assert (plan["tok_embeddings.weight"].kind, plan["tok_embeddings.weight"].std) == (
        "normal",
        1.0,
    )
    assert (
        plan["layers.*.attention.wq.weight"].std
        == plan["layers.*.feed_forward.w1.weight"].std
        == 0.02
    )
    for name in ("attention.wo", "feed_forward.w2", "feed_forward.w3"):
        assert plan[f"layers.*.{name}.weight"].std == pytest.approx(0.02 / math.sqrt(64)), name
    assert (plan["output.weight"].std, plan["output.weight"].cutoff) == (
        pytest.approx(4096**-0.5),
        3.0,
    )
    assert dict(llama3_init_plan(llama3_flavors["1b"]).entries)["output.weight"].std == 0.02


@pytest.mark.parametrize("tie, above_ln_v", [(False, (0.3, 0.7)), (True, (-0.1, 0.2))])
def test_step1_loss_on_random_tokens_is_ln_vocab_plus_the_output_init(tie, above_ln_v):
    """The plan covers the tied model too (``init_weights`` refuses a parameter no entry
    matches)."""
    args = dataclasses.replace(llama3_flavors["debug"], max_seq_len=256, tie_embeddings=tie)
    model = build_planned(Llama3Model, llama3_init_plan, args, seed=0)
    loss = random_token_loss(model, args.vocab_size, seed=5)
    low, high = above_ln_v
    assert math.log(args.vocab_size) + low <= loss <= math.log(args.vocab_size) + high


def test_num_flops_per_token_of_8b_at_8192():
    # untied: the 128256 x 4096 output counts, the embedding lookup does not; 12 * 32 * 32 * 128 *
    #     8192 attention
    expected = 6 * (8_030_261_248 - 128256 * 4096) + 12 * 32 * 32 * 128 * 8192
    assert num_flops_per_token(llama3_flavors["8b"], 8192) == expected


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(n_kv_heads=3), r"n_heads \(4\) must be a multiple of n_kv_heads \(3\)"),
        (
            dict(rope_low_freq_factor=4.0),
            r"RoPE scaling needs rope_factor >= 1 and 0 < rope_low_freq_factor < "
            r"rope_high_freq_factor, got 8.0, 4.0 and 4.0",
        ),
        (dict(rope_factor=0.5), r"got 0.5, 1.0 and 4.0"),
        (dict(rope_scaling="yes"), r"rope_scaling must be true or false, got 'yes'"),
    ],
)
def test_bad_args_raise_clear_errors(changes, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TINY, **changes)


def test_registry_returns_the_llama3_spec():
    spec = get_model_spec("llama3")
    assert spec.model_cls is Llama3Model and spec.init_plan is llama3_init_plan
    assert set(spec.flavors) == {"debug", *PUBLISHED_PARAMS}
    assert spec.state_dict_adapter is Llama3StateDictAdapter
