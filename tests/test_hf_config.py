"""config.json -> model args: the published files give our flavors, transformers' defaults fill what
a config leaves out, transformers 5's way of writing a config reads the same, every field we do not
implement is refused by name, and ``--checkpoint.initial_load_hf=DIR`` alone picks the family and
the sizes (a flavor or override that disagrees is a config error naming the field and both
values)."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
from pathlib import Path

import pytest
import transformers
from dist_helpers import REPO
from hf_published import PUBLISHED, scaled

from torchtitan_lite.components.hf.quant import Quantization, quantization
from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.models import get_model_spec, model_names
from torchtitan_lite.preflight.checks import parse_args
from torchtitan_lite.preflight.model_args import build_model_args
from torchtitan_lite.protocols.state_dict_adapter import HFConfigError

CONFIG_CLASSES = {
    name: type(
        transformers.AutoConfig.for_model(get_model_spec(name).state_dict_adapter.model_type)
    )
    for name in model_names()
}
"""Our family -> the transformers config class of its adapter's ``model_type``."""


def args_of(config: dict, family: str):
    spec = get_model_spec(family)
    return dataclasses.replace(
        spec.flavors["debug"], **spec.state_dict_adapter.args_from_hf_config(config)
    )


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_each_published_config_json_gives_our_flavor_of_that_checkpoint(name):
    config, family, flavor = PUBLISHED[name]
    assert args_of(config, family) == get_model_spec(family).flavors[flavor]


def test_every_family_has_a_published_config_and_the_published_configs_cover_every_family():
    assert {family for _, family, _ in PUBLISHED.values()} == set(model_names())


@pytest.mark.parametrize("family", list(CONFIG_CLASSES))
def test_defaults_for_missing_keys_are_those_of_the_transformers_config_class(family):
    """A ``None`` in our table is the class's declared default that its ``__post_init__`` derives
    (Llama's head counts and ``head_dim``; ``models/common/hf_attention.py`` derives them the same
    way)."""
    module = importlib.import_module(f"torchtitan_lite.models.{family}.state_dict_adapter")
    declared = {f.name: f.default for f in dataclasses.fields(CONFIG_CLASSES[family])}
    reference = CONFIG_CLASSES[family]()
    assert {
        k: declared[k] if v is None else getattr(reference, k)
        for k, v in module.HF_DEFAULTS.items()
    } == (module.HF_DEFAULTS)
    default_theta = getattr(
        module, "DEFAULT_THETA", 10000.0
    )  # the Qwen3 and Llama families: the common one
    assert reference.rope_parameters["rope_theta"] == default_theta
    if family == "gpt_oss":
        assert {
            k: v for k, v in reference.rope_parameters.items() if k != "rope_theta"
        } == module.DEFAULT_ROPE


