"""``python -m torchtitan_lite.tools.simulate [--world-size N] [--device cuda|cpu]
[--device-memory GIB] [--real] [--job.config_file X.toml] [--section.key=value
...]``: the trainer's own training step at any size and world size, on fake tensors and a fake
process group, in one CPU process; docs/simulate.md.

The config and overrides are exactly ``run_train.sh``'s (``CONFIG_FILE`` or its default when no
``--job.config_file`` is given). For each simulated rank (one per pipeline stage under pipeline
parallelism, else rank 0) it builds the run with the trainer's functions
(:meth:`~torchtitan_lite.train.Trainer.for_steps`: model on meta, the family's parallelize,
``to_empty``, hooks, optimizer, lr schedule), checks the init plan's coverage and each tensor's
local box (nothing drawn), runs two :meth:`~torchtitan_lite.train.Trainer.train_step` calls under
``torch.distributed._tools.MemTracker``, ``FlopCounterMode`` and a count of the collectives, and
makes a DCP save plan of the checkpointer's state dict (no bytes written).

Output: per rank, the peak memory by kind and phase, the FLOPs of a step beside
``num_flops_per_token``, the collectives per step and the wall seconds; the last line is ``simulated
<family> <flavor> on <N> ranks (<layout>): peak <X> GiB per rank (<which rank>), preflight estimate
<Y> GiB; fits <device> <M> GiB: yes|no``. Exit 0 when the simulation ran, 2 and one ``config
error: ...`` line for a bad config.

``--real``: the same two steps with real tensors on this CPU, under the process group that torchrun
gives (world size 1 without it), the same trackers; the last line starts with ``real``.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from torchtitan_lite.components.checkpoint.checkpointer import Checkpointer
from torchtitan_lite.components.metrics import StartupLog
from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.paths import DEFAULT_CONFIG
from torchtitan_lite.distributed.checks import check_world_size
from torchtitan_lite.distributed.process_group import DistInfo, init_distributed
from torchtitan_lite.errors import UserError
from torchtitan_lite.init.apply import init_weights, resolve_plan
from torchtitan_lite.init.keyed import local_box
from torchtitan_lite.lifecycle.startup import layout_text
from torchtitan_lite.preflight.checks import parse_run
from torchtitan_lite.preflight.memory import GIB, run_estimate
from torchtitan_lite.preflight.run import ResolvedRun
from torchtitan_lite.train import Trainer

DEVICE_MEMORY_GIB = {"cuda": 80.0}
"""``--device-memory`` default per simulated device: an H100's 80 GB of HBM3 (NVIDIA H100 datasheet,
SXM and PCIe), taken as 80 GiB; ``cpu``: this host's memory. An Ascend 910B is ``--device cuda
--device-memory 64``."""


def _grouped_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of ``_grouped_mm``: 2 per multiply-add of each group's product. ``(M, K) x (E, K, N)``
    and ``(E, M, K) x (E, K, N)``: ``2 x |out| x K``; ``(K, R) x (R, N)`` with offsets over ``R``
    (a weight's gradient, ``(E, K, N)`` out): ``2 K R N``. The rows include each group's padding
    (``token_dispatch.ALIGN``)."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    numel = 1
    for n in out_shape:
        numel *= n
    return 2 * numel * a_shape[-1]


def _count_unregistered_ops() -> None:
    """Give ``FlopCounterMode`` the FLOPs of the kernels torch 2.13 registers no formula for: SDPA's
    CPU flash kernels (forward and backward; torch's own ``sdpa_flop``, ``sdpa_backward_flop``, the
    whole ``s x s`` product as ``num_flops_per_token``) and the experts' ``_grouped_mm``."""
    aten = torch.ops.aten
    for op, formula, raw in (
        (aten._scaled_dot_product_flash_attention_for_cpu, flop_counter.sdpa_flop, True),
        (
            aten._scaled_dot_product_flash_attention_for_cpu_backward,
            flop_counter.sdpa_backward_flop,
            True,
        ),
        (aten._grouped_mm, _grouped_mm_flop, False),
    ):
        if op not in flop_counter.flop_registry:
            flop_counter.register_flop_formula(op, get_raw=raw)(formula)


