"""The checks of ``[parallelism]``, ``[activation_checkpoint]`` and ``[compile]`` against the model,
run before any work starts (``preflight/checks.py`` calls them; one :class:`ConfigError` line naming
the key)."""

from __future__ import annotations

import math
from typing import Any

import torch

from torchtitan_lite.config.cli import ConfigError, suggestion
from torchtitan_lite.config.load import Sources, where
from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.distributed.activation_checkpoint import selective_every
from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.pipeline import stage_layer_ids
from torchtitan_lite.errors import LaunchError, UserError

TP_SPLIT_FIELDS = ("n_heads", "n_kv_heads", "vocab_size", "hidden_dim")
"""Model-args fields that tensor parallelism splits into ``tensor_parallel_degree`` equal parts
where a family has them: attention heads (column-wise q/k/v), key/value heads (GQA: each rank keeps
whole kv heads), the vocabulary (vocab-parallel embedding and output) and the dense SwiGLU width
(column-wise w1/w3)."""


def check_degrees(config: JobConfig, sources: Sources) -> None:
    """``data_parallel_shard_degree`` is -1 or positive (the product against the world size:
    :func:`check_world_size`)."""
    dp = config.parallelism.data_parallel_shard_degree
    if dp != -1 and dp < 1:
        raise ConfigError(
            f"{where(sources, 'parallelism.data_parallel_shard_degree')}: must be -1 (the ranks "
            f"left by the other degrees) or >= 1, got {dp}"
        )


def check_activation_checkpoint_and_compile(config: JobConfig, sources: Sources) -> None:
    """``activation_checkpoint.selective_ac_option`` is "op" or a positive integer;
    ``compile.backend`` is a registered ``torch.compile`` backend."""
    try:
        selective_every(config.activation_checkpoint.selective_ac_option)
    except ValueError as err:
        raise ConfigError(
            f"{where(sources, 'activation_checkpoint.selective_ac_option')}: {err}"
        ) from None
    backend = config.compile.backend
    if backend not in ("inductor", "aot_eager", "eager"):
        known = torch.compiler.list_backends(exclude_tags=())
        if backend not in known:
            raise ConfigError(
                f"{where(sources, 'compile.backend')}: unknown torch.compile backend {backend!r}"
                f"{suggestion(backend, known)}; known: {', '.join(known)}"
            )


def check_model_fit(config: JobConfig, args: Any, sources: Sources) -> None:
    """``training.seq_len <= max_seq_len`` of the model ``args``, and ``selective_ac_option = "k"``
    leaves a block to checkpoint (``k <= n_layers``)."""
    seq_len = config.training.seq_len
    if seq_len > args.max_seq_len:
        raise ConfigError(
            f"{where(sources, 'training.seq_len')}: {seq_len} exceeds the model's max_seq_len "
            f"{args.max_seq_len}; lower it or set --model.overrides.max_seq_len={seq_len}"
        )
    ac = config.activation_checkpoint
    every = selective_every(ac.selective_ac_option) if ac.mode == "selective" else None
    n_layers = args.n_layers
    if every is not None and every > n_layers:
        raise ConfigError(
            f"{where(sources, 'activation_checkpoint.selective_ac_option')}: "
            f"{ac.selective_ac_option!r} "
            f"checkpoints no block of the {n_layers}-layer model; use a value <= {n_layers}"
        )


