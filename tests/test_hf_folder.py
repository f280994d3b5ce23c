"""HF folders as published: MXFP4 and FP8 checkpoints dequantize as transformers does and import to
the logits of the dequantized reference; sharded files with an index; bad folders stop before any
work with one line naming the problem (exit 2, nothing written); the export carries a tokenizer
AutoTokenizer loads, the special ids and the umask's file mode; a family without an adapter cannot
start an exporting run."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil

import pytest
import torch
import transformers
from dist_helpers import run_train
from hf_published import PUBLISHED, SCALED_VOCAB, scaled
from hf_reference import hf_model, logits_and_choices, ours_from_folder, random_ours
from safetensors.torch import load_file, save_file
from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

import torchtitan_lite.components.hf.checks as hf_checks
from torchtitan_lite.components.hf.export import export_hf
from torchtitan_lite.components.hf.load import load_hf_folder, open_folder
from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.data.tokenizer import Tokenizer
from torchtitan_lite.init.apply import materialize
from torchtitan_lite.models import get_model_spec, model_names
from torchtitan_lite.preflight.checks import check_paths, load_run_or_exit, parse_run


def saved(tmp_path, name: str, seed: int = 0):
    """The scaled transformers model of ``name`` and its saved folder."""
    model = hf_model(scaled(name), seed)
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name


def rewrite(folder, config_changes: dict, tensors: dict) -> None:
    """Replace the folder's weights by ``tensors`` and update its config.json."""
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **config_changes}))