_count_unregistered_ops()

STEPS = 2
"""Training steps simulated: the second one has the optimizer's states from the first."""


@dataclass(frozen=True)
class Options:
    """The tool's own flags (everything else is the run's config)."""

    world_size: int
    device: str
    device_memory_gib: float
    real: bool


@dataclass(frozen=True)
class RankResult:
    """What one simulated rank measured: bytes by kind at the peak and by phase, FLOPs and
    collectives of the second step, seconds."""

    rank: int
    stage: int | None
    peak: int
    peak_by_kind: dict[str, int]
    by_phase: dict[str, int]
    flops: int
    model_flops: int
    collectives: dict[str, int]
    plan_items: int
    plan_bytes: int
    seconds: float


def parse_options(argv: list[str]) -> tuple[Options, list[str]]:
    """The tool's flags and the run's arguments (``--job.config_file`` added from ``CONFIG_FILE``,
    else ``run_train.sh``'s default, when absent).

    Raises:
        ConfigError: a flag without its value, or a value out of range (one line).
    """
    values = {"--world-size": "1", "--device": "cuda", "--device-memory": ""}
    real, rest, i = False, [], 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in values:
            if not eq:
                if i + 1 == len(argv):
                    raise ConfigError(f"{name} needs a value")
                i, value = i + 1, argv[i + 1]
            values[name] = value
        elif arg == "--real":
            real = True
        else:
            rest.append(arg)
        i += 1
    try:
        world_size = int(values["--world-size"])
        memory = float(values["--device-memory"]) if values["--device-memory"] else None
    except ValueError as err:
        raise ConfigError(f"a tool flag is not a number: {err}") from None
    device = values["--device"]
    if device not in ("cuda", "cpu"):
        raise ConfigError(f"--device {device!r}: use cuda (an NPU too, with its memory) or cpu")
    if world_size < 1 or (memory is not None and memory <= 0):
        raise ConfigError(
            f"--world-size {world_size} and --device-memory {memory} GiB must be positive"
        )
    if memory is None:
        memory = DEVICE_MEMORY_GIB.get(device) or _host_memory_gib()
    if not any(arg.split("=")[0] == "--job.config_file" for arg in rest):
        rest = ["--job.config_file", os.environ.get("CONFIG_FILE") or DEFAULT_CONFIG, *rest]
    return Options(world_size, device, memory, real), rest


def _host_memory_gib() -> float:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GIB


def target_run(run: ResolvedRun, device: str) -> ResolvedRun:
    """``run`` as the target device would resolve it: ``compute_dtype = "auto"`` is bf16 on an
    accelerator (``train.compute_dtype``); the tensors themselves live on the fake CPU device."""
    training = run.config.training
    if device == "cpu" or training.compute_dtype != "auto":
        return run
    config = replace(run.config, training=replace(training, compute_dtype="bfloat16"))
    return replace(run, config=config)