def check_layout_fits_model(config: JobConfig, args: Any, sources: Sources) -> None:
    """The parallel degrees fit the model ``args``: ``tensor_parallel_degree`` divides every
    :data:`TP_SPLIT_FIELDS` field the model has (and ``training.seq_len`` under sequence
    parallelism); ``expert_parallel_degree`` > 1 needs experts and divides ``num_experts``; no
    tensor or pipeline parallelism with multi-token prediction (``mtp_num_layers``);
    ``pipeline_parallel_degree`` > 1: :func:`_check_pipeline`. (The product of the degrees against
    the world size: :func:`check_world_size`.)"""
    par = config.parallelism
    tp, tp_key = par.tensor_parallel_degree, where(sources, "parallelism.tensor_parallel_degree")
    if tp > 1:
        for name in TP_SPLIT_FIELDS:
            value = getattr(args, name, None)
            if value is not None and value % tp:
                raise ConfigError(
                    f"{tp_key}: {tp} does not divide the model's {name} {value} (tensor "
                    "parallelism "
                    f"splits it into {tp} equal parts); pick a tensor_parallel_degree that divides "
                    "it"
                )
        if par.enable_sequence_parallel and config.training.seq_len % tp:
            raise ConfigError(
                f"{tp_key}: {tp} does not divide training.seq_len {config.training.seq_len} "
                f"(sequence parallelism splits the sequence); pick a multiple of {tp} or "
                "--parallelism.enable_sequence_parallel=false"
            )
    ep = par.expert_parallel_degree
    if ep > 1:
        experts = getattr(args, "num_experts", None)
        ep_key = where(sources, "parallelism.expert_parallel_degree")
        if experts is None:
            raise ConfigError(
                f"{ep_key}: {ep} needs a mixture-of-experts model, but {config.model.name} has no "
                "experts; set it to 1"
            )
        if experts % ep:
            raise ConfigError(
                f"{ep_key}: {ep} does not divide the model's num_experts {experts} (each rank "
                "holds whole experts); pick an expert_parallel_degree that divides it"
            )
    mtp = getattr(args, "mtp_num_layers", 0)
    missing = {  # what each layout would need for the MTP modules (models/common/mtp.py)
        "tensor_parallel_degree": (
            "the MTP modules (eh_proj, their block) have no tensor-parallel plan"
        ),
        "pipeline_parallel_degree": (
            "the MTP modules would run on the last stage, but they read the token embedding, "
            "which the first stage owns"
        ),
    }
    for degree, name in (
        (tp, "tensor_parallel_degree"),
        (par.pipeline_parallel_degree, "pipeline_parallel_degree"),
    ):
        if mtp and degree > 1:
            raise ConfigError(
                f"{where(sources, f'parallelism.{name}')}: {degree} is not implemented with "
                f"multi-token prediction (model mtp_num_layers {mtp}): "
                f"{missing[name]}; use FSDP and expert parallelism, "
                "or --model.overrides.mtp_num_layers=0"
            )
    if par.context_parallel_degree > 1:
        _check_context_parallel(config, mtp, sources)
    if par.pipeline_parallel_degree > 1:
        _check_pipeline(config, args, sources)


