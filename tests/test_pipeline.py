"""Pipeline stages in one process: the split into stages, stages built by deleting modules, their
forward chained equal to the whole model's, init, fingerprint and Hugging Face import of stages, the
loss the schedule calls."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from model_helpers import is_moe
from safetensors.torch import save_file
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from torchtitan_lite.components.hf.args import state_dict_adapter
from torchtitan_lite.components.hf.export import hf_tensors
from torchtitan_lite.components.hf.folder import SafetensorsFolder
from torchtitan_lite.components.hf.load import import_hf
from torchtitan_lite.distributed.activation_checkpoint import apply_activation_checkpointing
from torchtitan_lite.distributed.pipeline import (
    PipelineLoss,
    StageModules,
    split_stage,
    stage_layer_ids,
)
from torchtitan_lite.init.apply import init_weights, materialize, named_state_tensors
from torchtitan_lite.init.fingerprint import model_fingerprint
from torchtitan_lite.models import get_model_spec, model_names

SEED = 7


def tiny(family: str = "qwen3", **changes):
    """``(spec, args)`` of a 4-layer untied flavor of ``family``: GQA families at dim 64 (a dense
    one with SwiGLU width 128), MLA (DeepSeek-V3) at its debug dimensions."""
    spec = get_model_spec(family)
    base = spec.flavors["debug_untied" if "debug_untied" in spec.flavors else "debug"]
    sizes = (
        dict(dim=64, n_heads=4, n_kv_heads=2, head_dim=16) if hasattr(base, "n_kv_heads") else {}
    )
    if sizes and not is_moe(family):
        sizes["hidden_dim"] = 128
    return spec, replace(base, n_layers=4, max_seq_len=64, **{**sizes, **changes})


def built(spec, args, *, device: str = "meta"):
    with torch.device("meta"):
        model = spec.model_cls(args)
    if device != "meta":
        materialize(model, device)
        init_weights(model, spec.init_plan(args), SEED)
    return model


@pytest.mark.parametrize(
    "n_layers, pp, schedule, extra, expected",
    [
        (4, 2, "1F1B", {}, [[0, 1], [2, 3]]),
        (5, 2, "GPipe", {}, [[0, 1, 2], [3, 4]]),
        (4, 2, "Interleaved1F1B", {}, [[0], [1], [2], [3]]),
        (6, 2, "1F1B", {"layers_per_stage": 3}, [[0, 1, 2], [3, 4, 5]]),
        (7, 2, "Interleaved1F1B", {"layers_per_stage": 2}, [[0, 1], [2, 3], [4, 5], [6]]),
        (4, 2, "GPipe", {"split_points": [1]}, [[0], [1, 2, 3]]),
    ],
)
def test_stage_layer_ids_split_evenly_or_where_told(n_layers, pp, schedule, extra, expected):
    assert stage_layer_ids(n_layers, pp, schedule, n_microbatches=4, **extra) == expected


@pytest.mark.parametrize(
    "schedule, extra, message",
    [
        (
            "GPipe",
            {"split_points": [1, 2]},
            "3 pipeline stages of the 4-layer model are not a multiple of "
            "pipeline_parallel_degree 2",
        ),
        (
            "Interleaved1F1B",
            {"n_microbatches": 5},
            "divisible by max(1, micro-batches // pipeline_parallel_degree) = 2, got 5",
        ),
        ("1F1B", {"split_points": [2], "layers_per_stage": 2}, "not both"),
        (
            "Interleaved1F1B",
            {"layers_per_stage": 2},
            "Interleaved1F1B runs several stages per rank but 2 stages on 2 ranks are one per rank",
        ),
    ],
)
def test_stage_layer_ids_refuse_what_the_schedule_cannot_run(schedule, extra, message):
    kwargs = {"n_microbatches": 4, **extra}
    with pytest.raises(ValueError) as err:
        stage_layer_ids(4, 2, schedule, **kwargs)
    assert message in str(err.value)


def test_stages_are_the_model_without_what_they_do_not_own():
    spec, args = tiny()
    model = built(spec, args)
    first = split_stage(model, [0, 1], first=True, last=False)
    last = split_stage(model, [2, 3], first=False, last=True)
    assert (first.norm, first.output, last.tok_embeddings) == (None, None, None)
    assert list(first.layers) == ["0", "1"] and list(last.layers) == ["2", "3"]
    names = [n for n, _ in named_state_tensors(model)]
    assert [n for part in (first, last) for n, _ in named_state_tensors(part)] == names, (
        "a partition, same names"
    )
    assert first.rope_cos.shape == last.rope_cos.shape == model.rope_cos.shape, (
        "RoPE tables on every stage"
    )


def test_a_tied_model_cannot_be_split():
    spec, args = tiny(tie_embeddings=True)
    with pytest.raises(ValueError, match="a tied model .* cannot be split into pipeline stages"):
        split_stage(built(spec, args), [0, 1], first=True, last=False)


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_chained_stages_compute_the_whole_model_bitwise(family):
    spec, args = tiny(family)
    model = built(spec, args, device="cpu")
    stages = [
        split_stage(model, ids, first=i == 0, last=i == 2)
        for i, ids in enumerate([[0], [1, 2], [3]])
    ]
    tokens = torch.randint(0, args.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    h = tokens
    for stage in stages:
        h = stage(h)
    assert torch.equal(h, model(tokens))
    with pytest.raises(ValueError, match="expected hidden states"):
        stages[1](tokens)


def test_stages_initialize_their_own_tensors_as_the_whole_model_and_fingerprints_add_up():
    """Qwen3-MoE: the stages hold plain buffers (expert counters, expert biases) of their own
    layers."""
    spec, args = tiny("qwen3_moe")
    whole = built(spec, args, device="cpu")
    meta = built(spec, args)
    parts = [
        materialize(split_stage(meta, ids, first=i == 0, last=i == 1), "cpu")
        for i, ids in enumerate([[0, 1], [2, 3]])
    ]
    ranks = [StageModules([part]) for part in parts]
    with pytest.raises(ValueError, match="match no parameter or persistent buffer"):
        init_weights(ranks[1], spec.init_plan(args), SEED)
    results = [init_weights(rank, spec.init_plan(args), SEED, partial=True) for rank in ranks]
    assert sum(r.initialized_tensors for r in results) == len(dict(named_state_tensors(whole)))
    reference = dict(named_state_tensors(whole))
    for rank in ranks:
        for name, tensor in named_state_tensors(rank):
            assert torch.equal(tensor, reference[name]), name
    assert torch.equal(parts[1].rope_cos, whole.rope_cos), "init_buffers reaches every stage"
    assert any(name.endswith("expert_bias") for name, _ in named_state_tensors(ranks[1]))
    total = sum(int(model_fingerprint(rank), 16) for rank in ranks) % 2**64
    assert f"{total:016x}" == model_fingerprint(whole), (
        "the stages' elements make up the whole model's"
    )


def test_selective_checkpointing_counts_layer_ids_on_a_later_stage():
    spec, args = tiny()
    stage = split_stage(built(spec, args), [1, 2, 3], first=False, last=True)
    apply_activation_checkpointing(stage, "selective", "2")
    wrapped = [key for key, block in stage.layers.items() if isinstance(block, CheckpointWrapper)]
    assert wrapped == ["1", "3"], "every 2nd layer of the whole model: ids 1 and 3"


def test_pipeline_loss_records_the_summed_cross_entropy_and_returns_it_scaled():
    loss = PipelineLoss(lambda logits, labels: (logits - labels).square().sum())
    loss.reset(scale=0.25)
    outs = [loss(torch.full((2,), float(v)), torch.zeros(2)) for v in (1, 2)]
    assert [o.item() for o in outs] == [0.5, 2.0]
    assert loss.total.item() == 10.0
    loss.reset(scale=1.0)
    assert loss.total == 0.0


def test_hf_import_into_a_later_stage_loads_its_tensors_and_skips_the_other_stages(tmp_path):
    spec, args = tiny()
    whole = built(spec, args, device="cpu")
    adapter = state_dict_adapter("qwen3", args)
    tensors = dict(named_state_tensors(whole))
    save_file(
        hf_tensors(tensors, adapter, torch.float32, set()), str(tmp_path / "model.safetensors")
    )
    stage = StageModules(
        [materialize(split_stage(built(spec, args), [2, 3], first=False, last=True), "cpu")]
    )
    here = dict(named_state_tensors(stage))
    imported = import_hf(stage, SafetensorsFolder(str(tmp_path)), adapter)
    assert imported.loaded == sorted(here) and imported.missing == [] and imported.unexpected == []
    assert all(torch.equal(here[name], tensors[name]) for name in here)


@pytest.mark.parametrize("family", model_names())
def test_a_later_stage_returns_hidden_states_in_the_compute_dtype(family):
    """The stages' static metadata (hidden states in the compute dtype, ``pipeline.py``): a bf16
    stage keeps bf16."""
    spec, args = tiny(family)
    stage = split_stage(built(spec, args, device="cpu"), [1, 2], first=False, last=False).to(
        torch.bfloat16
    )
    stage.init_buffers("cpu")  # RoPE tables stay fp32
    hidden = torch.randn(2, 16, args.dim, dtype=torch.bfloat16)
    out = stage(hidden)
    assert out.dtype == torch.bfloat16 and out.shape == hidden.shape
