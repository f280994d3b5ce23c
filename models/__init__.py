"""Model registry: a name maps to a :class:`ModelSpec` of plain callables.

The engine (``torchtitan_lite/``) asks the registry (``get_model_spec("qwen3")``) and imports nothing else from
``models/`` (``tests/test_import_boundary.py`` checks it). Adding a family: a folder ``models/<family>/`` whose
``__init__.py`` defines ``model_spec``, and its name in ``_FAMILIES`` below.

Contract of a model class (``spec.model_cls(args)``):
  * ``__init__(args)`` only creates modules (it runs under ``torch.device("meta")``): it never
    initializes values; :func:`torchtitan_lite.init.apply.init_weights` does, from ``spec.init_plan``.
  * submodules ``tok_embeddings``, ``layers`` (an ``nn.ModuleDict`` keyed by ``str(layer_id)``),
    ``norm`` and ``output``; ``output.weight is tok_embeddings.weight`` when ``args.tie_embeddings``.
  * ``init_buffers(buffer_device)`` recomputes derived, non-persistent buffers (RoPE tables) in fp32.
  * ``forward(tokens)``: ``tokens`` int64 ``(bs, seqlen)`` -> logits ``(bs, seqlen, vocab_size)``.

Contract of ``spec.parallelize(model, parallel_dims, options) -> nn.Module``: applied once to the model built on
meta, before ``to_empty`` and init; ``parallel_dims`` is the run's
:class:`~torchtitan_lite.distributed.parallel_dims.ParallelDims` (mesh built), ``options`` a
:class:`~torchtitan_lite.distributed.parallel_options.ParallelOptions`. It applies, in this order, what the
family's modules need (TP plan, EP, then activation checkpointing, compile, FSDP2) in place, keeps every
parameter's canonical name (wrappers may add only the prefixes ``torchtitan_lite.init.apply.WRAPPER_NAMES``
lists), and returns the model to train.

Contract of ``spec.training_hooks(model, parallel_dims, micro_batches) -> TrainingHooks``: called once on every
rank with the parallelized model, before the first step (``micro_batches`` per rank per optimizer step); it may
configure the model (not its values: init and checkpoint loading come after). The trainer then calls the
:class:`TrainingHooks` methods on every rank at the times they name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

from torch import nn

from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.parallel_options import ParallelOptions
from torchtitan_lite.init.spec import InitPlan

__all__ = ["HookReport", "ModelSpec", "TrainingHooks", "get_model_spec", "hf_family", "model_names",
           "no_training_hooks"]


class HookReport(NamedTuple):
    """What :meth:`TrainingHooks.report` returns for one step.

    Attributes:
        scalars: TensorBoard tag -> value, written by rank 0 (e.g. ``"moe/layers.1.moe/max_load"``).
        summary: one line printed at summary steps, or ``None``.
    """

    scalars: dict[str, float]
    summary: str | None


class TrainingHooks:
    """A family's per-step work, which the trainer runs without knowing what it is. This base does nothing."""

    def after_optimizer_step(self, step: int) -> None:
        """Called once per optimizer step ``step`` (1-based), right after ``optimizer.step()`` (or the skipped
        update), on every rank. Collectives and device ops only: it must not read the device (no host sync)."""

    def report(self, step: int) -> HookReport:
        """Called after :meth:`after_optimizer_step` at log steps and at summary steps (validation steps and the
        last step), on every rank; may read the device. The trainer writes ``scalars`` and prints ``summary``
        at summary steps."""
        return HookReport({}, None)


def no_training_hooks(model: nn.Module, parallel_dims: ParallelDims, micro_batches: int) -> TrainingHooks:
    """The ``training_hooks`` of a family without per-step work."""
    return TrainingHooks()


@dataclass(frozen=True)
class ModelSpec:
    """Everything the engine needs to know about one model family.

    Attributes:
        name: registry name, e.g. ``"qwen3"``.
        model_cls: ``nn.Module`` class built as ``model_cls(args)``.
        flavors: flavor name -> instance of the family's args dataclass (``"debug"``, ``"0.6b"``, ...).
        init_plan: ``args -> InitPlan``.
        num_flops_per_token: ``(args, seq_len) -> float``: training FLOPs per token (forward + backward, 6N plus
            attention), used for MFU.
        parallelize: ``(model, parallel_dims, options) -> nn.Module`` (see the module docstring).
        training_hooks: ``(model, parallel_dims, micro_batches) -> TrainingHooks`` (see the module docstring).
        state_dict_adapter: the class between our model and Hugging Face's (``config.json`` keys and tensors, both
            ways; its contract is in ``models/common/hf_adapter.py``), or ``None`` when the family has none.
    """

    name: str
    model_cls: type[nn.Module]
    flavors: Mapping[str, Any]
    init_plan: Callable[[Any], InitPlan]
    num_flops_per_token: Callable[[Any, int], float]
    parallelize: Callable[[nn.Module, ParallelDims, ParallelOptions], nn.Module]
    training_hooks: Callable[[nn.Module, ParallelDims, int], TrainingHooks] = no_training_hooks
    state_dict_adapter: Callable[[Any], Any] | None = None


_FAMILIES = ("qwen3", "qwen3_moe", "gpt_oss", "deepseek_v3")


def get_model_spec(name: str) -> ModelSpec:
    """The :class:`ModelSpec` registered under ``name`` (``models.<name>.model_spec``).

    Raises:
        ValueError: ``name`` is not a known model family (the message lists the known ones).
    """
    if name not in _FAMILIES:
        raise ValueError(f"unknown model '{name}'; known models: {', '.join(_FAMILIES)}")
    return importlib.import_module(f"models.{name}").model_spec


def hf_family(model_type: str | None, architectures: list[str] | None) -> str | None:
    """The family whose state-dict adapter reads a ``config.json`` of ``model_type`` (or, without one, whose
    architecture is the first of ``architectures``); ``None`` when none does."""
    for name in _FAMILIES:
        adapter = get_model_spec(name).state_dict_adapter
        if adapter is not None and (adapter.model_type == model_type if model_type else
                                    bool(architectures) and adapter.architecture == architectures[0]):
            return name
    return None


def model_names() -> tuple[str, ...]:
    """Names of all registered model families."""
    return _FAMILIES