def _check_context_parallel(config: JobConfig, mtp: int, sources: Sources) -> None:
    """Under ``context_parallel_degree`` > 1: ``training.seq_len`` a multiple of ``2 x cp`` (the
    load-balanced chunks), a rank's ``seq_len / cp`` positions a multiple of
    ``tensor_parallel_degree`` under sequence parallelism, no pipeline parallelism (a stage's
    micro-batches carry no positions), no multi-token prediction (its shifted inputs cross the
    chunks)."""
    par = config.parallelism
    cp = par.context_parallel_degree
    cp_key = where(sources, "parallelism.context_parallel_degree")
    seq_len = config.training.seq_len
    if seq_len % (2 * cp):
        raise ConfigError(
            f"{cp_key}: training.seq_len {seq_len} is not a multiple of 2 x {cp} (each "
            f"window is cut into {2 * cp} equal chunks); pick a seq_len that is"
        )
    tp = par.tensor_parallel_degree
    if tp > 1 and par.enable_sequence_parallel and (seq_len // cp) % tp:
        raise ConfigError(
            f"{cp_key}: each rank's {seq_len // cp} positions (training.seq_len "
            f"{seq_len} / {cp}) are not a multiple of tensor_parallel_degree {tp} "
            "(sequence parallelism splits them); pick a seq_len that is a multiple of "
            f"{cp * math.lcm(2, tp)}"
        )
    if par.pipeline_parallel_degree > 1:
        raise ConfigError(
            f"{cp_key}: {cp} is not implemented with pipeline_parallel_degree "
            f"{par.pipeline_parallel_degree} (the pipeline schedule passes no token "
            "positions or document ids to its stages); set one of them to 1"
        )
    if mtp:
        raise ConfigError(
            f"{cp_key}: {cp} is not implemented with multi-token prediction (model "
            f"mtp_num_layers {mtp}: its inputs are shifted along the whole window); use "
            "--model.overrides.mtp_num_layers=0"
        )


def _check_pipeline(config: JobConfig, args: Any, sources: Sources) -> None:
    """Under ``pipeline_parallel_degree`` > 1: untied embeddings (the first stage owns the
    embedding, the last the output), no Hugging Face export (it writes the whole model from one
    rank), ``pipeline_parallel_microbatch_size`` dividing ``training.local_batch_size``, and a split
    into stages the schedule runs (:func:`torchtitan_lite.distributed.pipeline.stage_layer_ids`, the
    one place those rules live)."""
    par = config.parallelism
    pp, pp_key = (
        par.pipeline_parallel_degree,
        where(sources, "parallelism.pipeline_parallel_degree"),
    )
    if getattr(args, "tie_embeddings", False):
        raise ConfigError(
            f"{pp_key}: {pp} pipeline stages need untied embeddings (the first stage owns "
            f"tok_embeddings, the last the output), but {config.model.name} flavor "
            f"{config.model.flavor} ties them; use an untied flavor or --model.tie_embeddings=false"
        )
    if config.checkpoint.export_hf is not None:
        raise ConfigError(
            f"{where(sources, 'checkpoint.export_hf')}: the Hugging Face export writes the whole "
            "model "
            f"from one rank, not from {pp} pipeline stages; export from the run's DCP checkpoint "
            "with "
            "pipeline_parallel_degree 1 (--checkpoint.load_path=<step-N folder> --training.steps=N "
            "trains nothing and exports)"
        )
    micro, local = par.pipeline_parallel_microbatch_size, config.training.local_batch_size
    if local % micro:
        raise ConfigError(
            f"{where(sources, 'parallelism.pipeline_parallel_microbatch_size')}: {micro} does not "
            f"divide training.local_batch_size {local}; pick a divisor"
        )
    key = (
        "pipeline_parallel_split_points"
        if par.pipeline_parallel_split_points
        else "pipeline_parallel_layers_per_stage"
        if par.pipeline_parallel_layers_per_stage is not None
        else "pipeline_parallel_degree"
    )
    try:
        stage_layer_ids(
            args.n_layers,
            pp,
            par.pipeline_parallel_schedule,
            n_microbatches=local // micro,
            layers_per_stage=par.pipeline_parallel_layers_per_stage,
            split_points=par.pipeline_parallel_split_points,
        )
    except ValueError as err:
        raise ConfigError(
            f"{where(sources, f'parallelism.{key}')} with pipeline_parallel_schedule "
            f"{par.pipeline_parallel_schedule}: {err}"
        ) from None


def check_world_size(config: JobConfig, world_size: int) -> ParallelDims:
    """The parallel degrees multiply to ``world_size`` (what ``run_train.sh`` launches: ``NGPU`` x
    nodes), split the global batch (:func:`batch_split_problem`) and suit
    ``training.deterministic`` (:func:`check_deterministic`); the resolved degrees.

    Raises:
        ConfigError: one line naming the degrees and the world size.
    """
    try:
        dims = ParallelDims.from_config(config.parallelism, world_size)
    except LaunchError as err:
        raise ConfigError(
            f"[parallelism] for world size {world_size} (NGPU x nodes): {err}"
        ) from None
    training = config.training
    if problem := batch_split_problem(
        training.global_batch_size, training.local_batch_size, dims.dp_degree
    ):
        raise ConfigError(problem)
    check_deterministic(config, dims)
    return dims


def batch_split_problem(global_bs: int, local_bs: int, dp_degree: int) -> str | None:
    """Why ``global_bs`` windows (-1: ``local_bs * dp_degree``) do not split into micro-batches of
    ``local_bs`` on ``dp_degree`` ranks, with the change that keeps the global batch if one exists;
    ``None`` if they do."""
    if global_bs == -1 or global_bs % (local_bs * dp_degree) == 0:
        return None
    if global_bs % dp_degree == 0:
        per_rank = global_bs // dp_degree
        local = max(d for d in range(1, local_bs + 1) if per_rank % d == 0)
        fix = f"keep the global batch with --training.local_batch_size={local}"
    else:
        step = local_bs * dp_degree
        fix = (
            f"set --training.global_batch_size={-(-global_bs // step) * step} "
            f"(a multiple of {step})"
        )
    return (
        f"training.global_batch_size = {global_bs} is not a multiple of local_batch_size * "
        f"data-parallel degree = {local_bs} * {dp_degree}; {fix}"
    )


class TrainingError(UserError, RuntimeError):
    """A setting the trainer cannot run with (see :mod:`torchtitan_lite.errors`)."""


def micro_batches(config: JobConfig, dp_degree: int) -> tuple[int, int]:
    """``(global_batch_size, micro-batches per step)`` for ``dp_degree`` data-parallel ranks.

    Raises:
        TrainingError: the global batch is not a multiple of ``local_batch_size * dp_degree``.
    """
    local = config.training.local_batch_size
    global_bs = config.training.global_batch_size
    if problem := batch_split_problem(global_bs, local, dp_degree):
        raise TrainingError(problem)
    global_bs = local * dp_degree if global_bs == -1 else global_bs
    return global_bs, global_bs // (local * dp_degree)


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def check_deterministic(config: JobConfig, dims: ParallelDims) -> None:
    """What ``training.deterministic = "layout"`` needs, for the layout ``dims``.

    Raises:
        ConfigError: one line naming the setting and the fix: tensor, expert or pipeline parallelism
            (they change the arithmetic inside a matmul or were not proven to keep the order),
            streaming data (read per rank, not a global stream),
            ``optimizer.implementation = "fused"``, pure replication (HSDP with ``dp_shard`` 1), or
            micro-batches per rank not a power of two on several data-parallel ranks.
    """
    training = config.training
    if training.deterministic != "layout":
        return
    where = 'training.deterministic = "layout"'
    for name, degree in (
        ("tensor_parallel_degree", dims.tp),
        ("expert_parallel_degree", dims.ep),
        ("context_parallel_degree", dims.cp),
        ("pipeline_parallel_degree", dims.pp),
    ):
        if degree > 1:
            raise ConfigError(
                f"{where} covers data parallelism only, but parallelism.{name} = {degree}; set it "
                "to 1, "
                'or use training.deterministic = "run"'
            )
    if training.streaming:
        raise ConfigError(
            f"{where} needs the global window stream, but training.streaming = true reads per "
            "rank; "
            'turn streaming off or use training.deterministic = "run"'
        )
    if config.optimizer.implementation == "fused":
        raise ConfigError(
            f'{where}: optimizer.implementation = "fused" rounds a shard\'s tail elements its own '
            "way; "
            'use "foreach" or "auto"'
        )
    if dims.dp_replicate > 1 and dims.dp_shard == 1:
        raise ConfigError(
            f"{where}: pure replication (data_parallel_replicate_degree = {dims.dp_replicate}, "
            "data_parallel_shard_degree = 1) all-reduces outside the canonical order; shard "
            "instead (data_parallel_shard_degree > 1)"
        )
    local, dp = training.local_batch_size, dims.dp_degree
    global_bs = local * dp if training.global_batch_size == -1 else training.global_batch_size
    per_rank = global_bs // (local * dp)
    if dp > 1 and not _is_power_of_two(per_rank):
        raise ConfigError(
            f"{where}: {per_rank} micro-batches per data-parallel rank (global_batch_size "
            f"{global_bs} / "
            f"(local_batch_size {local} x {dp} ranks)) is not a power of two; pick a global batch "
            "that makes it one"
        )