def simulated_ranks(dims) -> list[int]:
    """Global ranks to simulate: the first rank of every pipeline stage (``pp`` is the outermost
    mesh dimension), else rank 0."""
    return [stage * (dims.world_size // dims.pp) for stage in range(dims.pp)]


def fake_batches(run: ResolvedRun, device: torch.device):
    """Endless ``(inputs, labels)`` of ``(local_batch_size, seq_len)`` int64 token ids, as the
    loader gives a rank (the values do not matter to shapes, memory or FLOPs)."""
    training = run.config.training
    shape = (training.local_batch_size, training.seq_len)
    while True:
        tokens = torch.randint(0, run.model_args.vocab_size, shape, device=device)
        yield tokens, tokens


class CollectiveCounter(TorchDispatchMode):
    """Counts the collectives dispatched (``c10d`` and functional-collective ops, their waits left
    out) by name; ``CommDebugMode`` counts the same but breaks on a model called per micro-batch
    under ``MemTracker``."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        namespace, _, op = name.partition("::")
        if namespace in ("c10d", "_c10d_functional") and not op.startswith("wait"):
            op = op.strip("_")
            self.counts[op] = self.counts.get(op, 0) + 1
        return func(*args, **(kwargs or {}))


class RoutingShapes(TorchDispatchMode):
    """The MoE routing's ``bincount(indices, minlength=E)`` on fake tensors: an ``(E,)`` int64
    tensor, the shape it has whenever every expert id is below ``E`` (fake tensors hold no ids, so
    ``FakeTensorMode`` cannot tell). The counts' values are as fake as every other value; the
    buffers the dispatch sizes from the shapes alone (``tokens x top_k`` rows plus each expert's
    alignment, ``models/common/token_dispatch.py``) are exact for any routing."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.bincount.default:
            weights = args[1] if len(args) > 1 else kwargs.get("weights")
            minlength = args[2] if len(args) > 2 else kwargs.get("minlength", 0)
            if weights is None and minlength > 0:
                return args[0].new_empty((minlength,))
        return func(*args, **kwargs)


class StepTracker(MemTracker):
    """``MemTracker`` whose module statistics start again at each top-level forward: the trainer
    calls the model once per micro-batch (and a pipeline stage once per pipeline micro-batch),
    which ``MemTracker`` takes for a second iteration. The memory counts are untouched."""

    def _pre_fw_hook(self, module, inputs) -> None:
        name = self._mod_tracker.get_known_fqn(module)
        again = module in self.memory_tracking and not self._mod_tracker.is_bw
        if again and set(self._mod_tracker.parents) - {name} == {"Global"}:
            self.reset_mod_stats()
        super()._pre_fw_hook(module, inputs)


def _kinds(snapshot: dict) -> dict[str, int]:
    """MemTracker's ``{device: {kind: bytes}}`` summed over devices, ``Total`` left out."""
    out: dict[str, int] = {}
    for per_device in snapshot.values():
        for kind, nbytes in per_device.items():
            if kind != "Total":
                name = getattr(kind, "value", str(kind))
                out[name] = out.get(name, 0) + nbytes
    return out


def _phase_peaks(tracker: MemTracker) -> dict[str, int]:
    """Peak bytes over every tracked module in forward and in backward (the second step's)."""
    out = {"forward": 0, "backward": 0}
    for stats in tracker.memory_tracking.values():
        for state, snaps in stats.snapshots.items():
            phase = {"Peak-Forward": "forward", "Peak-Backward": "backward"}.get(state.value)
            for snap in snaps if phase else ():
                out[phase] = max(out[phase], sum(d.get("Total", 0) for d in snap.values()))
    return out


SDPA_FORWARDS = (
    "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention",
)


def score_recompute(counter: FlopCounterMode, args) -> int:
    """FLOPs that SDPA's backward spends recomputing ``q k^T`` (``sdpa_backward_flop_count``'s
    first term): the forwards' ``q k^T`` share, ``qk / (qk + v)`` of their count for head widths
    ``qk`` and ``v`` (MLA: ``qk_nope + qk_rope`` and ``v_head_dim``). ``num_flops_per_token``
    counts no recomputation (the model's FLOPs, not the hardware's)."""
    if hasattr(args, "v_head_dim"):
        qk, v = args.qk_nope_head_dim + args.qk_rope_head_dim, args.v_head_dim
    else:
        qk = v = args.head_dim
    counts = counter.get_flop_counts().get("Global", {})
    forward = sum(
        n for op, n in counts.items() if str(op).removesuffix(".default") in SDPA_FORWARDS
    )
    return forward * qk // (qk + v)


def run_rank(run: ResolvedRun, options: Options, rank: int, dims, stage: int | None) -> RankResult:
    """Build and run :data:`STEPS` training steps of ``rank`` (fake unless ``options.real``); the
    caller started the process group and ``dims``' mesh."""
    begin = time.perf_counter()
    device = torch.device("cpu")
    info = DistInfo(
        rank, dims.world_size, 0, 1, device, "fake" if not options.real else "gloo", dims
    )
    trainer = Trainer.for_steps(run, info, StartupLog())
    model = trainer.model
    plan = trainer.spec.init_plan(trainer.args)
    with unset_fake_temporarily():  # the mesh's coordinates are host tensors
        for _, tensor in resolve_plan(model, plan, partial=trainer.pipeline is not None):
            local_box(tensor)  # each rank's shard bookkeeping, as init_weights computes it
    if hasattr(model, "init_buffers"):
        model.init_buffers(device)
    if options.real:
        _real_init(trainer, plan)
    batches = fake_batches(run, device)
    tracker = StepTracker()
    tracker.track_external(model, trainer.optimizer)
    states = sum(_kinds(tracker.get_tracker_snapshot("current")).values())
    with tracker:
        for step in range(1, STEPS + 1):
            if step == STEPS:
                tracker.reset_mod_stats()
            with (
                FlopCounterMode(display=False) as flops,
                CollectiveCounter() as comms,
                RoutingShapes() if not options.real else nullcontext(),
            ):
                trainer.train_step(batches, step, sync=False)
    peak_snapshot = tracker.get_tracker_snapshot("peak")
    by_phase = {"states": states, **_phase_peaks(tracker)}
    plan_items, plan_bytes = save_plan(trainer)
    counts = comms.counts
    return RankResult(
        rank=rank,
        stage=stage,
        peak=sum(d.get("Total", 0) for d in peak_snapshot.values()),
        peak_by_kind=_kinds(peak_snapshot),
        by_phase=by_phase,
        flops=flops.get_total_flops(),
        model_flops=flops.get_total_flops() - score_recompute(flops, trainer.args),
        collectives=counts,
        plan_items=plan_items,
        plan_bytes=plan_bytes,
        seconds=time.perf_counter() - begin,
    )


def _real_init(trainer: Trainer, plan) -> None:
    """``--real``: the init plan drawn into the real tensors (the trainer's ``init_weights``)."""
    init_weights(
        trainer.model,
        plan,
        trainer.config.training.seed,
        buffer_device=trainer.info.device,
        partial=trainer.pipeline is not None,
    )


def save_plan(trainer: Trainer) -> tuple[int, int]:
    """``(items, bytes)`` of this rank's DCP save plan of the checkpointer's state dict (model,
    optimizer, lr schedule); nothing is written."""
    checkpointer = Checkpointer(
        "unused",
        model=trainer.model,
        optimizer=trainer.optimizer,
        lr_scheduler=trainer.scheduler,
        dataloader=None,
        dims=trainer.info.dims,
        device=trainer.info.device,
        meta={},
    )
    state = checkpointer._state(None, ("optimizer", "lr_scheduler"), trainer.info.dims.dp_rank)
    planner = DefaultSavePlanner()
    planner.set_up_planner(state, is_coordinator=trainer.info.rank == 0)
    with unset_fake_temporarily():  # the mesh's coordinates are host tensors
        items = planner.create_local_plan().items
    nbytes = 0
    for item in items:
        if item.tensor_data is not None:
            size = item.tensor_data.chunk.sizes
            numel = 1
            for n in size:
                numel *= n
            nbytes += numel * item.tensor_data.properties.dtype.itemsize
    return len(items), nbytes


def simulate(run: ResolvedRun, options: Options) -> list[RankResult]:
    """Every simulated rank of ``run`` on ``options.world_size`` fake ranks, one process group and
    mesh at a time."""
    dims = check_world_size(run.config, options.world_size)
    results = []
    for stage, rank in enumerate(simulated_ranks(dims)):
        dims = check_world_size(run.config, options.world_size)  # a fresh mesh per rank
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=options.world_size)
        try:
            dims.build_mesh("cpu")  # real mesh tensors: DeviceMesh reads its ranks on the host
            with FakeTensorMode(allow_non_fake_inputs=True):
                results.append(run_rank(run, options, rank, dims, stage if dims.pp > 1 else None))
        finally:
            dist.destroy_process_group()
    return results


def real(run: ResolvedRun, options: Options) -> list[RankResult]:
    """``--real``: this process's rank with real tensors, under torchrun's process group (gloo) or a
    1-rank one."""
    info = init_distributed(run.config)
    try:
        stage = info.dims.pp_rank if info.dims.pp > 1 else None
        result = run_rank(run, options, info.rank, info.dims, stage)
        results: list[RankResult | None] = [None] * info.world_size
        dist.all_gather_object(results, result)
        return results
    finally:
        dist.destroy_process_group()


def report(run: ResolvedRun, options: Options, results: list[RankResult], seconds: float) -> str:
    """The lines of the per-rank report, the last one as the module docstring gives it."""
    config = run.config
    dims = check_world_size(config, options.world_size)
    seq_len = config.training.seq_len
    per_token = run.spec.num_flops_per_token(run.model_args, seq_len)
    lines = []
    for r in results:
        which = f"rank {r.rank}" + (f" (stage {r.stage})" if r.stage is not None else "")
        kinds = ", ".join(f"{k} {v / GIB:.3f}" for k, v in r.peak_by_kind.items() if v)
        phases = ", ".join(f"{k} {v / GIB:.3f}" for k, v in r.by_phase.items())
        lines.append(f"{which}: peak {r.peak / GIB:.3f} GiB; by kind at the peak (GiB): {kinds}")
        lines.append(f"{which}: by phase (GiB): {phases}")
        lines.append(
            f"{which}: {r.flops:,} FLOPs in step {STEPS} (FlopCounterMode), {r.model_flops:,} "
            "without the attention backward's recomputed scores"
        )
        lines.append(
            f"{which}: collectives in step {STEPS}: "
            + (", ".join(f"{k} {v}" for k, v in sorted(r.collectives.items())) or "none")
        )
        lines.append(
            f"{which}: DCP save plan of {r.plan_items} items, {r.plan_bytes / GIB:.3f} GiB "
            f"(nothing written); {r.seconds:.1f} s"
        )
    training = config.training
    global_bs = training.global_batch_size
    global_bs = training.local_batch_size * dims.dp_degree if global_bs == -1 else global_bs
    share = dims.tp * dims.cp * dims.pp  # the ranks that split one data-parallel rank's work
    formula = per_token * global_bs * seq_len / dims.dp_degree / share
    model = sum(r.model_flops for r in results) / len(results)
    lines.append(
        f"num_flops_per_token {per_token:,.0f} x {global_bs * seq_len // dims.dp_degree:,} tokens"
        f" per data-parallel rank and step / {share} = {formula:,.0f} per rank; measured (mean "
        f"over the simulated ranks, without recomputed scores) / formula = {model / formula:.4f}; "
        f"{seconds:.1f} s in all"
    )
    worst = max(results, key=lambda r: r.peak)
    which = (
        f"rank {worst.rank}, stage {worst.stage}"
        if worst.stage is not None
        else f"rank {worst.rank}"
    )
    estimate = run_estimate(run, options.world_size, options.device).total
    fits = "yes" if worst.peak <= options.device_memory_gib * GIB else "no"
    what = "real" if options.real else "simulated"
    device = "cpu" if options.device == "cpu" else "cuda"
    lines.append(
        f"{what} {config.model.name} {config.model.flavor} on {options.world_size} ranks "
        f"({layout_text(dims, config, dims.tp > 1 and config.parallelism.enable_loss_parallel)}):"
        f" peak {worst.peak / GIB:.3f} GiB per rank ({which}), preflight estimate "
        f"{estimate / GIB:.3f} GiB; fits {device} {options.device_memory_gib:g} GiB: {fits}"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """The tool: 0 when the simulation ran; 2 and one ``config error:`` line for a bad config."""
    begin = time.perf_counter()
    try:
        options, args = parse_options(argv)
        run = target_run(parse_run(args), options.device)
        check_world_size(run.config, options.world_size)
        if options.real:
            world = int(os.environ.get("WORLD_SIZE", "1"))
            if world != options.world_size:
                raise ConfigError(
                    f"--real runs under torchrun's {world} rank(s); pass --world-size {world}"
                )
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    try:
        results = real(run, options) if options.real else simulate(run, options)
    except UserError as err:
        print(f"input error: {err}", file=sys.stderr)
        return 2
    except (DataDependentOutputException, DynamicOutputShapeException) as err:
        print(
            f"error: the step reads a value that depends on the data ({err.func}), which fake "
            "tensors do not have: this layout is not simulated yet (docs/simulate.md)",
            file=sys.stderr,
        )
        return 1
    if not options.real or int(os.environ.get("RANK", "0")) == 0:
        print(report(run, options, results, time.perf_counter() - begin), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
