"""The transformers side of the HF tests: reference models from a config dict with random weights at
a scale where every path matters, our model from an HF folder, and the expert choices of either."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import transformers
from torch import nn

from scripts.train_tokenizer import train_tokenizer
from torchtitan_lite.components.hf.args import HF_FLAVOR, folder_family, model_args_from_hf
from torchtitan_lite.components.hf.load import load_hf_folder
from torchtitan_lite.data.corpus import shakespeare_plays
from torchtitan_lite.init.apply import init_weights, materialize, named_state_tensors
from torchtitan_lite.models import get_model_spec


def noise_for(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Random values for a tensor named ``name`` (HF or ours): norm weights ``1 + 0.2 N``, biases,
    attention sinks and expert-score biases ``0.3 N`` (they move the softmax and the expert choice),
    embeddings ``N``, weight matrices ``N / sqrt(fan-in)`` (the last dimension), so activations stay
    of order 1 through every layer."""
    noise = torch.randn(shape, generator=gen)
    if "norm" in name:
        return 1 + 0.2 * noise
    if name.endswith("bias") or "sinks" in name or "expert_bias" in name:
        return 0.3 * noise
    if "embed" in name:
        return noise
    return noise / math.sqrt(shape[-1])


@torch.no_grad()
def hf_model(config: dict, seed: int = 0) -> nn.Module:
    """``config["architectures"][0]`` of transformers built from ``config`` with :func:`noise_for`
    values (the expert-score correction bias included), fp32, eval mode."""
    config = dict(config)
    hf_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    model = getattr(transformers, config["architectures"][0])(hf_config).float().eval()
    gen = torch.Generator().manual_seed(seed)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if "inv_freq" not in name:
            tensor.copy_(noise_for(name, tuple(tensor.shape), gen))
    return model


@torch.no_grad()
def randomize_ours(model: nn.Module, adapter, seed: int = 0) -> None:
    """:func:`noise_for` values in every tensor the adapter exports; state it does not (counters,
    Qwen3-MoE's unused expert bias) zero."""
    gen = torch.Generator().manual_seed(seed)
    for name, tensor in named_state_tensors(model):
        tensor.copy_(
            noise_for(name, tuple(tensor.shape), gen)
            if name in adapter.tensors
            else torch.zeros_like(tensor)
        )


def random_ours(family: str, args, seed: int = 0) -> tuple[nn.Module, object]:
    """``(model, adapter)``: our ``family`` model of ``args`` built on meta, materialized on CPU
    with its RoPE tables and :func:`randomize_ours` values (``seed``), eval mode; and its state-dict
    adapter."""
    spec = get_model_spec(family)
    with torch.device("meta"):
        model = spec.model_cls(args)
    materialize(model, "cpu")
    model.init_buffers("cpu")
    adapter = spec.state_dict_adapter(args)
    randomize_ours(model, adapter, seed=seed)
    return model.eval(), adapter


def ours_from_folder(folder: str | Path) -> tuple[nn.Module, object, str]:
    """``(model, import result, family)``: our model built from the folder's ``config.json`` alone,
    the folder imported, the rest initialized by the plan (seed 0), eval mode on CPU."""
    family, _ = folder_family(str(folder))
    args = model_args_from_hf(str(folder), family, HF_FLAVOR, {})
    spec = get_model_spec(family)
    with torch.device("meta"):
        model = spec.model_cls(args)
    materialize(model, "cpu")
    imported = load_hf_folder(model, str(folder), family, args)
    init_weights(model, spec.init_plan(args), 0, skip=imported.loaded, buffer_device="cpu")
    return model.eval(), imported, family


@torch.no_grad()
def logits_and_choices(
    model: nn.Module, tokens: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The logits of ``tokens`` and, per MoE layer in order, the experts each token chose, sorted
    ``(T, k)``: transformers' routers return ``(logits, weights, indices)``, ours a
    ``RouterOutput``."""
    choices, hooks = [], []
    for module in model.modules():
        if "router" in type(module).__name__.lower():
            hooks.append(
                module.register_forward_hook(
                    lambda _m, _i, out: choices.append(
                        (out.indices if hasattr(out, "indices") else out[2]).sort(-1).values
                    )
                )
            )
    try:
        out = model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return (out.logits if hasattr(out, "logits") else out), choices


def small_tokenizer(path: Path, vocab_size: int) -> Path:
    """A byte-level BPE of ``vocab_size`` ids (``<|endoftext|>`` 0, ``<|pad|>`` 1) trained on one
    play, written to ``path``."""
    path.write_text(
        train_tokenizer([shakespeare_plays("train")[0][1]], vocab_size).to_str(), encoding="utf-8"
    )
    return path
