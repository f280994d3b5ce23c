"""Our models against transformers on each published architecture (``hf_published.py``, scaled down
in width, depth, experts and vocabulary only): transformers -> HF folder -> import gives fp32 logits
within 1e-4 and the same expert choices, with no init draw; our model -> export ->
``from_pretrained`` loads with no missing or unexpected key and gives the same; the generate CLI
continues a prompt as transformers' greedy ``generate``."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
import transformers
from hf_published import PUBLISHED, SCALED_VOCAB, scaled
from hf_reference import hf_model, logits_and_choices, ours_from_folder, random_ours

import torchtitan_lite.init.apply as init_module
from torchtitan_lite import generate
from torchtitan_lite.components.hf.export import export_hf
from torchtitan_lite.data.tokenizer import Tokenizer
from torchtitan_lite.models import get_model_spec

SEQLEN = {"gpt-oss-20b": 144}
"""Tokens per test sequence: gpt-oss needs more than its 128-key window for the sliding layers to
differ."""
PATHS = {
    "Qwen3-0.6B": ("q_norm", "k_norm", "input_layernorm", "post_attention_layernorm", "model.norm"),
    "Qwen3-8B": ("k_norm", "lm_head"),
    "Qwen3-30B-A3B": ("q_norm", "mlp.gate.weight"),
    "gpt-oss-20b": (
        "sinks",
        "self_attn.q_proj.bias",
        "self_attn.o_proj.bias",
        "mlp.router.bias",
        "gate_up_proj_bias",
        "down_proj_bias",
        "post_attention_layernorm",
    ),
    "DeepSeek-V3": (
        "e_score_correction_bias",
        "q_a_layernorm",
        "kv_a_layernorm",
        "shared_experts",
        "mlp.gate.weight",
    ),
    "Moonlight-16B-A3B": ("e_score_correction_bias", "kv_a_layernorm", "shared_experts"),
    "Llama-3.1-8B": ("input_layernorm", "post_attention_layernorm", "model.norm", "lm_head"),
    "Llama-3.2-1B": ("k_proj", "mlp.up_proj", "embed_tokens"),
}
"""Parts of each reference whose reset (norms to one, the rest to zero) must change the logits: the
random weights are at a scale where they matter."""


def tokens_for(name: str) -> torch.Tensor:
    return torch.randint(
        2, SCALED_VOCAB, (2, SEQLEN.get(name, 24)), generator=torch.Generator().manual_seed(5)
    )


def assert_same(ours: tuple, theirs: tuple) -> float:
    """Logits within 1e-4 and identical expert choices; returns the max |diff|."""
    (our_logits, our_choices), (their_logits, their_choices) = ours, theirs
    diff = (our_logits - their_logits).abs().max().item()
    assert our_logits.shape == their_logits.shape and diff <= 1e-4
    assert len(our_choices) == len(their_choices)
    for mine, theirs_ in zip(our_choices, their_choices, strict=True):
        assert torch.equal(mine, theirs_)
        assert mine.unique().numel() > mine.shape[1]  # tokens go to different experts
    return diff


@pytest.fixture(scope="module", params=list(PUBLISHED))
def reference(request, tmp_path_factory, tokenizer_file):
    """``(name, transformers model, its saved folder)`` of each published architecture, scaled."""
    name = request.param
    model = hf_model(scaled(name))
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    shutil.copy(tokenizer_file, folder / "tokenizer.json")
    return name, model, folder


def test_every_path_of_the_reference_changes_the_logits(reference):
    name, model, _ = reference
    tokens = tokens_for(name)
    base, _ = logits_and_choices(model, tokens)
    tensors = dict([*model.named_parameters(), *model.named_buffers()])
    for part in PATHS[name]:
        chosen = {n: t for n, t in tensors.items() if part in n}
        saved = {n: t.clone() for n, t in chosen.items()}
        with torch.no_grad():
            for t in chosen.values():
                t.fill_(1.0 if "norm" in part else 0.0)
        changed, _ = logits_and_choices(model, tokens)
        with torch.no_grad():
            for n, t in chosen.items():
                t.copy_(saved[n])
        assert chosen and (changed - base).abs().max() > 1e-2, part


def test_import_gives_the_logits_and_expert_choices_of_transformers_without_init_draws(
    reference, monkeypatch
):
    name, model, folder = reference
    calls = []
    real = init_module.trunc_normal_
    monkeypatch.setattr(
        init_module, "trunc_normal_", lambda *a, **k: calls.append(k["key"]) or real(*a, **k)
    )
    ours, imported, family = ours_from_folder(folder)
    assert family == PUBLISHED[name][1]
    assert (
        calls == []
        and imported.missing == []
        and imported.unexpected == []
        and imported.skipped == {}
    )
    tokens = tokens_for(name)
    diff = assert_same(logits_and_choices(ours, tokens), logits_and_choices(model, tokens))
    print(f"{name}: import max |diff| {diff:.2e}")


def test_export_loads_in_transformers_with_no_missing_key_and_the_same_logits(
    reference, tmp_path, tokenizer_file
):
    name, _, _ = reference
    config, family, _ = scaled(name), PUBLISHED[name][1], PUBLISHED[name][2]
    spec = get_model_spec(family)
    args = dataclasses.replace(
        spec.flavors["debug"], **spec.state_dict_adapter.args_from_hf_config(config)
    )
    ours, adapter = random_ours(family, args, seed=1)
    export_hf(ours, str(tmp_path / "export"), adapter, Tokenizer(tokenizer_file))
    theirs, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "export", dtype=torch.float32, output_loading_info=True
    )
    assert [list(info[k]) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")] == [
        [],
        [],
        [],
    ]
    assert type(theirs).__name__ == config["architectures"][0]
    tokens = tokens_for(name)
    diff = assert_same(logits_and_choices(ours, tokens), logits_and_choices(theirs.eval(), tokens))
    print(f"{name}: export max |diff| {diff:.2e}")


def test_generate_cli_continues_as_transformers_greedy_generate(reference, capsys, tmp_path):
    name, model, folder = reference
    code = generate.main(
        [
            "--prompt",
            "KING HENRY:",
            "--max_new_tokens",
            "6",
            f"--checkpoint.initial_load_hf={folder}",
            f"--job.dump_folder={tmp_path}",
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert (
        code == 0
        and lines[-2].startswith("prompt ids: ")
        and lines[-1].startswith("generated ids: ")
    )
    prompt = [int(i) for i in lines[-2].removeprefix("prompt ids: ").split()]
    ours = [int(i) for i in lines[-1].removeprefix("generated ids: ").split()]
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=6,
            do_sample=False,
            eos_token_id=0,
            pad_token_id=1,
        )
    assert ours == out[0, len(prompt) :].tolist() and len(ours) >= 1
