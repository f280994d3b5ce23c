"""Pipeline parallelism with ``torch.distributed.pipelining``: the layers split into stages, this
rank's stages built from the model on meta, one schedule that runs them, and one module that holds
this rank's parts under the whole model's names.

After torchtitan's ``distributed/pipeline_parallel.py`` (``pipeline_llm``): a stage is a deep copy
of the model built on meta with the layers it does not own deleted from ``layers`` (a ``ModuleDict``
keyed by layer id, so names stay the whole model's) and ``tok_embeddings`` (all but the first stage)
or ``norm`` and ``output`` (all but the last) set to ``None``; the family's ``parallelize`` (TP, AC,
compile, FSDP2) is applied to each stage, which a ``PipelineStage`` wraps. A looped schedule
(``Interleaved1F1B``) gives pipeline rank ``r`` the stages ``r, r + pp, r + 2 pp, ...``; ``1F1B``
and ``GPipe`` one stage per rank.

Notes in docs/design.md: "on the loss under pipeline parallelism", "on stage metadata".
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from torchtitan_lite.distributed.fsdp import is_tied
from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.parallel_options import ParallelOptions
from torchtitan_lite.init.apply import materialize

if TYPE_CHECKING:
    from torch.distributed.pipelining import PipelineStage

# torch.distributed.pipelining is imported where it is used: it imports torch._dynamo (a second of
# CPU), which every
# process would pay at start-up (the preflight and each rank), pipelined or not.


def _single_stage(schedule: str) -> bool:
    """Whether ``schedule`` (a ``torch.distributed.pipelining`` schedule name) runs one stage per
    rank."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    return issubclass(get_schedule_class(schedule), PipelineScheduleSingle)