def test_a_config_without_optional_keys_takes_transformers_defaults():
    config = {
        k: v
        for k, v in PUBLISHED["Qwen3-30B-A3B"][0].items()
        if k not in ("norm_topk_prob", "rope_theta", "head_dim", "rope_scaling")
    }
    args = args_of(config, "qwen3_moe")
    assert (args.route_norm, args.rope_theta, args.head_dim) == (False, 10000.0, 2048 // 32)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_a_config_written_by_transformers_5_reads_as_the_published_one(name, tmp_path):
    config, family, _ = copy.deepcopy(scaled(name)), PUBLISHED[name][1], None
    written = CONFIG_CLASSES[family](**{k: v for k, v in config.items() if k != "model_type"})
    written.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "rope_parameters" in saved and "rope_scaling" not in saved
    assert args_of(saved, family) == args_of(config, family)


REFUSED = [
    (
        "Qwen3-0.6B",
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
        r"rope_scaling.rope_type = 'linear' is not supported by the qwen3 model",
    ),
    ("Qwen3-0.6B", {"use_sliding_window": True}, r"use_sliding_window = True is not supported"),
    ("Qwen3-0.6B", {"attention_bias": True}, r"attention_bias = True is not supported"),
    ("Qwen3-0.6B", {"hidden_act": "gelu"}, r"hidden_act = 'gelu' is not supported"),
    (
        "Qwen3-0.6B",
        {"layer_types": ["sliding_attention"] * 28},
        r"layer_types = .* is not all 'full_attention'",
    ),
    (
        "Qwen3-0.6B",
        {"partial_rotary_factor": 0.5},
        r"partial_rotary_factor = 0.5 is not implemented by the qwen3 "
        r"model and is not known to change nothing",
    ),
    ("Qwen3-30B-A3B", {"mlp_only_layers": [0]}, r"mlp_only_layers = \[0\] is not supported"),
    ("Qwen3-30B-A3B", {"decoder_sparse_step": 2}, r"decoder_sparse_step = 2 is not supported"),
    (
        "Qwen3-30B-A3B",
        {"num_local_experts": 64},
        r"num_experts = 128 differs from num_local_experts = 64",
    ),
    (
        "gpt-oss-20b",
        {"rope_scaling": {**PUBLISHED["gpt-oss-20b"][0]["rope_scaling"], "truncate": True}},
        r"rope_scaling.truncate = True is not supported",
    ),
    (
        "gpt-oss-20b",
        {"rope_scaling": {**PUBLISHED["gpt-oss-20b"][0]["rope_scaling"], "attention_factor": 1.0}},
        r"rope_scaling.attention_factor = 1.0 is not implemented",
    ),
    (
        "gpt-oss-20b",
        {"layer_types": ["full_attention"] * 24},
        r"layer_types = .* is not sliding_attention on even",
    ),
    (
        "gpt-oss-20b",
        {"experts_per_token": 2},
        r"experts_per_token = 2 differs from num_experts_per_tok = 4",
    ),
    ("gpt-oss-20b", {"attention_bias": False}, r"attention_bias = False is not supported"),
    (
        "DeepSeek-V3",
        {"rope_scaling": {**PUBLISHED["DeepSeek-V3"][0]["rope_scaling"], "mscale": 0.707}},
        r"rope_scaling.mscale = 0.707 with mscale_all_dim = 1.0",
    ),
    (
        "DeepSeek-V3",
        {"max_position_embeddings": 4096},
        r"original_max_position_embeddings = 4096 is not below max_position_embeddings = 4096",
    ),
    (
        "DeepSeek-V3",
        {"topk_method": "group_limited_greedy"},
        r"topk_method = 'group_limited_greedy' is not supported",
    ),
    ("DeepSeek-V3", {"scoring_func": "softmax"}, r"scoring_func = 'softmax' is not supported"),
    ("DeepSeek-V3", {"moe_layer_freq": 2}, r"moe_layer_freq = 2 is not supported"),
    (
        "DeepSeek-V3",
        {"num_key_value_heads": 8},
        r"num_key_value_heads = 8 differs from num_attention_heads = 128",
    ),
    (
        "Moonlight-16B-A3B",
        {
            "rope_scaling": {"type": "yarn", "factor": 4.0},
            "rope_parameters": {"rope_type": "default"},
        },
        r"rope_scaling = \{'type': 'yarn', 'factor': 4.0\} differs from rope_parameters",
    ),
    (
        "Llama-3.1-8B",
        {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
        r"rope_scaling.rope_type = 'dynamic' is not supported by the llama3 model",
    ),
    (
        "Llama-3.1-8B",
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
        r"config.json has no rope_scaling.low_freq_factor",
    ),
    ("Llama-3.1-8B", {"mlp_bias": True}, r"mlp_bias = True is not supported"),
    ("Llama-3.1-8B", {"attention_bias": True}, r"attention_bias = True is not supported"),
    (
        "Llama-3.2-1B",
        {"partial_rotary_factor": 0.5},
        r"partial_rotary_factor = 0.5 is not implemented by the llama3",
    ),
]


@pytest.mark.parametrize("name, change, message", REFUSED)
def test_a_field_the_model_does_not_implement_is_refused_by_name(name, change, message):
    config, family, _ = PUBLISHED[name]
    with pytest.raises(HFConfigError, match=message):
        args_of({**config, **change}, family)


def hf_folder(tmp_path: Path, name: str, **changes) -> Path:
    """A folder with the scaled config.json of ``name`` (no weights: parsing reads only the
    config)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**scaled(name), **changes}))
    return folder


def test_initial_load_hf_alone_picks_the_family_and_every_size(tmp_path):
    folder = hf_folder(tmp_path, "Qwen3-30B-A3B")
    config = parse_args([f"--checkpoint.initial_load_hf={folder}"])
    assert (config.model.name, config.model.flavor) == ("qwen3_moe", "hf")
    assert build_model_args(config) == args_of(scaled("Qwen3-30B-A3B"), "qwen3_moe")
    from_file = parse_args(
        [
            "--job.config_file",
            str(REPO / "train_configs" / "qwen3_debug.toml"),
            f"--checkpoint.initial_load_hf={folder}",
        ]
    )  # the file's model yields to the folder
    assert (from_file.model.name, from_file.model.flavor) == ("qwen3_moe", "hf")
    free = parse_args(
        [
            f"--checkpoint.initial_load_hf={folder}",
            "--model.overrides.max_seq_len=512",
            "--model.overrides.aux_loss_coeff=0.0",
        ]
    )
    assert (build_model_args(free).max_seq_len, build_model_args(free).aux_loss_coeff) == (512, 0.0)


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--model.flavor=debug"],
            r"^checkpoint.initial_load_hf: .*config.json has dim = 64 but model.flavor 'debug' has "
            r"256; drop model.flavor",
        ),
        (
            ["--model.name=qwen3"],
            r"^model.name \(command line\): 'qwen3' but checkpoint.initial_load_hf .* holds a "
            r"qwen3_moe model",
        ),
        (
            ["--model.overrides.top_k=2"],
            r"^checkpoint.initial_load_hf: .*config.json has top_k = 8 but "
            r"model.overrides.top_k = 2; drop the override",
        ),
    ],
)
def test_a_flavor_name_or_override_that_disagrees_with_the_folder_is_a_config_error(
    tmp_path, extra, message
):
    folder = hf_folder(tmp_path, "Qwen3-30B-A3B")
    with pytest.raises(ConfigError, match=message):
        parse_args([f"--checkpoint.initial_load_hf={folder}", *extra])


def test_deepseek_max_seq_len_is_not_free_because_it_switches_yarn(tmp_path):
    folder = hf_folder(tmp_path, "DeepSeek-V3")
    with pytest.raises(
        ConfigError, match=r"max_seq_len = 163840 but model.overrides.max_seq_len = 4096"
    ):
        parse_args([f"--checkpoint.initial_load_hf={folder}", "--model.overrides.max_seq_len=4096"])
    assert build_model_args(parse_args([f"--checkpoint.initial_load_hf={folder}"])).uses_yarn


def test_the_published_quantizations_are_the_ones_the_loader_dequantizes():
    assert quantization(PUBLISHED["gpt-oss-20b"][0]) == Quantization("mxfp4")
    assert quantization(PUBLISHED["DeepSeek-V3"][0]) == Quantization("fp8", (128, 128))
    assert quantization(PUBLISHED["Moonlight-16B-A3B"][0]) is None
