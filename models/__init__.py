"""Model registry: a name maps to a :class:`ModelSpec` of plain callables.

The trainer asks the registry (``get_model_spec("qwen3")``) and never imports a model by name.

Contract of a model class (``spec.model_cls(args)``):
  * ``__init__(args)`` only creates modules (it runs under ``torch.device("meta")``): it never
    initializes values; :func:`torchtitan_lite.init.init_weights` does, from ``spec.init_plan``.
  * submodules ``tok_embeddings``, ``layers`` (an ``nn.ModuleDict`` keyed by ``str(layer_id)``),
    ``norm`` and ``output``; ``output.weight is tok_embeddings.weight`` when ``args.tie_embeddings``.
  * ``init_buffers(buffer_device)`` recomputes derived, non-persistent buffers (RoPE tables) in fp32.
  * ``forward(tokens)``: ``tokens`` int64 ``(bs, seqlen)`` -> logits ``(bs, seqlen, vocab_size)``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from torch import nn

from torchtitan_lite.init.spec import InitPlan


@dataclass(frozen=True)
class ModelSpec:
    """Everything the engine needs to know about one model family.

    Attributes:
        name: registry name, e.g. ``"qwen3"``.
        model_cls: ``nn.Module`` class built as ``model_cls(args)``.
        flavors: flavor name -> args dataclass instance (``"debug"``, ``"0.6b"``, ...).
        init_plan: ``args -> InitPlan``.
        num_flops_per_token: ``(args, seq_len) -> float``: training FLOPs per token
            (forward + backward, 6N plus attention), used for MFU.
    """

    name: str
    model_cls: type[nn.Module]
    flavors: Mapping[str, Any]
    init_plan: Callable[[Any], InitPlan]
    num_flops_per_token: Callable[[Any, int], float]


_FAMILIES = ("qwen3", "qwen3_moe", "gpt_oss", "deepseek_v3")


def get_model_spec(name: str) -> ModelSpec:
    """The :class:`ModelSpec` registered under ``name``.

    Raises:
        ValueError: ``name`` is not a known model family (the message lists the known ones).
    """
    if name not in _FAMILIES:
        raise ValueError(f"unknown model '{name}'; known models: {', '.join(_FAMILIES)}")
    return importlib.import_module(f"models.{name}").model_spec


def model_names() -> tuple[str, ...]:
    """Names of all registered model families."""
    return _FAMILIES