def stage_layer_ids(
    n_layers: int,
    pp: int,
    schedule: str,
    *,
    n_microbatches: int,
    layers_per_stage: int | None = None,
    split_points: Sequence[int] = (),
) -> list[list[int]]:
    """The layer ids of every (virtual) pipeline stage, in stage order, for a layout the schedule
    can run.

    Stages: at ``split_points`` (the first layer of every stage but the first, torchtitan's former
    ``pipeline_parallel_split_points``), else ``ceil(n_layers / layers_per_stage)`` stages, else one
    per rank (``1F1B``, ``GPipe``) or two (``Interleaved1F1B``; torchtitan's defaults). Without
    split points the layers are spread evenly: stage sizes differ by at most one, the larger first.

    Args:
        n_layers: layers of the model.
        pp: pipeline-parallel degree (ranks of a pipeline), >= 2.
        schedule: ``"1F1B"``, ``"GPipe"`` or ``"Interleaved1F1B"``.
        n_microbatches: pipeline micro-batches per step (``local_batch_size / microbatch_size``).

    Raises:
        ValueError: one line naming the setting: both split points and ``layers_per_stage``, split
            points not increasing within ``1..n_layers - 1``, more stages than layers, stages not a
            multiple of ``pp``, a single-stage schedule with several stages per rank or a looped one
            with one, or fewer micro-batches than stages under ``1F1B``, or a count
            ``Interleaved1F1B`` cannot round (a multiple of ``max(1, n_microbatches // pp)``).
    """
    if split_points and layers_per_stage is not None:
        raise ValueError(
            "set pipeline_parallel_split_points or pipeline_parallel_layers_per_stage, not both"
        )
    if split_points:
        points = list(split_points)
        if points != sorted(set(points)) or points[0] < 1 or points[-1] >= n_layers:
            raise ValueError(
                f"pipeline_parallel_split_points {points} must be increasing layer ids within 1.."
                f"{n_layers - 1} (the first layer of each stage after the first)"
            )
        bounds = [0, *points, n_layers]
    else:
        per_rank = 1 if _single_stage(schedule) else 2
        n_stages = math.ceil(n_layers / layers_per_stage) if layers_per_stage else pp * per_rank
        if n_stages > n_layers:
            made = (
                f"{layers_per_stage} layers per stage"
                if layers_per_stage
                else f"{pp} ranks x {per_rank}"
            )
            raise ValueError(
                f"{n_stages} pipeline stages ({made}) but the model has {n_layers} layers; use at "
                f"most {n_layers} stages"
            )
        base, extra = divmod(n_layers, n_stages)
        bounds = [0]
        for stage in range(n_stages):
            bounds.append(bounds[-1] + base + (stage < extra))
    n_stages = len(bounds) - 1
    if n_stages % pp:
        raise ValueError(
            f"{n_stages} pipeline stages of the {n_layers}-layer model are not a multiple of "
            f"pipeline_parallel_degree {pp}"
        )
    per_rank = n_stages // pp
    if _single_stage(schedule) and per_rank != 1:
        raise ValueError(
            f"{n_stages} stages on {pp} ranks are {per_rank} per rank but {schedule} runs one per "
            "rank; use Interleaved1F1B or one stage per rank"
        )
    if not _single_stage(schedule) and per_rank < 2:
        raise ValueError(
            f"{schedule} runs several stages per rank but {n_stages} stages on {pp} ranks are one "
            "per rank; use 1F1B or GPipe, or more stages"
        )
    if schedule == "1F1B" and n_microbatches < n_stages:
        raise ValueError(
            f"1F1B needs at least as many micro-batches as stages: {n_microbatches} micro-batches "
            f"(local_batch_size / pipeline_parallel_microbatch_size) for {n_stages} stages; use "
            "GPipe or smaller micro-batches"
        )
    rounds = max(1, n_microbatches // pp)
    if not _single_stage(schedule) and n_microbatches % rounds:
        raise ValueError(
            f"{schedule} needs a number of micro-batches divisible by max(1, micro-batches // "
            f"pipeline_parallel_degree) = {rounds}, got {n_microbatches}"
        )
    return [list(range(start, end)) for start, end in zip(bounds, bounds[1:], strict=False)]


def split_stage(
    model: nn.Module, layer_ids: Sequence[int], *, first: bool, last: bool
) -> nn.Module:
    """A deep copy of ``model`` (on meta) that keeps only ``layers[str(i)]`` for ``i`` in
    ``layer_ids``, ``tok_embeddings`` if ``first`` and ``norm`` and ``output`` if ``last`` (the
    others set to ``None``).

    Raises:
        ValueError: ``model`` ties ``output`` to ``tok_embeddings`` and the stage is not both first
            and last.
    """
    if is_tied(model) and not (first and last):
        raise ValueError(
            "a tied model (output.weight is tok_embeddings.weight) cannot be split into pipeline "
            "stages: the first stage owns the embedding and the last the output"
        )
    stage = copy.deepcopy(model)
    keep = {str(i) for i in layer_ids}
    for key in [k for k in stage.layers if k not in keep]:
        del stage.layers[key]
    if not first:
        stage.tok_embeddings = None
    if not last:
        stage.norm = None
        stage.output = None
    return stage


class StageModules(nn.Module):
    """This rank's pipeline stages seen as one model, for everything that works by name:
    ``tok_embeddings`` (on the rank of the first stage, else ``None``), ``layers`` (the layers of
    all its stages, keyed as in the whole model, in layer order), ``norm`` and ``output`` (on the
    rank of the last stage, else ``None``).

    The modules are the stages' own (shared, not copied): parameter and buffer names are the whole
    model's, so the init keys, the fingerprint, the optimizer and the checkpoint's FQNs are those of
    a 1-process run. :meth:`init_buffers` and :meth:`train` reach every stage. The schedule runs the
    stages (``parts``), never this module's forward.

    Args:
        parts: this rank's stage modules in stage order (from :func:`split_stage`, parallelized).
    """

    def __init__(self, parts: Sequence[nn.Module]):
        super().__init__()
        self.parts = list(parts)  # a plain list: the parts' modules are registered once, below
        self.tok_embeddings = parts[0].tok_embeddings
        self.layers = nn.ModuleDict(
            {key: layer for part in parts for key, layer in part.layers.items()}
        )
        self.norm = parts[-1].norm
        self.output = parts[-1].output

    def init_buffers(self, buffer_device: torch.device | str | None = None) -> None:
        """Every stage's ``init_buffers`` (RoPE tables)."""
        for part in self.parts:
            part.init_buffers(buffer_device)

    def train(self, mode: bool = True) -> StageModules:
        """``nn.Module.train`` of this module and of every stage (the stages' roots are not
        submodules here)."""
        super().train(mode)
        for part in self.parts:
            part.train(mode)
        return self

    def forward(self, *args, **kwargs):
        """Not callable: raises RuntimeError (stages run through the schedule)."""
        raise RuntimeError(
            "StageModules holds pipeline stages: run them with Pipeline.step or Pipeline.evaluate"
        )


class PipelineLoss:
    """The schedule's loss function (the last stage calls it per micro-batch): see the note on the
    loss.

    Args:
        loss_fn: ``(logits (mb, seqlen, V), labels (mb, seqlen)) -> summed token cross-entropy``
            (0-dim fp32).

    Attributes:
        scale: factor of the returned loss (1 / the step's global token count in training).
        total: the summed cross-entropy of the micro-batches since :meth:`reset` (detached), or 0.
    """

    def __init__(self, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        self.loss_fn = loss_fn
        self.scale = 1.0
        self.total: torch.Tensor | float = 0.0

    def reset(self, scale: float) -> None:
        """Start a step: ``total`` back to 0, the returned loss multiplied by ``scale``."""
        self.scale, self.total = scale, 0.0

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        summed = self.loss_fn(logits, labels)
        self.total = self.total + summed.detach()
        return summed * self.scale


class Pipeline:
    """This rank's stages and the schedule that runs them (build with :func:`build_pipeline`).

    Attributes:
        model: the :class:`StageModules` of this rank.
        stages: its ``PipelineStage`` objects, in stage order.
        schedule: the ``torch.distributed.pipelining`` schedule.
        loss: the :class:`PipelineLoss` the last stage calls.
        group: the pipeline process group (the ``pp`` mesh dimension).
        n_microbatches: pipeline micro-batches per local batch.
    """

    def __init__(
        self,
        model: StageModules,
        stages: list[PipelineStage],
        schedule,
        loss: PipelineLoss,
        group: dist.ProcessGroup,
        n_microbatches: int,
        device: torch.device,
    ):
        self.model, self.stages, self.schedule, self.loss = model, stages, schedule, loss
        self.group, self.n_microbatches, self.device = group, n_microbatches, device
        self.has_first = any(stage.is_first for stage in stages)
        self.has_last = any(stage.is_last for stage in stages)

    def describe(self) -> str:
        """``pipeline 1F1B: stage 0 of 2 (layers 0-1), 4 micro-batches of 2 sequences per local
        batch``."""
        held = ", ".join(
            f"{stage.stage_index} (layers {_span(part.layers)})"
            for stage, part in zip(self.stages, self.model.parts, strict=False)
        )
        n_stages = self.stages[0].num_stages
        return (
            f"pipeline {type(self.schedule).__name__.removeprefix('Schedule')}: "
            f"stage{'s' if len(self.stages) > 1 else ''} {held} of {n_stages}, "
            f"{self.n_microbatches} micro-batch(es) per local batch"
        )

    def _run(self, run, inputs: torch.Tensor, labels: torch.Tensor, scale: float) -> torch.Tensor:
        self.loss.reset(scale)
        run(
            *((inputs,) if self.has_first else ()),
            target=labels if self.has_last else None,
            seqlen=labels.shape[1],
        )
        return torch.as_tensor(self.loss.total, dtype=torch.float32, device=self.device)

    def step(self, inputs: torch.Tensor, labels: torch.Tensor, scale: float) -> torch.Tensor:
        """Forward and backward of one local batch (int64 ``(local_batch_size, seq_len)`` tokens and
        labels) in :attr:`n_microbatches` micro-batches, each micro-batch's loss times ``scale``
        backpropagated; gradients accumulate. Returns this rank's summed token cross-entropy of the
        batch (0-dim fp32; 0 off the last stage). A collective over the pipeline (and the stages'
        FSDP meshes)."""
        return self._run(self.schedule.step, inputs, labels, scale)

    @torch.no_grad()
    def evaluate(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Forward only of one local batch: this rank's summed token cross-entropy (0-dim fp32; 0
        off the last stage). Call in eval mode."""
        return self._run(self.schedule.eval, inputs, labels, 1.0)


def _span(layers: nn.ModuleDict) -> str:
    """``"2-3"`` (or ``"2"``, or ``"none"``) for the layer keys of a stage."""
    keys = [int(k) for k in layers]
    if not keys:
        return "none"
    return f"{keys[0]}-{keys[-1]}" if len(keys) > 1 else str(keys[0])


def gather_stages(obj, group: dist.ProcessGroup) -> list:
    """``obj`` of every rank of the pipeline ``group`` (picklable), in pipeline rank order; a
    collective."""
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, obj, group=group)
    return gathered


def _stage_metadata(
    model: nn.Module,
    stage: int,
    n_stages: int,
    microbatch_size: int,
    seq_len: int,
    seq_shards: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input, output)`` meta tensors of stage ``stage`` (see the note on stage metadata); the
    hidden states hold ``seq_len / seq_shards`` positions (sequence parallelism)."""
    dim, vocab_size = model.tok_embeddings.embedding_dim, model.output.out_features
    hidden = torch.empty(
        microbatch_size, seq_len // seq_shards, dim, dtype=dtype, device="meta", requires_grad=True
    )
    tokens = torch.empty(microbatch_size, seq_len, dtype=torch.int64, device="meta")
    logits = torch.empty(
        microbatch_size, seq_len, vocab_size, dtype=dtype, device="meta", requires_grad=True
    )
    return tokens if stage == 0 else hidden, logits if stage == n_stages - 1 else hidden


def build_pipeline(
    model: nn.Module,
    parallel_dims: ParallelDims,
    parallelize: Callable[[nn.Module, ParallelDims, ParallelOptions], nn.Module],
    options: ParallelOptions,
    *,
    device: torch.device,
    schedule: str,
    local_batch_size: int,
    microbatch_size: int,
    seq_len: int,
    layers_per_stage: int | None,
    split_points: Sequence[int],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Pipeline:
    """Split ``model`` (built on meta, untied) into stages (:func:`stage_layer_ids`), build,
    ``parallelize`` and materialize on ``device`` this rank's (uninitialized: ``init_weights`` comes
    next), and the schedule over them.

    Args:
        parallelize: the family's ``ModelSpec.parallelize``, applied to each stage.
        options: its options; ``param_dtype`` is the dtype of the hidden states between stages.
        schedule: ``pipeline_parallel_schedule``; ``local_batch_size`` and ``microbatch_size`` give
            the micro-batches per step; ``seq_len`` the tokens per sequence.
        layers_per_stage, split_points: ``pipeline_parallel_layers_per_stage`` and
            ``pipeline_parallel_split_points``.
        loss_fn: the summed token cross-entropy (wrapped in a :class:`PipelineLoss`).

    Raises:
        ValueError: see :func:`stage_layer_ids` and :func:`split_stage` (the config checks both
            first).
    """
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import get_schedule_class

    pp, pp_rank = parallel_dims.pp, parallel_dims.pp_rank
    n_microbatches = local_batch_size // microbatch_size
    layer_ids = stage_layer_ids(
        len(model.layers),
        pp,
        schedule,
        n_microbatches=n_microbatches,
        layers_per_stage=layers_per_stage,
        split_points=split_points,
    )
    n_stages = len(layer_ids)
    seq_shards = parallel_dims.tp if parallel_dims.tp > 1 and options.sequence_parallel else 1
    group = parallel_dims.pp_mesh.get_group()
    parts, stages = [], []
    for index in range(pp_rank, n_stages, pp):
        part = split_stage(model, layer_ids[index], first=index == 0, last=index == n_stages - 1)
        part = materialize(parallelize(part, parallel_dims, options), device)
        inputs, outputs = _stage_metadata(
            model, index, n_stages, microbatch_size, seq_len, seq_shards, options.param_dtype
        )
        stages.append(
            PipelineStage(
                part, index, n_stages, device, input_args=inputs, output_args=outputs, group=group
            )
        )
        parts.append(part)
    loss = PipelineLoss(loss_fn)
    schedule_cls = get_schedule_class(schedule)
    runner = schedule_cls(
        stages[0] if _single_stage(schedule) else stages,
        n_microbatches=n_microbatches,
        loss_fn=loss,
        scale_grads=False,
    )
    return Pipeline(StageModules(parts), stages, runner, loss, group, n_microbatches, device)
