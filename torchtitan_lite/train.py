"""The trainer: ``python -m torchtitan_lite.train --job.config_file X.toml [--section.key=value
...]``.

Launched by ``run_train.sh`` through torchrun (one process per device). It starts in this order:
config -> preflight (resolve and check the run once) -> process group and mesh -> data -> model on
meta -> parallelize and materialize -> optimizer -> checkpoint folder lock -> load -> init of what
was not loaded -> run folder -> loop -> checkpoints -> HF export. The config and preflight steps are
the launcher's (``preflight/resolved.py``), or this worker's when started without it;
docs/design.md, "Where the code is". The loop logs a line per step and TensorBoard scalars;
checkpoints are saved every ``checkpoint.interval`` steps, at the end and on SIGTERM/SIGINT
(``faults.py``); a stop request between the start-up phases ends the run with nothing to save.

Exit status of ``main``: 0 (done, or stopped by a signal after saving or before the first step); 2
for a :class:`~torchtitan_lite.errors.UserError` raised while reading the config or building the run
(one ``config error: ...`` or ``input error: ...`` line); 1 for one raised while training (one
``error: ...`` line) and for any other exception, a bug, which propagates with its traceback.
torchrun then stops the other workers; under ``run_train.sh`` the line also goes to the launcher
(``faults.report_outcome``). Nothing is written to disk before the inputs are checked.

Note: docs/design.md, "on the loss over a global batch".
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from torchtitan_lite.builder import (
    build_meta_model,
    build_pipelined_model,
    compute_dtype,
    init_model,
    parallelize_model,
)
from torchtitan_lite.components.checkpoint.checkpointer import (
    Checkpointer,
    TrainState,
    expected_bytes,
)
from torchtitan_lite.components.checkpoint.hold import hold_checkpoint_folder
from torchtitan_lite.components.checkpoint.meta import model_args_json
from torchtitan_lite.components.checkpoint.resume import (
    config_values,
    load_at_start,
    schedule_settings,
)
from torchtitan_lite.components.checkpoint.storage import checkpoint_folder
from torchtitan_lite.components.determinism import enable_deterministic
from torchtitan_lite.components.generation import generate
from torchtitan_lite.components.hf.args import state_dict_adapter
from torchtitan_lite.components.hf.export import export_hf
from torchtitan_lite.components.loss import build_loss_fn, cross_entropy_sum
from torchtitan_lite.components.lr_schedule import build_lr_scheduler, warmup_clipped_line
from torchtitan_lite.components.metrics import (
    MetricsLogger,
    StartupLog,
    folder_bytes,
    format_bytes,
    format_duration,
    process_cpu_s,
)
from torchtitan_lite.components.optimizer import build_optimizer, clip_grad_norm_, muon_settings
from torchtitan_lite.components.peak_flops import mixed_peak_flops, peak_flops
from torchtitan_lite.components.profiling import StepProfiler
from torchtitan_lite.components.tb_extras import log_layer_grad_norms, log_weight_histograms
from torchtitan_lite.config.cli import ConfigError, format_toml
from torchtitan_lite.data.documents import document_inputs
from torchtitan_lite.data.loader import DataLoaders, build_dataloaders
from torchtitan_lite.data.tokenizer import build_tokenizer
from torchtitan_lite.distributed.agreement import check_nodes_agree
from torchtitan_lite.distributed.checks import check_deterministic, micro_batches
from torchtitan_lite.distributed.compile import compiles
from torchtitan_lite.distributed.context_parallel import ContextParallel, set_context_parallel
from torchtitan_lite.distributed.deterministic import (
    PairwiseSum,
    canonical_loss_sum,
    install_canonical_reduction,
    optimizer_implementation,
)
from torchtitan_lite.distributed.devices import peak_memory_bytes
from torchtitan_lite.distributed.float8 import (
    float8_flops_per_token,
    float8_line,
    float8_settings,
    precompute_scales,
)
from torchtitan_lite.distributed.grad_norm import clip_grad_norm_layout_invariant_
from torchtitan_lite.distributed.pipeline import gather_stages
from torchtitan_lite.distributed.process_group import (
    DistInfo,
    init_distributed,
    shutdown_distributed,
)
from torchtitan_lite.distributed.tensor_parallel import loss_parallel_context
from torchtitan_lite.errors import UserError
from torchtitan_lite.init import draw
from torchtitan_lite.init.fingerprint import model_fingerprint
from torchtitan_lite.init.report import (
    InitReport,
    init_report,
    init_report_summary,
    write_init_report,
)
from torchtitan_lite.init.step1 import InitCheckError, check_step1_loss
from torchtitan_lite.lifecycle.console_log import ConsoleLog
from torchtitan_lite.lifecycle.faults import (
    NonFiniteGuard,
    Stopped,
    StopRequest,
    exit_with_launcher,
    peer_failed,
)
from torchtitan_lite.lifecycle.run_folder import create_run_folder
from torchtitan_lite.lifecycle.startup import (
    STEP1_TERMS,
    layout_text,
    memory_and_compile_line,
    step1_check_line,
    step1_expectation,
    step1_line,
)
from torchtitan_lite.lifecycle.worker_exit import exit_after, exit_on_bug, say, without_config_file
from torchtitan_lite.preflight.checks import load_run, load_run_or_exit
from torchtitan_lite.preflight.memory import check_memory
from torchtitan_lite.preflight.resolved import RESOLVED_CONFIG_ENV, read_resolved
from torchtitan_lite.preflight.run import ResolvedRun


@dataclass
class StepStats:
    """What one optimizer step produced, left on the device: the host reads it only when it logs.

    Attributes:
        loss_sum: 0-dim fp32 tensor, THIS rank's summed token cross-entropy over its micro-batches
            (under pipeline parallelism its pipeline's, on every stage; all-reduce it over the
            data-parallel ranks and divide by the step's global token count for the loss). With
            ``training.deterministic = "layout"``: the step's sum over all ranks in the canonical
            order on data-parallel rank 0, 0.0 on the others (the same all-reduce then gives it
            exactly; ``distributed/deterministic.py``).
        grad_norm: 0-dim fp32 tensor, the global gradient norm before clipping (equal on all ranks).
        lr: learning rate the step used.
        data_wait_s: seconds this rank waited for its batches (fetch and host-to-device copy).
    """

    loss_sum: torch.Tensor
    grad_norm: torch.Tensor
    lr: float
    data_wait_s: float


class Trainer:
    """One training run, built from a :class:`ResolvedRun` on every rank, in the start-up order of
    docs/design.md ("Where the code is").

    ``stop``: when given, a stop request agreed between the start-up phases raises
    :class:`~torchtitan_lite.lifecycle.faults.Stopped` (nothing was trained, nothing is saved).
    """

    def __init__(
        self,
        run: ResolvedRun,
        stop: StopRequest | None = None,
        startup: StartupLog | None = None,
        console: ConsoleLog | None = None,
    ):
        """Build ``run``, printing a line per start-up phase (:class:`StartupLog`; ``startup``
        already holds the config line when given). ``console``: the worker's :class:`ConsoleLog`,
        opened as ``<run folder>/logs/rank<N>.log`` once the run folder exists."""
        self.run, self.config, self.spec, self.args = run, run.config, run.spec, run.model_args
        self.startup, self.stop = startup or StartupLog(), stop
        self._start_process_group()  # self.info: device, process group, mesh
        memory_warning = check_memory(run, self.info.world_size, self.info.local_world_size)
        deterministic_line = self._configure_rank()
        self.tokenizer = build_tokenizer(run.tokenizer_path)
        self.data = self._build_data(self.tokenizer)
        self.train_loader, self.val_loader = self.data.train, self.data.validation
        self._phase_done("loading the data")
        self.whole = self._build_meta_model()  # the whole model's names, shapes and ties
        self.model = self._parallelize()
        self._phase_done("the model build")
        self.optimizer, self.scheduler = self._build_optimizer()
        self.checkpointer = self._build_checkpointer()
        self.train_state = self._load_and_init(memory_warning)
        training = self.config.training
        self.guard = NonFiniteGuard(
            training.nonfinite_policy,
            training.max_skipped_steps,
            self.train_state.skipped_steps,
            device=self.info.device,
        )
        self._open_run_folder(console, deterministic_line)

    @classmethod
    def for_steps(cls, run: ResolvedRun, info: DistInfo, startup: StartupLog) -> Trainer:
        """The parts of a trainer that :meth:`train_step` needs, on ``info``'s mesh (its process
        group started by the caller): the model parallelized and materialized, uninitialized (the
        caller initializes it), its hooks, optimizer and lr schedule; no data, checkpoint folder
        or run folder, so the caller passes :meth:`train_step` its own batches
        (``tools/simulate.py``, which runs it under fake tensors and a fake process group)."""
        self = cls.__new__(cls)
        self.run, self.config, self.spec, self.args = run, run.config, run.spec, run.model_args
        self.startup, self.stop, self.info = startup, None, info
        self._configure_rank()
        self.whole = build_meta_model(run)
        self.model = self._parallelize()
        self.optimizer, self.scheduler = self._build_optimizer()
        training = self.config.training
        self.guard = NonFiniteGuard(
            training.nonfinite_policy, training.max_skipped_steps, 0, device=info.device
        )
        self.tensorboard = False
        return self

    def _start_process_group(self) -> None:
        """``self.info``: device, process group and mesh (:func:`init_distributed`); on several
        nodes, their configs agree."""
        info = self.info = init_distributed(self.config)
        if info.world_size > info.local_world_size:  # several nodes: each launcher resolved its own
            check_nodes_agree(self.config, info.cpu_group)
        self._phase_done("the process group start")

    def _configure_rank(self) -> str | None:
        """Determinism, seed, loss parallelism, float8, compute dtype and batch split; the ``process
        group`` line and the global batch note. The deterministic-algorithms line to print later, if
        any."""
        config, info, say = self.config, self.info, self.startup
        check_deterministic(config, info.dims)
        self.layout_invariant = config.training.deterministic == "layout"
        deterministic = config.debug.deterministic or config.training.deterministic != "off"
        deterministic_line = enable_deterministic() if deterministic else None
        torch.manual_seed(config.training.seed)
        self.loss_parallel = info.dims.tp > 1 and config.parallelism.enable_loss_parallel
        self.float8 = float8_settings(config)
        self.dtype = compute_dtype(config, info.device)
        say.phase(
            "process group",
            f"{info.backend}, world size {info.world_size}, "
            f"{layout_text(info.dims, config, self.loss_parallel)}; device "
            f"{info.device}, compute dtype "
            f"{str(self.dtype).removeprefix('torch.')}, threads per rank {torch.get_num_threads()}",
        )
        self.global_batch, self.accum = micro_batches(config, info.dims.dp_degree)
        say.note(
            f"global batch {self.global_batch} x {config.training.seq_len} tokens = "
            f"{self.global_batch * config.training.seq_len:,} tokens/step, {self.accum} "
            "micro-batch(es) per data-parallel rank"
        )
        return deterministic_line

    def _build_meta_model(self) -> nn.Module:
        """The whole model on meta and ``n_params``; the ``model`` line."""
        whole = build_meta_model(self.run)
        self.n_params = sum(p.numel() for p in whole.parameters())
        model, tied = self.config.model, getattr(self.args, "tie_embeddings", False)
        self.startup.phase(
            "model",
            f"{model.name} flavor {model.flavor} on meta: "
            f"{self.n_params:,} parameters (tied embeddings: {tied}), "
            f"vocab_size {self.args.vocab_size}, tokenizer vocab {self.tokenizer.vocab_size}",
        )
        return whole

    def _parallelize(self) -> nn.Module:
        """The model parallelized and on the device, uninitialized (the pipeline's stages under
        pipeline parallelism), its loss function and training hooks; the float8 note."""
        info, self.pipeline = self.info, None
        forwards = self.accum  # model forwards per rank per step
        if info.dims.pp > 1:
            self.pipeline = build_pipelined_model(self.run, info)
            model = self.pipeline.model
            forwards *= self.pipeline.n_microbatches
        else:
            model = parallelize_model(build_meta_model(self.run), self.run, info)
        self.cp = None  # context parallelism: this rank's share of every window
        if info.dims.cp > 1:
            self.cp = ContextParallel(
                info.dims.cp_mesh.get_group(),
                info.dims.cp,
                info.dims.cp_rank,
                self.config.training.seq_len,
            )
            set_context_parallel(model, self.cp)
        if self.float8 is not None:
            self.startup.note(float8_line(model, self.float8))
        self.loss_fn = build_loss_fn(self.config, info.device)
        self.hooks = self.spec.training_hooks(model, info.dims, forwards)
        if self.layout_invariant:
            install_canonical_reduction(model, info.dims, self.accum)
        return model

    def _build_optimizer(self) -> tuple[torch.optim.Optimizer, object]:
        """``(optimizer, lr scheduler)``; the warmup-clipped note, the ``parallelize`` line, the
        pipeline's."""
        config, say = self.config, self.startup
        opt, sched = config.optimizer, config.lr_scheduler
        optimizer = build_optimizer(
            self.model,
            lr=opt.lr,
            betas=(opt.beta1, opt.beta2),
            eps=opt.eps,
            weight_decay=opt.weight_decay,
            decay_embeddings=opt.decay_embeddings,
            decay_norms_and_biases=opt.decay_norms_and_biases,
            implementation=optimizer_implementation(config),
            muon=muon_settings(opt),
        )
        scheduler = build_lr_scheduler(
            optimizer,
            warmup_steps=sched.warmup_steps,
            steps=config.training.steps,
            decay_ratio=sched.decay_ratio,
            decay_type=sched.decay_type,
            min_lr_factor=sched.min_lr_factor,
        )
        clipped = warmup_clipped_line(
            warmup_steps=sched.warmup_steps,
            steps=config.training.steps,
            decay_ratio=sched.decay_ratio,
        )
        if clipped:
            say.note(clipped)
        fused = optimizer.defaults["fused"]
        device = self.info.device
        say.phase(
            "parallelize",
            f"{memory_and_compile_line(config, device.type, fused)}; materialized on {device}",
        )
        if self.pipeline is not None:
            say.note(self.pipeline.describe())
        return optimizer, scheduler

    def _build_checkpointer(self) -> Checkpointer:
        """The checkpointer of the run's checkpoint folder (async only with
        ``checkpoint.enable``)."""
        config, info, cp = self.config, self.info, self.config.checkpoint
        values = config_values(config)
        return Checkpointer(
            checkpoint_folder(config.job.dump_folder, cp.folder),
            model=self.model,
            optimizer=self.optimizer,
            lr_scheduler=self.scheduler,
            dataloader=self.train_loader,
            dims=info.dims,
            device=info.device,
            keep_latest_k=cp.keep_latest_k,
            async_mode=cp.async_mode if cp.enable else "disabled",
            meta={
                "model": config.model.name,
                "flavor": config.model.flavor,
                "model_args": model_args_json(self.args),
                "config": values,
                "lr_schedule": schedule_settings(values),
            },
        )

    def _open_run_folder(self, console: ConsoleLog | None, deterministic_line: str | None) -> None:
        """The run folder, the rank's console log in it, the metrics logger, the profiler; the last
        start-up lines (determinism, run folder), the init report, the first weight histograms."""
        config, info, say = self.config, self.info, self.startup
        self.run_folder = create_run_folder(
            config, info.rank, info.world_size, info.local_world_size
        )
        log_path = None
        if console:
            log_path = console.open(Path(self.run_folder) / "logs" / f"rank{info.rank}.log")
        flops_per_token = self.spec.num_flops_per_token(self.args, config.training.seq_len)
        self.metrics = MetricsLogger(
            self.run_folder,
            enable_tensorboard=config.metrics.enable_tensorboard,
            tb_subfolder=config.metrics.save_tb_folder,
            rank=info.rank,
            log_freq=config.metrics.log_freq,
            total_steps=config.training.steps,
            world_size=info.world_size,
            num_flops_per_token=flops_per_token,
            peak_flops=mixed_peak_flops(
                flops_per_token,
                float8_flops_per_token(self.whole, self.float8),
                peak_flops(info.device, self.dtype),
                peak_flops(info.device, torch.float8_e4m3fn),
            ),
            cpu_threads=torch.get_num_threads() if info.device.type == "cpu" else None,
        )
        kept = (
            ["config.toml", "run.json"]
            + ([f"logs/{log_path.name}"] if log_path else [])
            + ([f"{config.metrics.save_tb_folder}/"] if config.metrics.enable_tensorboard else [])
        )
        if deterministic_line:
            say.note(deterministic_line)
        say.note(
            f"run folder {self.run_folder}: {', '.join(kept)}; start-up took {say.total_s():.1f} s"
        )
        self.metrics.log_text(say.lines, echo=False)
        self._log_init_report()
        debug = config.debug
        self.tensorboard = config.metrics.enable_tensorboard
        if self.tensorboard and debug.histogram_freq >= 0:
            log_weight_histograms(self.metrics.writer, self.model, self.train_state.step)
        self.profiler = StepProfiler(
            self.run_folder,
            enable=debug.profile,
            start_step=debug.profile_start_step,
            steps=debug.profile_steps,
            rank=info.rank,
            device=info.device,
        )
        if self.profiler.memory_note:
            self.metrics.log_text([self.profiler.memory_note])

    def _phase_done(self, phase: str) -> None:
        """A safe point between start-up phases: raise ``Stopped`` on every rank if a stop was
        requested."""
        if self.stop is not None:
            self.stop.check(phase, self.info.cpu_group)

    def _load_and_init(self, memory_warning: str | None) -> TrainState:
        """Take the checkpoint folder (with ``checkpoint.enable``,
        :func:`~torchtitan_lite.components.checkpoint.hold.hold_checkpoint_folder`) before anything
        is read from it, load what there is to load
        (:func:`~torchtitan_lite.components.checkpoint.resume.load_at_start`), initialize the rest
        from the init plan, and print the ``load`` and ``init`` lines (and, for a fresh init, the
        expected step-1 loss; ``memory_warning`` if any); the train state. The lock is released if
        this fails."""
        begin = time.perf_counter()
        self.lock, folder_lines = None, []
        if self.config.checkpoint.enable:
            self.lock, folder_lines = hold_checkpoint_folder(
                self.checkpointer.folder, self.model, self.info.rank
            )
        try:
            train_state, loaded, describe_load = load_at_start(
                self.config, self.checkpointer, self.scheduler, self.model, self.args
            )
            self._phase_done(
                "loading the checkpoint" if train_state.step else "the checkpoint check"
            )
        except BaseException:
            if self.lock is not None:
                self.lock.release()
            raise
        load_s, begin = time.perf_counter() - begin, time.perf_counter()
        self.plan = self.spec.init_plan(self.args)
        self.init_result = res = init_model(
            self.model, self.run, self.info.device, skip=loaded, partial=self.pipeline is not None
        )
        self.fingerprint = model_fingerprint(self.model)
        self.check_step1 = not loaded
        batch_data = self.train_loader.dataset if self.check_step1 else None
        self.expected = step1_expectation(self.whole, self.plan, batch_data, self.global_batch)
        self._phase_done("the weight init")
        self.report = None
        if self.config.debug.init_report:
            self.report = init_report(self.model, self.plan, res)
        counts = torch.tensor(
            [res.initialized_tensors, res.initialized_elements, res.skipped_tensors],
            device=self.info.device,
        )
        if self.pipeline is not None:  # each stage initialized its own tensors
            dist.all_reduce(counts, group=self.pipeline.group)
            if self.report is not None:
                parts = gather_stages(self.report, self.pipeline.group)
                self.report = InitReport([row for part in parts for row in part.rows])
        initialized, elements, skipped = counts.tolist()
        init_s = time.perf_counter() - begin
        self.load_lines = describe_load(skipped)
        if self.load_lines:
            self.startup.phase("load", self.load_lines[0], seconds=load_s)
        warnings = [memory_warning] if memory_warning else []
        for line in self.load_lines[1:] + folder_lines + warnings:
            self.startup.note(line)
        kernels = f"{draw.compile_note()}; " if draw.compile_note() else ""
        self.startup.phase(
            "init",
            f"{initialized} tensors ({elements:,} elements) initialized, "
            f"{skipped} loaded; {kernels}fingerprint {self.fingerprint}",
            seconds=init_s,
        )
        if self.check_step1:
            detail = self.config.debug.init_report
            terms = "every term: the next line" if detail else STEP1_TERMS
            self.startup.note(
                step1_line(
                    self.expected,
                    self.expected.repeat_rate > 0,
                    terms,
                    mtp_depths=getattr(self.args, "mtp_num_layers", 0),
                )
            )
            if detail:
                self.startup.note(self.expected.describe())
        return train_state

    def _build_data(self, tokenizer) -> DataLoaders:
        """The training and validation loaders (:func:`build_dataloaders`) and their start-up line;
        a validation split too small for one batch per rank leaves validation off with one warning
        line."""
        cfg, info = self.config, self.info
        t = cfg.training
        data = build_dataloaders(
            validation=cfg.validation.enable,
            min_val_windows=self.global_batch,
            dataset=t.dataset,
            dataset_path=t.dataset_path,
            dataset_paths=t.dataset_paths,
            dataset_weights=t.dataset_weights,
            hf_dataset_name=t.hf_dataset_name,
            hf_dataset_config=t.hf_dataset_config,
            streaming=t.streaming,
            text_column=t.text_column,
            tokenizer=tokenizer,
            seq_len=t.seq_len,
            local_batch_size=t.local_batch_size,
            dp_rank=info.dims.dp_rank,
            dp_world_size=info.dims.dp_degree,
            seed=t.seed,
            pin_memory=info.device.type != "cpu",
            rank_block=self.accum if self.layout_invariant else 1,
            documents=t.document_masking,
        )
        self.startup.phase("data", data.describe(t.steps, self.global_batch))
        if data.validation_off:
            self.startup.note(f"warning: validation off: {data.validation_off}")
        return data

    def _log_init_report(self) -> None:
        """``debug.init_report``: the report printed (rank 0), its summary line, its files in the
        run folder."""
        if self.report is None:
            return
        if self.info.rank == 0:
            print(f"{self.report.by_pattern()}\n\n{self.report}", flush=True)
            paths = write_init_report(self.report, self.run_folder)
        self.metrics.log_text(
            [init_report_summary(self.report)]
            + ([f"init report written to {paths[0]} and {paths[1]}"] if self.info.rank == 0 else [])
        )

    def _check_step1(self, loss: float) -> None:
        """Compare step 1's loss with the init plan's expectation: a warning line, or
        (``debug.strict_init``) :class:`~torchtitan_lite.init.step1.InitCheckError` naming the
        parameter."""
        debug, margin = self.config.debug, self.config.debug.init_loss_margin
        heads = {
            "loss": loss,
            **{
                f"{name} loss": value
                for name, value in self.hooks.step1_heads(self.config.training.seq_len).items()
            },
        }
        problems = [
            p if name == "loss" else f"{name}: {p}"
            for name, value in heads.items()
            for p in check_step1_loss(self.expected, value, margin=margin, report=self.report)
        ]
        if problems and debug.strict_init:
            raise InitCheckError("; ".join(problems) + " (debug.strict_init is on)")
        parts = [
            step1_check_line(self.expected, value, margin, what=name)
            for name, value in heads.items()
        ]
        line = "; ".join([parts[0], *(part.removeprefix("step-1 check: ") for part in parts[1:])])
        self.metrics.log_text([f"warning: {p}" for p in problems] or [line])

    def forward_backward(self, batches) -> tuple[torch.Tensor, float]:
        """Forward and backward of this rank's ``accum`` micro-batches of one step (under pipeline
        parallelism each through the schedule, in ``pipeline.n_microbatches`` pieces); gradients
        accumulate (see the note on the loss over a global batch).

        Returns:
            ``(loss_sum, data_wait_s)``: the summed token cross-entropy of this rank's batches
            (0-dim fp32 on the device; under pipeline parallelism the last stage's, summed over the
            pipeline so that every stage holds it: one small all-reduce, no host sync) and the
            seconds it waited for its batches.
        """
        device = self.info.device
        tokens_global = self.global_batch * self.config.training.seq_len
        loss_sum = torch.zeros((), device=device)
        micro_losses = PairwiseSum()  # training.deterministic = "layout": the canonical order
        data_wait_s = 0.0
        for _ in range(self.accum):
            fetch = time.perf_counter()
            batch = (t.to(device, non_blocking=True) for t in next(batches))
            inputs, labels, *ids = batch  # ids: document masking
            data_wait_s += time.perf_counter() - fetch
            with loss_parallel_context(self.loss_parallel):
                if self.pipeline is not None:
                    loss_sum += self.pipeline.step(inputs, labels, scale=1.0 / tokens_global)
                    continue
                documents = document_inputs(
                    ids[0] if ids else None, self.config.training.document_positions
                )
                if self.cp is not None:  # this rank's positions of the windows, labels with them
                    inputs, labels, documents = self.cp.split(inputs, labels, documents)
                logits = self.model(inputs, **documents, labels=labels)  # labels: MTP
                micro_loss = self.loss_fn(logits, labels)
                (micro_loss / tokens_global).backward()
            loss_sum += micro_loss.detach()
            if self.layout_invariant:
                micro_losses.push(micro_loss.detach())
        if self.layout_invariant:
            loss_sum = canonical_loss_sum(micro_losses, self.info.dims, self.accum)
        if self.pipeline is not None:
            dist.all_reduce(loss_sum, group=self.pipeline.group)
        return loss_sum, data_wait_s

    def train_step(self, batches, step: int, *, sync: bool = True) -> StepStats:
        """Optimizer step ``step`` over ``accum`` micro-batches of this rank
        (:meth:`forward_backward`).

        No host-device sync unless ``sync`` (the trainer passes it on log and checkpoint steps): the
        loss and gradient norm stay on the device and the non-finite guard records them there (see
        ``faults.py``); with ``sync`` (always under ``nonfinite_policy = skip``) the ranks agree on
        them before the update, which is then skipped or the run stopped.
        """
        tokens_global = self.global_batch * self.config.training.seq_len
        loss_sum, data_wait_s = self.forward_backward(batches)
        if self.tensorboard and self.metrics.due(step):
            log_layer_grad_norms(self.metrics.writer, self.model, step)  # before clipping
        dims = self.info.dims
        if self.layout_invariant:
            grad_norm = clip_grad_norm_layout_invariant_(self.model, self.config.training.max_norm)
        else:
            grad_norm = clip_grad_norm_(
                self.model.parameters(),
                self.config.training.max_norm,
                pp_mesh=dims.pp_mesh if dims.pp > 1 else None,
            )
        lr = self.scheduler.get_last_lr()[0]
        self.guard.record(step, loss_sum * dims.loss_degree / tokens_global, grad_norm)
        if self.guard.apply_update(step, sync=sync):
            self.optimizer.step()
        precompute_scales(self.model, self.float8)
        self.hooks.after_optimizer_step(step)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepStats(loss_sum=loss_sum, grad_norm=grad_norm, lr=lr, data_wait_s=data_wait_s)

    @torch.no_grad()
    def validate(self) -> tuple[float, int]:
        """``(mean token cross-entropy, tokens scored)`` over the first ``validation.steps`` global
        batches of the validation windows (fewer if the split ends), the same on every rank.

        Map-style data: the windows are the same on every layout with this global batch
        (:class:`OrderedWindows`), each rank's micro-batch of ``local_batch_size`` windows gives one
        fp32 cross-entropy sum, and the sums of all ranks are gathered and added exactly
        (``math.fsum``), so the loss depends on the micro-batches' forwards only: bitwise the same
        on every data-parallel layout in ``training.deterministic = "layout"``. Streamed data is
        read per rank (its windows depend on the layout)."""
        self.model.eval()
        sums, tokens = [], 0
        for i, batch in enumerate(self.val_loader):
            if i == self.config.validation.steps * self.accum:
                break
            inputs, labels, *ids = (t.to(self.info.device) for t in batch)
            with loss_parallel_context(self.loss_parallel):
                if self.pipeline is None:
                    documents = document_inputs(
                        ids[0] if ids else None, self.config.training.document_positions
                    )
                    if self.cp is not None:
                        inputs, labels, documents = self.cp.split(inputs, labels, documents)
                    loss = cross_entropy_sum(self.model(inputs, **documents), labels)
                else:  # the last stage's sum (0 on the others)
                    loss = self.pipeline.evaluate(inputs, labels)
            sums.append(loss.detach().float().reshape(1))
            tokens += labels.numel()
        self.model.train()
        local = torch.cat(sums)
        ranks = self.info.dims.loss_degree  # every token once: data- x context-parallel ranks
        gathered = torch.empty(local.numel() * ranks, dtype=local.dtype, device=local.device)
        dist.all_gather_single(gathered, local, group=self.info.dims.loss_group)
        if self.pipeline is not None:  # the last stage's sums to every stage (adding 0 is exact)
            dist.all_reduce(gathered, group=self.pipeline.group)
        tokens *= ranks
        return math.fsum(gathered.tolist()) / tokens, tokens

    def sample(self) -> str:
        """The greedy continuation of ``validation.sample_prompt`` (``validation.sample_tokens``
        tokens; every rank runs the same forwards, so FSDP gathers as in validation and all ranks
        get the same text)."""
        cfg, cc = self.config.validation, self.config.compile
        compiled = compiles(cc.enable, cc.components, cc.backend, self.info.device.type, "model")
        self.model.eval()
        set_context_parallel(self.model, None)  # every rank decodes the whole prompt
        ids = generate(
            self.model,
            self.tokenizer.encode(cfg.sample_prompt),
            cfg.sample_tokens,
            device=self.info.device,
            eos_id=self.tokenizer.eos_id,
            use_cache=self.info.dims.tp == 1 and not compiled,
        )  # no TP split, recompile
        set_context_parallel(self.model, self.cp)
        self.model.train()
        return self.tokenizer.decode(ids)

    def train(self, stop: StopRequest) -> None:
        """Train from the resumed step to ``training.steps``; validate every ``validation.freq``
        steps and at the end; save every ``checkpoint.interval`` steps, at the end, and when
        ``stop`` is agreed (after a step or a save); the checkpoint folder's lock is released at the
        end."""
        try:
            self._train(stop)
        finally:
            if self.lock is not None:
                self.lock.release()

    def _train(self, stop: StopRequest) -> None:
        cfg, state = self.config, self.train_state
        batches = iter(self.train_loader)
        self.checkpointer.restore_rng()
        tokens_global = self.global_batch * cfg.training.seq_len
        tokens_per_device = tokens_global / self.info.world_size  # a TP/PP group shares them
        start, start_cpu_s = time.perf_counter(), process_cpu_s()
        self.model.train()
        idle = state.step >= cfg.training.steps and cfg.checkpoint.export_hf is None
        if state.step >= cfg.training.steps:
            removed = "; the run folder is removed" if idle else ""
            self.metrics.log_text(
                [
                    f"step {state.step} reached training.steps = "
                    f"{cfg.training.steps}: nothing to train{removed}"
                ]
            )
        data_wait_s, step_s, save_s, stopped = 0.0, 0.0, None, False
        checkpoint_bytes = expected_bytes(self.model)
        for step in range(state.step + 1, cfg.training.steps + 1):
            step_start = time.perf_counter()
            log_due = self.metrics.due(step)
            last = step == cfg.training.steps
            save_due = cfg.checkpoint.enable and (step % cfg.checkpoint.interval == 0 or last)
            with self.profiler.step(step):
                stats = self.train_step(batches, step, sync=log_due or save_due)
            data_wait_s += stats.data_wait_s
            state.step, state.skipped_steps = step, self.guard.skipped
            state.tokens_seen += tokens_global
            if log_due:
                dist.all_reduce(stats.loss_sum, group=self.info.dims.loss_group)
                loss = stats.loss_sum.item() / tokens_global  # waits for the device
                self.metrics.log_step(
                    step,
                    loss=loss,
                    grad_norm=stats.grad_norm.item(),
                    lr=stats.lr,
                    tokens_per_step=tokens_per_device,
                    elapsed_s=time.perf_counter() - start,
                    memory_bytes=peak_memory_bytes(self.info.device),
                    data_wait_s=data_wait_s,
                    cpu_s=process_cpu_s() - start_cpu_s,
                )
                data_wait_s = 0.0
                summary = step % cfg.validation.freq == 0 or step == cfg.training.steps
                self.metrics.log_source_tokens(
                    step, self.data.tokens_per_source(state.tokens_seen), echo=summary
                )  # printed with the summary lines
                if step == 1 and self.check_step1:
                    self._check_step1(loss)
            freq = cfg.debug.histogram_freq
            if self.tensorboard and freq > 0 and step % freq == 0:
                with self.metrics.paused():
                    log_weight_histograms(self.metrics.writer, self.model, step)
            summary_due = step % cfg.validation.freq == 0 or step == cfg.training.steps
            if log_due or summary_due:
                report = self.hooks.report(step)
                self.metrics.log_scalars(step, report.scalars)
                for note in report.notes:
                    self.metrics.log_line(note)
                if summary_due and report.summary is not None:
                    self.metrics.log_line(report.summary)
            if self.val_loader is not None and (step % cfg.validation.freq == 0 or last):
                with self.metrics.paused():
                    self.metrics.log_validation(step, *self.validate())
                    if cfg.validation.sample_prompt is not None:
                        self.metrics.log_sample(step, cfg.validation.sample_prompt, self.sample())
            step_s = max(step_s, time.perf_counter() - step_start)
            saved = None
            if save_due:
                save_start = time.perf_counter()
                with self.metrics.paused():
                    saved = self._save(force=False)
                save_s = max(save_s or 0.0, time.perf_counter() - save_start)
            if self.info.local_rank == 0:  # each node's launcher waits that long after a stop
                stop.publish_budget(step_s, save_s, checkpoint_bytes)
            if stop.agreed(self.info.cpu_group):
                if save_due:
                    saved = self.checkpointer.finish() or saved
                else:
                    saved = self._save(force=True)
                what = (
                    f"checkpoint saved: {saved}"
                    if saved
                    else "checkpoint.enable = false: nothing saved"
                )
                self.metrics.log_text([f"stopped by a signal after step {step}; {what}"])
                stopped = True
                break
        self.profiler.close()
        if self.profiler.written:
            written = ", ".join(map(str, self.profiler.written))
            self.metrics.log_text([f"profile written: {written}"])
        self._log_saved(self.checkpointer.finish(), None)
        if cfg.checkpoint.export_hf is not None and not stopped:
            export_hf(
                self.model,
                cfg.checkpoint.export_hf,
                state_dict_adapter(cfg.model.name, self.args),
                self.tokenizer,
                dtype=cfg.checkpoint.export_hf_dtype,
                rank=self.info.rank,
                source_folder=cfg.checkpoint.initial_load_hf,
            )
            self.metrics.log_text(
                [f"exported the model in HF format to {cfg.checkpoint.export_hf}"]
            )
        if not stopped and not idle:
            self.metrics.log_text(
                [
                    f"done: step {state.step} of {cfg.training.steps} in "
                    f"{format_duration(time.perf_counter() - start)}; run folder {self.run_folder}"
                ]
            )
        self.metrics.close()
        if idle and self.info.rank == 0:  # a finished job run again leaves no folder of its own
            shutil.rmtree(self.run_folder, ignore_errors=True)

    def _save(self, force: bool) -> str | None:
        """Save a checkpoint if ``checkpoint.enable``; ``force`` waits for it. Its path, or
        ``None``.

        Raises:
            NonFiniteError: a rank recorded a non-finite step since the last check: nothing is
                saved.
        """
        if not self.config.checkpoint.enable:
            return None
        self.guard.check(self.train_state.step)
        self._log_saved(self.checkpointer.finish(), None)  # a background save of an earlier step
        begin = time.perf_counter()
        path = self.checkpointer.save(self.train_state)
        path = (self.checkpointer.finish() or path) if force else path
        if path is None:
            self.metrics.log_line(
                f"checkpoint step {self.train_state.step}: writing in the "
                f"background ({time.perf_counter() - begin:.1f} s of training time)"
            )
        self._log_saved(path, time.perf_counter() - begin)
        return path

    def _log_saved(self, path: str | None, seconds: float | None) -> None:
        """The line of a completed save at ``path`` (nothing for ``None``): size and seconds
        (``None``: written in the background)."""
        if path is not None:
            took = f"in {seconds:.1f} s" if seconds is not None else "written in the background"
            size = format_bytes(folder_bytes(path))
            self.metrics.log_line(f"checkpoint saved: {path} ({size}) {took}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of each worker: train and return 0; or print one line and return its status: a
    :class:`~torchtitan_lite.errors.UserError` raised while reading the config (``config error:
    ...``, 2) or building the run (``input error: ...``, 2) or while training (``error: ...``, 1),
    or a stop request before the first step (``stopped by a signal ...; nothing to save``, 0). Under
    ``run_train.sh`` the status and line also go to the control folder
    (:func:`~torchtitan_lite.lifecycle.faults.report_outcome`). Any other exception propagates with
    its traceback, unless another worker already reported a failure (then the exception is this
    worker losing its peer: 1, silently; see the note on failing workers in ``faults.py``). Launched
    by torchrun, the worker ends when torchrun or the launcher dies
    (:func:`~torchtitan_lite.lifecycle.faults.exit_with_launcher`). The worker's output is also
    written to ``<run folder>/logs/rank<N>.log`` (:class:`ConsoleLog`), a traceback included."""
    console = ConsoleLog()
    try:
        return _run(sys.argv[1:] if argv is None else argv, console)
    except Exception:
        if peer_failed():
            return 1
        console.copy_exception()
        raise
    except BaseException:
        console.copy_exception()
        raise
    finally:
        console.close()


def _run(args: list[str], console: ConsoleLog) -> int:
    """:func:`main` with the console log in place."""
    startup = StartupLog()
    stop = StopRequest()
    if "TORCHELASTIC_RUN_ID" in os.environ:
        exit_with_launcher()
    if "--help" in args or "-h" in args:
        load_run_or_exit(args)
    finished = False
    try:
        try:
            resolved = os.environ.get(RESOLVED_CONFIG_ENV)
            run = read_resolved(resolved) if resolved else load_run(args)
            config = run.config
            if config.job.print_config:
                print(format_toml(config), end="")
                return 0
            given = without_config_file(args)
            imports = ""
            if startup.import_s is not None:
                imports = f"; {startup.import_s:.1f} s of imports before it"
            job = f'; job "{config.job.description}"' if config.job.description else ""
            startup.phase(
                "config",
                f"{config.job.config_file or 'the defaults'}"
                + (f" with {' '.join(given)}" if given else "")
                + imports
                + job,
            )
            trainer = Trainer(run, stop, startup, console)
        except Stopped as done:
            finished = True
            return say(0, str(done), to_stdout=True)
        except ConfigError as err:
            return say(2, f"config error: {err}")
        except UserError as err:
            return say(2, f"input error: {err}")
        trainer.train(stop)
        finished = True
    except UserError as err:
        return say(1, f"error: {err}")
    finally:
        stop.restore()
        shutdown_distributed(in_step=finished)
    return 0


if __name__ == "__main__":
    try:
        status = main()
    except Exception:
        exit_on_bug()
    exit_after(status)