def test_mxfp4_experts_dequantize_like_transformers_and_import_to_the_reference_logits(tmp_path):
    model, folder = saved(tmp_path, "gpt-oss-20b")
    tensors = load_file(folder / "model.safetensors")
    gen = torch.Generator().manual_seed(3)
    for name in [
        n for n in tensors if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj")
    ]:
        experts, cols, rows = tensors.pop(
            name
        ).shape  # HF parameter (E, in, out); MXFP4 stores (E, out, in / 32, 16)
        blocks = torch.randint(
            0, 256, (experts, rows, cols // 32, 16), generator=gen, dtype=torch.uint8
        )
        scales = torch.randint(
            121, 126, (experts, rows, cols // 32), generator=gen, dtype=torch.uint8
        )
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
        dequantized = convert_moe_packed_tensors(
            blocks, scales, dtype=torch.float32
        )  # transformers' reference
        model.get_parameter(name).data.copy_(dequantized)
    rewrite(
        folder,
        {"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}},
        tensors,
    )
    _, reader = open_folder(str(folder))
    name = "model.layers.1.mlp.experts.gate_up_proj"
    box = ((2, 5), (7, 41), (3, 60))  # cuts through scale blocks in the input dimension
    assert torch.equal(reader.read(name, box), model.get_parameter(name)[2:5, 7:41, 3:60])
    ours, imported, _ = ours_from_folder(folder)
    tokens = torch.randint(2, SCALED_VOCAB, (1, 20), generator=gen)
    (mine, my_choices), (theirs, their_choices) = (
        logits_and_choices(ours, tokens),
        logits_and_choices(model, tokens),
    )
    assert (mine - theirs).abs().max() <= 1e-4 and all(map(torch.equal, my_choices, their_choices))


def quantize_fp8(weight: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-wise e4m3 quantization: ``(fp8 weight, scale_inv)`` with each block's max mapped to
    448."""
    rows, cols = weight.shape
    grid = (-(-rows // block), -(-cols // block))
    scale = torch.zeros(grid)
    for i in range(grid[0]):
        for j in range(grid[1]):
            scale[i, j] = (
                weight[i * block : (i + 1) * block, j * block : (j + 1) * block].abs().max() / 448
            )
    expanded = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]
    return (weight / expanded).to(torch.float8_e4m3fn), scale


def test_fp8_blocks_dequantize_like_transformers_and_import_to_the_reference_logits(tmp_path):
    _, folder = saved(tmp_path, "DeepSeek-V3")
    reference = tmp_path / "dequantized"
    shutil.copytree(folder, reference)
    tensors, dequantized = load_file(folder / "model.safetensors"), {}
    block = 16
    for name in [n for n in tensors if n.endswith("proj.weight") and tensors[n].dim() == 2]:
        quantized, scale_inv = quantize_fp8(tensors[name], block)
        tensors[name], tensors[f"{name}_scale_inv"] = quantized, scale_inv
        dequantized[name] = _dequantize_fp8_weight(
            quantized, scale_inv, [block, block], torch.float32
        )  # transformers'
    rewrite(
        folder,
        {
            "quantization_config": {
                "activation_scheme": "dynamic",
                "fmt": "e4m3",
                "quant_method": "fp8",
                "weight_block_size": [block, block],
            }
        },
        tensors,
    )
    rewrite(reference, {}, {**load_file(reference / "model.safetensors"), **dequantized})
    model = transformers.AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32).eval()
    _, reader = open_folder(str(folder))
    name = "model.layers.3.mlp.experts.5.gate_proj.weight"
    assert torch.equal(reader.read(name, ((3, 13), (10, 50))), dequantized[name][3:13, 10:50])
    ours, imported, _ = ours_from_folder(folder)
    assert imported.unexpected == [] and imported.missing == []
    tokens = torch.randint(2, SCALED_VOCAB, (1, 20), generator=torch.Generator().manual_seed(4))
    (mine, my_choices), (theirs, their_choices) = (
        logits_and_choices(ours, tokens),
        logits_and_choices(model, tokens),
    )
    assert (mine - theirs).abs().max() <= 1e-4 and all(map(torch.equal, my_choices, their_choices))


def our_model(name: str):
    """Our model of the scaled ``name`` architecture with random weights, and its adapter."""
    spec = get_model_spec(PUBLISHED[name][1])
    args = dataclasses.replace(
        spec.flavors["debug"], **spec.state_dict_adapter.args_from_hf_config(scaled(name))
    )
    return random_ours(PUBLISHED[name][1], args)


def test_export_carries_tokenizer_special_ids_umask_mode_and_shards_with_an_index(
    tmp_path, tokenizer_file
):
    model, adapter = our_model("Qwen3-30B-A3B")
    tokenizer = Tokenizer(tokenizer_file)
    export_hf(model, str(tmp_path / "out"), adapter, tokenizer, max_shard_bytes=2**18)
    files = sorted(os.listdir(tmp_path / "out"))
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) > 1 and "model.safetensors.index.json" in files
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(
        files
    ) and "model.safetensors.tmp" not in files
    mask = os.umask(0)
    os.umask(mask)
    assert {oct(os.stat(tmp_path / "out" / f).st_mode & 0o777) for f in files} == {
        oct(0o666 & ~mask)
    }
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (tokenizer.eos_id, tokenizer.eos_id)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert loaded.encode("KING HENRY: Once more unto the breach") == tokenizer.encode(
        "KING HENRY: Once more unto the breach"
    )
    assert loaded.eos_token_id == tokenizer.eos_id
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", dtype=torch.float32
    ).eval()
    tokens = torch.randint(2, SCALED_VOCAB, (1, 16), generator=torch.Generator().manual_seed(6))
    assert (
        logits_and_choices(model, tokens)[0] - logits_and_choices(theirs, tokens)[0]
    ).abs().max() <= 1e-4
    our_again, imported, _ = ours_from_folder(tmp_path / "out")  # our import reads the index too
    assert torch.equal(
        logits_and_choices(our_again, tokens)[0], logits_and_choices(model, tokens)[0]
    )


def test_export_of_a_run_from_an_hf_folder_keeps_its_tokenizer_files_and_ids(
    tmp_path, tokenizer_file
):
    _, source = saved(tmp_path, "Qwen3-0.6B")
    shutil.copy(tokenizer_file, source / "tokenizer.json")
    (source / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|endoftext|>",
                "pad_token": "<|pad|>",
            }
        )
    )
    model, adapter = our_model("Qwen3-0.6B")
    export_hf(
        model,
        str(tmp_path / "out"),
        adapter,
        Tokenizer(source / "tokenizer.json"),
        source_folder=str(source),
    )
    assert (tmp_path / "out" / "tokenizer_config.json").read_bytes() == (
        source / "tokenizer_config.json"
    ).read_bytes()
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], "pad_token_id" in config) == (
        0,
        0,
        False,
    )  # as the source


def bad_folders(tmp_path, tokenizer_file) -> dict[str, tuple[object, str]]:
    """name -> (folder, the message its preflight must give); each folder has a fitting
    tokenizer.json."""
    _, good = saved(tmp_path, "Qwen3-0.6B")
    shutil.copy(tokenizer_file, good / "tokenizer.json")
    cases = {}

    def copy(label: str):
        folder = tmp_path / label
        shutil.copytree(good, folder)
        return folder

    folder = copy("no_config")
    os.remove(folder / "config.json")
    cases["no_config"] = (folder, r"has no config.json")
    folder = copy("mistral")
    rewrite(
        folder,
        {"model_type": "mistral", "architectures": ["MistralForCausalLM"]},
        load_file(good / "model.safetensors"),
    )
    known = ", ".join(get_model_spec(name).state_dict_adapter.model_type for name in model_names())
    cases["mistral"] = (folder, rf"model_type 'mistral' .* known model types: {known}$")
    folder = copy("index")
    tensors = load_file(good / "model.safetensors")
    os.remove(folder / "model.safetensors")
    save_file(tensors, folder / "model-00001-of-00002.safetensors")
    weight_map = {n: "model-00001-of-00002.safetensors" for n in tensors}
    weight_map["model.norm.weight"] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    cases["index"] = (
        folder,
        r"index.json puts model.norm.weight in model-00002-of-00002.safetensors, which .* does "
        r"not hold",
    )
    folder = copy("shape")
    tensors = load_file(good / "model.safetensors")
    tensors["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(16, 64)
    save_file(tensors, folder / "model.safetensors")
    cases["shape"] = (
        folder,
        r"model.layers.1.self_attn.k_proj.weight has shape \(16, 64\) but "
        r"layers.1.attention.wk.weight needs \(32, 64\)",
    )
    folder = copy("field")
    rewrite(
        folder,
        {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}},
        load_file(good / "model.safetensors"),
    )
    cases["field"] = (
        folder,
        r"config.json: rope_parameters.rope_type = 'dynamic' is not supported by the qwen3 model",
    )
    folder = copy("quant")
    rewrite(
        folder,
        {"quantization_config": {"quant_method": "gptq", "bits": 4}},
        load_file(good / "model.safetensors"),
    )
    cases["quant"] = (folder, r"quantization_config.quant_method = 'gptq'")
    return cases


def test_bad_folders_stop_the_run_with_one_line_and_exit_2_before_anything_is_written(
    tmp_path, capsys, tokenizer_file
):
    cases = bad_folders(tmp_path, tokenizer_file)
    capsys.readouterr()
    for label, (folder, message) in cases.items():
        out = tmp_path / f"out_{label}"
        with pytest.raises(SystemExit) as stopped:
            load_run_or_exit(
                [
                    f"--checkpoint.initial_load_hf={folder}",
                    f"--job.dump_folder={out}",
                    f"--checkpoint.export_hf={out / 'hf'}",
                ]
            )
        err = capsys.readouterr().err.strip().splitlines()
        assert (
            stopped.value.code == 2
            and len(err) == 1
            and err[0].startswith("config error: checkpoint.initial_load_hf")
        )
        assert re.search(message, err[0]), (label, err[0])
        assert not out.exists()


def test_run_train_exits_2_on_a_tensor_of_the_wrong_shape_and_writes_nothing(
    tmp_path, tokenizer_file
):
    folder, _ = bad_folders(tmp_path, tokenizer_file)["shape"]
    proc = run_train(
        [f"--checkpoint.initial_load_hf={folder}", f"--job.dump_folder={tmp_path / 'o'}"]
    )
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "k_proj.weight has shape (16, 64)" in proc.stderr and not (tmp_path / "o").exists()


def test_the_generate_cli_exits_2_with_one_line_on_a_bad_folder(tmp_path, capsys, tokenizer_file):
    from torchtitan_lite import generate

    folder, _ = bad_folders(tmp_path, tokenizer_file)["index"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        generate.main(["--prompt", "hi", f"--checkpoint.initial_load_hf={folder}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(err) == 1 and "does not hold" in err[0]


def test_export_is_refused_before_step_1_for_a_family_without_an_adapter(tmp_path, monkeypatch):
    spec = get_model_spec("qwen3")
    monkeypatch.setattr(
        hf_checks, "get_model_spec", lambda name: dataclasses.replace(spec, state_dict_adapter=None)
    )
    with pytest.raises(
        ConfigError,
        match=r"^checkpoint.export_hf: model qwen3 has no Hugging Face state-dict adapter",
    ):
        check_paths(
            parse_run(
                [f"--checkpoint.export_hf={tmp_path / 'hf'}", f"--job.dump_folder={tmp_path}"]
            )
        )


def test_a_pipeline_stage_imports_only_the_layers_it_holds(tmp_path):
    _, folder = saved(tmp_path, "Qwen3-30B-A3B")
    plain, _, _ = ours_from_folder(folder)
    family, args = "qwen3_moe", plain.args
    with torch.device("meta"):
        stage = get_model_spec(family).model_cls(args)
    del stage.layers["1"]  # what a pipeline stage that owns layer 0 keeps
    materialize(stage, "cpu")
    imported = load_hf_folder(stage, str(folder), family, args)
    assert (imported.missing, imported.unexpected) == ([], [])
    assert not any(name.startswith("layers.1.") for name in imported.loaded)
    assert all(torch.equal(t, plain.get_parameter(n)) for n, t in stage.named_parameters())


def test_mtp_layers_and_a_tied_copy_of_the_head_are_skipped_and_listed(tmp_path):
    _, deepseek = saved(
        tmp_path, "DeepSeek-V3"
    )  # 4 layers; the published num_nextn_predict_layers is 1
    tensors = load_file(deepseek / "model.safetensors")
    rewrite(
        deepseek,
        {},
        {
            **tensors,
            "model.layers.4.eh_proj.weight": torch.zeros(64, 128),
            "model.layers.4.enorm.weight": torch.ones(64),
        },
    )
    _, imported, _ = ours_from_folder(deepseek)
    assert imported.unexpected == [] and sorted(imported.skipped) == [
        "model.layers.4.eh_proj.weight",
        "model.layers.4.enorm.weight",
    ]
    assert imported.describe("D")[1] == (
        "skipped 2 tensors of D (model.layers.4.eh_proj.weight, ...): "
        "multi-token-prediction layer (num_nextn_predict_layers 1) beyond the "
        "model's mtp_num_layers 0: set --model.overrides.mtp_num_layers=1 to train it"
    )
    _, qwen = saved(tmp_path, "Qwen3-0.6B")  # tied
    tensors = load_file(qwen / "model.safetensors")
    rewrite(
        qwen,
        {},
        {**tensors, "lm_head.weight": torch.zeros_like(tensors["model.embed_tokens.weight"])},
    )
    model, imported, _ = ours_from_folder(qwen)
    assert imported.skipped == {
        "lm_head.weight": "tie_word_embeddings: the output projection is the embedding"
    }
    assert torch.equal(model.output.weight, tensors["model.embed_tokens.weight"])
