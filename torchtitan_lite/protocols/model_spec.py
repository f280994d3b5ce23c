"""What a model family is to the engine: a :class:`ModelSpec` of plain callables, and the contracts
they keep.

The trainer asks the registry (``torchtitan_lite.models.get_model_spec("qwen3")``) for a spec and
never imports a family.

Contract of a model class (``spec.model_cls(args)``):
  * ``__init__(args)`` only creates modules (it runs under ``torch.device("meta")``): it never
    initializes values; :func:`torchtitan_lite.init.apply.init_weights` does, from
    ``spec.init_plan``.
  * submodules ``tok_embeddings``, ``layers`` (an ``nn.ModuleDict`` keyed by ``str(layer_id)``),
    ``norm`` and ``output``; ``output.weight is tok_embeddings.weight`` when
    ``args.tie_embeddings``.
  * ``init_buffers(buffer_device)`` recomputes derived, non-persistent buffers (RoPE tables) in
    fp32.
  * ``forward(tokens)``: ``tokens`` int64 ``(bs, seqlen)`` -> logits ``(bs, seqlen, vocab_size)``;
    with ``tok_embeddings`` set to ``None`` (a later pipeline stage) it takes hidden states
    ``(bs, seqlen, dim)``, and with ``output`` set to ``None`` (an earlier stage) it returns them;
    each block returns its input's dtype.
  * a forward may run twice for one batch (activation checkpointing recomputes a block in backward):
    state it updates in forward (MoE token counters) is updated only when
    :func:`torchtitan_lite.distributed.activation_checkpoint.recomputing` is false.

Contract of ``spec.parallelize(model, parallel_dims, options) -> nn.Module``: applied once to the
model built on meta (under pipeline parallelism to each stage, a copy with some modules ``None``),
before ``to_empty`` and init; ``parallel_dims`` is the run's
:class:`~torchtitan_lite.distributed.parallel_dims.ParallelDims` (mesh built), ``options`` a
:class:`~torchtitan_lite.distributed.parallel_options.ParallelOptions`. It applies, in this order,
what the family's modules need (TP plan, EP, then activation checkpointing, compile, FSDP2) in
place, keeps every parameter's canonical name (wrappers may add only the prefixes
``torchtitan_lite.init.apply.WRAPPER_NAMES`` lists), and returns the model to train.

Contract of ``spec.training_hooks(model, parallel_dims, micro_batches) -> TrainingHooks``: called
once on every rank with the parallelized model, before the first step (``micro_batches``: model
forwards per rank per optimizer step, pipeline micro-batches included); it may configure the model
(not its values: init and checkpoint loading come after). The trainer then calls the
:class:`TrainingHooks` methods on every rank at the times they name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from torch import nn

from torchtitan_lite.protocols.state_dict_adapter import StateDictAdapter

if TYPE_CHECKING:  # type hints only: protocols/ is a floor below distributed/ and init/
    from torchtitan_lite.distributed.parallel_dims import ParallelDims
    from torchtitan_lite.distributed.parallel_options import ParallelOptions
    from torchtitan_lite.init.spec import InitPlan


class HookReport(NamedTuple):
    """What :meth:`TrainingHooks.report` returns for one step.

    Attributes:
        scalars: TensorBoard tag -> value, written by rank 0 (e.g. ``"moe/layers.1.moe/max_load"``).
        summary: one line printed at summary steps, or ``None``.
        notes: lines printed at once, at any step that reports (e.g. a warning about the model's
            state).
    """

    scalars: dict[str, float]
    summary: str | None
    notes: tuple[str, ...] = ()


class TrainingHooks:
    """A family's per-step work, which the trainer runs without knowing what it is. This base does
    nothing."""

    def after_optimizer_step(self, step: int) -> None:
        """Called once per optimizer step ``step`` (1-based), right after ``optimizer.step()`` (or
        the skipped update), on every rank. Collectives and device ops only: it must not read the
        device (no host sync)."""

    def report(self, step: int) -> HookReport:
        """Called after :meth:`after_optimizer_step` at log steps and at summary steps (validation
        steps and the last step), on every rank; may read the device. The trainer writes
        ``scalars``, prints ``notes`` and, at summary steps, ``summary``."""
        return HookReport({}, None)

    def step1_heads(self, seq_len: int) -> dict[str, float]:
        """The last step's mean cross-entropy per predicted token of each output head besides the
        main one (e.g. ``{"mtp depth 1": 7.61}``), for the step-1 check; on every rank (may
        all-reduce)."""
        return {}


def no_training_hooks(
    model: nn.Module, parallel_dims: ParallelDims, micro_batches: int
) -> TrainingHooks:
    """The ``training_hooks`` of a family without per-step work."""
    return TrainingHooks()


@dataclass(frozen=True)
class ModelSpec:
    """Everything the engine needs to know about one model family.

    Attributes:
        name: registry name, e.g. ``"qwen3"``.
        model_cls: ``nn.Module`` class built as ``model_cls(args)``.
        flavors: flavor name -> instance of the family's args dataclass (``"debug"``, ``"0.6b"``,
            ...).
        init_plan: ``args -> InitPlan``.
        num_flops_per_token: ``(args, seq_len) -> float``: training FLOPs per token (forward +
            backward, 6N plus attention), used for MFU.
        parallelize: ``(model, parallel_dims, options) -> nn.Module`` (see the module docstring).
        training_hooks: ``(model, parallel_dims, micro_batches) -> TrainingHooks`` (see the module
            docstring).
        state_dict_adapter: the class between our model and Hugging Face's (``config.json`` keys and
            tensors, both ways;
            :class:`~torchtitan_lite.protocols.state_dict_adapter.StateDictAdapter`), or ``None``
            when the family has none.
    """

    name: str
    model_cls: type[nn.Module]
    flavors: Mapping[str, Any]
    init_plan: Callable[[Any], InitPlan]
    num_flops_per_token: Callable[[Any, int], float]
    parallelize: Callable[[nn.Module, ParallelDims, ParallelOptions], nn.Module]
    training_hooks: Callable[[nn.Module, ParallelDims, int], TrainingHooks] = no_training_hooks
    state_dict_adapter: type[StateDictAdapter] | None = None
