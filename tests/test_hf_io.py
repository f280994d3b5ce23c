"""Hugging Face import/export of Qwen3: logits equal to transformers, bitwise round trip, skipped
init, missing and unexpected tensors, pre-flight config check. One in-process rank (FSDP2 on a
1-rank group)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.distributed as dist
from ckpt_helpers import text_file, tiny_job
from safetensors.torch import load_file, save_file

import torchtitan_lite.init.apply as init_module
from torchtitan_lite.components.hf.args import state_dict_adapter
from torchtitan_lite.components.hf.export import export_hf
from torchtitan_lite.components.hf.folder import HFError
from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.init.apply import named_state_tensors
from torchtitan_lite.lifecycle.faults import StopRequest
from torchtitan_lite.preflight.checks import check_paths, parse_run
from torchtitan_lite.train import Trainer

transformers = pytest.importorskip("transformers")


def argv(tmp, *extra: str) -> list[str]:
    return tiny_job(tmp, "--checkpoint.enable=false", *extra)


def build(tmp, *extra: str) -> Trainer:
    """A Trainer in this process; the caller must call ``close``."""
    if not (tmp / "data.txt").exists():
        text_file(tmp, n_plays=1)
    return Trainer(parse_run(argv(tmp, *extra)))


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@torch.no_grad()
def randomize(model) -> None:
    """Random values everywhere (norm weights around 1), so that a swapped or mislaid tensor
    shows."""
    gen = torch.Generator().manual_seed(0)
    for name, tensor in named_state_tensors(model):
        local = tensor.to_local()
        noise = torch.randn(local.shape, generator=gen)
        local.copy_(1 + 0.1 * noise if "norm" in name else 0.05 * noise)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny tied Qwen3 with random weights exported in HF format, and its logits on a fixed
    batch."""
    tmp = tmp_path_factory.mktemp("hf")
    trainer = build(tmp)
    try:
        randomize(trainer.model)
        folder = tmp / "hf"
        export_hf(
            trainer.model, str(folder), state_dict_adapter("qwen3", trainer.args), trainer.tokenizer
        )
        tokens = torch.randint(0, 2048, (2, 16), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            logits = trainer.model(tokens)
    finally:
        close()
    return tmp, folder, tokens, logits


@pytest.mark.parametrize("tied", [True, False])
def test_logits_equal_transformers_qwen3(tmp_path, tied):
    trainer = build(tmp_path, f"--model.tie_embeddings={str(tied).lower()}")
    try:
        randomize(trainer.model)
        export_hf(
            trainer.model,
            str(tmp_path / "hf"),
            state_dict_adapter("qwen3", trainer.args),
            trainer.tokenizer,
        )
        tokens = torch.randint(0, 2048, (2, 24), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            ours = trainer.model(tokens)
    finally:
        close()
    reference = transformers.Qwen3ForCausalLM.from_pretrained(
        str(tmp_path / "hf"), dtype=torch.float32
    ).eval()
    assert reference.config.tie_word_embeddings is tied
    with torch.no_grad():
        theirs = reference(tokens).logits
    assert ours.shape == theirs.shape == (2, 24, 2048)
    assert (ours - theirs).abs().max().item() < 2e-5


def test_import_loads_everything_draws_nothing_and_round_trips_bitwise(
    hf_folder, tmp_path, monkeypatch
):
    tmp, folder, tokens, logits = hf_folder
    calls = []
    real = init_module.trunc_normal_
    monkeypatch.setattr(
        init_module, "trunc_normal_", lambda *a, **k: calls.append(k["key"]) or real(*a, **k)
    )
    trainer = build(tmp, f"--checkpoint.initial_load_hf={folder}")
    try:
        result = trainer.init_result
        with torch.no_grad():
            same_logits = torch.equal(trainer.model(tokens), logits)
        export_hf(
            trainer.model,
            str(tmp_path / "again"),
            state_dict_adapter("qwen3", trainer.args),
            trainer.tokenizer,
        )
    finally:
        close()
    assert calls == []
    assert (result.initialized_tensors, result.skipped_tensors) == (0, 13)
    # 13 tensors, as in the init line: the tied output.weight = tok_embeddings.weight counts once
    assert trainer.load_lines == [
        f"imported {folder}: 13 model tensors loaded; missing (initialized): none"
    ]
    assert same_logits
    first, second = (
        load_file(folder / "model.safetensors"),
        load_file(tmp_path / "again" / "model.safetensors"),
    )
    assert first.keys() == second.keys() and "lm_head.weight" not in first
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert json.loads((folder / "config.json").read_text()) == json.loads(
        (tmp_path / "again" / "config.json").read_text()
    )


def test_missing_tensors_are_initialized_and_listed(hf_folder, tmp_path):
    tmp, folder, _, _ = hf_folder
    partial = tmp_path / "partial"
    shutil.copytree(folder, partial)
    tensors = load_file(partial / "model.safetensors")
    del tensors["model.norm.weight"], tensors["model.layers.0.self_attn.q_norm.weight"]
    save_file(tensors, partial / "model.safetensors")
    trainer = build(tmp, f"--checkpoint.initial_load_hf={partial}")
    try:
        norm = trainer.model.norm.weight.full_tensor()
        wq = trainer.model.layers["0"].attention.wq.weight.full_tensor()
    finally:
        close()
    assert trainer.load_lines == [
        f"imported {partial}: 11 model tensors loaded; missing (initialized): "
        "layers.0.attention.q_norm.weight, norm.weight"
    ]
    assert (trainer.init_result.initialized_tensors, trainer.init_result.skipped_tensors) == (2, 11)
    assert torch.equal(norm, torch.ones(64))  # the init plan's RMSNorm weight
    assert torch.equal(wq, tensors["model.layers.0.self_attn.q_proj.weight"])


def test_unexpected_tensors_fail_unless_allowed(hf_folder, tmp_path):
    tmp, folder, _, _ = hf_folder
    extra = tmp_path / "extra"
    shutil.copytree(folder, extra)
    tensors = load_file(extra / "model.safetensors")
    tensors["model.layers.7.mlp.up_proj.weight"] = torch.zeros(128, 64)
    save_file(tensors, extra / "model.safetensors")
    with pytest.raises(
        HFError,
        match=r"1 tensors have no place in the model \(model.layers.7.mlp.up_proj.weight\).*"
        r"checkpoint.initial_load_hf_allow_unexpected=true",
    ):
        try:
            build(tmp, f"--checkpoint.initial_load_hf={extra}")
        finally:
            close()
    trainer = build(
        tmp,
        f"--checkpoint.initial_load_hf={extra}",
        "--checkpoint.initial_load_hf_allow_unexpected=true",
    )
    close()
    assert (
        trainer.load_lines[-1] == f"ignored tensors of {extra}: model.layers.7.mlp.up_proj.weight"
    )
    assert trainer.init_result.initialized_tensors == 0


def test_preflight_rejects_an_hf_model_of_another_size(hf_folder, tmp_path):
    tmp, folder, _, _ = hf_folder
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    config = json.loads((other / "config.json").read_text())
    config["intermediate_size"] = 96
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ConfigError,
        match=r"^checkpoint.initial_load_hf: .*config.json has hidden_dim = 96 but "
        r"model.overrides.hidden_dim = 128; drop the override",
    ):
        check_paths(parse_run(argv(tmp, f"--checkpoint.initial_load_hf={other}")))
    with pytest.raises(ConfigError, match=r"^checkpoint.initial_load_hf: no such folder"):
        check_paths(parse_run(argv(tmp, f"--checkpoint.initial_load_hf={tmp_path / 'nowhere'}")))


def test_export_at_the_end_of_training_writes_the_trained_weights(tmp_path):
    text_file(tmp_path, n_plays=1)
    run = parse_run(
        argv(
            tmp_path,
            f"--checkpoint.export_hf={tmp_path / 'export'}",
            "--checkpoint.export_hf_dtype=bfloat16",
            "--training.steps=1",
        )
    )
    trainer = Trainer(run)
    stop = StopRequest()
    try:
        trainer.train(stop)
        embedding = trainer.model.tok_embeddings.weight.full_tensor()
    finally:
        stop.restore()
        close()
    exported = load_file(tmp_path / "export" / "model.safetensors")
    assert exported["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert torch.equal(exported["model.embed_tokens.weight"], embedding.to(torch.bfloat16))
    assert (
        json.loads((tmp_path / "export" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    )
