"""Every family both ways through Hugging Face folders, with nothing but the registry to go on: our
export loads back into this project with bitwise the same logits and into transformers with the same
logits and expert choices; a folder transformers' own ``save_pretrained`` writes from a config that
gives only the sizes (every other field at transformers' default, including the keys its config
class does not write) loads here with transformers' logits and expert choices."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from hf_reference import hf_model, logits_and_choices, ours_from_folder, random_ours

from torchtitan_lite.components.hf.export import export_hf
from torchtitan_lite.data.tokenizer import BUNDLED_TOKENIZER, Tokenizer
from torchtitan_lite.models import get_model_spec, model_names

SIZES = {
    "qwen3": dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    ),
    "qwen3_moe": dict(
        hidden_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=8,
        num_experts_per_tok=2,
    ),
    "gpt_oss": dict(
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=8,
        num_experts_per_tok=2,
    ),
    "deepseek_v3": dict(
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=24,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=8,
        n_group=2,
        topk_group=1,
        num_experts_per_tok=2,
    ),
    "llama3": dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
}
"""Per family the ``config.json`` sizes of a tiny model (vocabulary: :data:`VOCAB`); every other key
is left to transformers."""
VOCAB = 512


def tokens(vocab_size: int) -> torch.Tensor:
    return torch.randint(2, vocab_size, (2, 24), generator=torch.Generator().manual_seed(5))


def assert_same_choices(mine: list[torch.Tensor], theirs: list[torch.Tensor]) -> None:
    assert len(mine) == len(theirs)
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))


def test_every_family_has_sizes():
    assert set(SIZES) == set(model_names())


@pytest.mark.parametrize("family", model_names())
def test_our_export_loads_back_bitwise_and_into_transformers(family, tmp_path):
    args = dataclasses.replace(get_model_spec(family).flavors["debug"], n_layers=2)
    model, adapter = random_ours(family, args, seed=3)
    export_hf(model, str(tmp_path / "export"), adapter, Tokenizer(BUNDLED_TOKENIZER))
    batch = tokens(args.vocab_size)
    logits, choices = logits_and_choices(model, batch)

    again, imported, again_family = ours_from_folder(tmp_path / "export")
    assert again_family == family and imported.missing == [] and imported.unexpected == []
    assert again.args == args
    again_logits, again_choices = logits_and_choices(again, batch)
    assert torch.equal(again_logits, logits)
    assert_same_choices(again_choices, choices)

    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "export", dtype=torch.float32
    ).eval()
    their_logits, their_choices = logits_and_choices(theirs, batch)
    assert (their_logits - logits).abs().max() <= 1e-4
    assert_same_choices(their_choices, choices)


@pytest.mark.parametrize("family", model_names())
def test_a_folder_transformers_saves_from_sizes_alone_loads_here_with_its_logits(family, tmp_path):
    adapter = get_model_spec(family).state_dict_adapter
    reference = hf_model(
        {
            "model_type": adapter.model_type,
            "architectures": [adapter.architecture],
            **SIZES[family],
            "vocab_size": VOCAB,
        }
    )
    reference.save_pretrained(tmp_path / "hf")
    ours, imported, our_family = ours_from_folder(tmp_path / "hf")
    assert our_family == family and imported.missing == [] and imported.unexpected == []
    batch = tokens(VOCAB)
    (logits, choices), (their_logits, their_choices) = (
        logits_and_choices(ours, batch),
        logits_and_choices(reference, batch),
    )
    assert (logits - their_logits).abs().max() <= 1e-4
    assert_same_choices(choices, their_choices)
