"""Reading and checking the configuration before any work starts: ``python -m torchtitan_lite.config <args>``.

Every problem is a :class:`ConfigError` whose message is one line naming the key and where it was set
(``train.toml line 12``, ``command line`` or ``default``). ``python -m torchtitan_lite.config`` (what
``run_train.sh`` runs before torchrun) validates everything, including paths, and exits 0 silently, or
prints ``config error: <line>`` to stderr and exits 2, before any process group, folder or file exists.

Model arguments: ``[model.overrides]`` (or ``--model.overrides.<field>=value``) replaces fields of the
flavor's args dataclass; :func:`build_model_args` applies them. With ``checkpoint.initial_load_hf`` the family and
the sizes come from the folder's ``config.json`` (``model.flavor`` then defaults to ``hf``; a flavor or an override
that disagrees with the folder is an error naming the field: ``torchtitan_lite/components/hf/args.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import typing
from typing import Any

import tomli

from torchtitan_lite.config.cli import (
    COMMAND_LINE,
    BadValue,
    ConfigError,
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
from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.errors import InputError


def parse_args(argv: list[str]) -> JobConfig:
    """The validated configuration from command-line tokens (``sys.argv[1:]``, without ``--help``).

    Checks types, bounds, cross-field rules and the model (name, flavor, overrides); paths are checked
    by :func:`check_paths`.

    Raises:
        ConfigError: any problem, one line naming the key and where it was set.
    """
    config, sources = _read(argv)
    _check_cross_fields(config, sources)
    _check_activation_checkpoint_and_compile(config, sources)
    _model_from_hf_folder(config, sources)
    _check_model(config, sources)
    _check_model_fit(config, sources)
    _check_layout_fits_model(config, sources)
    return config


def _read(argv: list[str]) -> tuple[JobConfig, dict[str, str]]:
    """The config the file and command line set, and where each key given was set (keys and types checked only).

    Raises:
        ConfigError: a bad file, key or value.
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
    return config, sources


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
    if not data:
        raise ConfigError(f"job.config_file: empty config file {path}; remove CONFIG_FILE to train the defaults "
                          "(train_configs/qwen3_debug.toml), or give the file some [section] keys")
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
    """Rules that involve several keys (the world size: :func:`check_world_size`)."""
    for key, value in (("job.dump_folder", config.job.dump_folder), ("checkpoint.folder", config.checkpoint.folder),
                       ("metrics.save_tb_folder", config.metrics.save_tb_folder)):
        if not value.strip():
            raise ConfigError(f"{_where(sources, key)}: is empty, which would write into the current folder (or the "
                              "folder above); name a folder, e.g. the default")
    training = config.training
    gbs, lbs = training.global_batch_size, training.local_batch_size
    if gbs != -1 and (gbs < 1 or gbs % lbs):
        raise ConfigError(f"{_where(sources, 'training.global_batch_size')}: {gbs} is not a positive multiple of "
                          f"training.local_batch_size {lbs}; use a multiple, or -1 for local_batch_size * data-parallel degree")
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
        raise ConfigError(f"{_where(sources, 'parallelism.data_parallel_shard_degree')}: must be -1 (the ranks left "
                          f"by the other degrees) or >= 1, got {dp}")
    if training.dataset == "hf" and not training.hf_dataset_name:
        raise ConfigError(f"{_where(sources, 'training.hf_dataset_name')}: dataset = \"hf\" needs a hub dataset "
                          "name, e.g. allenai/c4")
    if training.dataset != "hf" and training.hf_dataset_name is not None:
        raise ConfigError(f"{_where(sources, 'training.hf_dataset_name')}: is set but training.dataset is "
                          f"{training.dataset!r}; set training.dataset = \"hf\" to use a hub dataset")
    if training.dataset == "hf" and training.dataset_path is not None:
        raise ConfigError(f"{_where(sources, 'training.dataset_path')}: local files and dataset = \"hf\" exclude "
                          "each other; unset one of them")
    if training.streaming and training.dataset == "shakespeare" and training.dataset_path is None:
        raise ConfigError(f"{_where(sources, 'training.streaming')}: the shakespeare plays are read in memory; "
                          "streaming is for training.dataset_path or dataset = \"hf\"")
    if config.validation.sample_prompt is not None and not config.validation.enable:
        raise ConfigError(f"{_where(sources, 'validation.sample_prompt')}: samples are written at each validation, "
                          "and validation.enable is false; enable validation or unset the prompt")
    if training.streaming and training.dataset_path is not None and config.validation.enable:
        raise ConfigError(f"{_where(sources, 'validation.enable')}: a streamed local dataset (training.dataset_path "
                          "with training.streaming) has no validation split; set --validation.enable=false, or "
                          "training.streaming=false to hold out the end of the data")


def _check_activation_checkpoint_and_compile(config: JobConfig, sources: dict[str, str]) -> None:
    """``activation_checkpoint.selective_ac_option`` is "op" or a positive integer; ``compile.backend`` is a
    registered ``torch.compile`` backend."""
    from torchtitan_lite.distributed.activation_checkpoint import selective_every

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


def _model_from_hf_folder(config: JobConfig, sources: dict[str, str]) -> None:
    """With ``checkpoint.initial_load_hf``: ``model.name`` becomes the folder's family and ``model.flavor`` becomes
    ``hf`` (every size from the folder), unless they were given where ``initial_load_hf`` was or later (in the same
    file, or on the command line): then a different family is an error and the flavor must agree with the folder
    (so ``run_train.sh --checkpoint.initial_load_hf=DIR`` works with any config file)."""
    from torchtitan_lite.components.hf.args import HF_FLAVOR, folder_family
    from torchtitan_lite.components.hf.folder import HFError

    folder = config.checkpoint.initial_load_hf
    if folder is None:
        if config.model.flavor == HF_FLAVOR:
            raise ConfigError(f"{_where(sources, 'model.flavor')}: 'hf' takes the sizes from "
                              "checkpoint.initial_load_hf, which is not set; set it or pick a flavor")
        return
    try:
        family, _ = folder_family(folder)
    except HFError as err:
        raise ConfigError(f"checkpoint.initial_load_hf: {err}") from None
    level = _precedence(sources, "checkpoint.initial_load_hf")
    if _precedence(sources, "model.name") >= level and config.model.name != family:
        raise ConfigError(f"{_where(sources, 'model.name')}: {config.model.name!r} but checkpoint.initial_load_hf "
                          f"{folder} holds a {family} model (config.json model_type); drop model.name or use "
                          f"{family}")
    config.model.name = family
    if _precedence(sources, "model.flavor") < level:
        config.model.flavor = HF_FLAVOR


def _precedence(sources: dict[str, str], key: str) -> int:
    """Where ``key`` was set: 0 default, 1 the config file, 2 the command line."""
    return 0 if key not in sources else 2 if sources[key] == COMMAND_LINE else 1


def _check_model(config: JobConfig, sources: dict[str, str]) -> None:
    """``model.name``, ``model.flavor`` and ``model.overrides`` against the registry; coerces overrides."""
    from models import get_model_spec, model_names
    from torchtitan_lite.components.hf.args import HF_FLAVOR
    from torchtitan_lite.components.hf.folder import HFError

    model = config.model
    if model.name not in model_names():
        raise ConfigError(f"{_where(sources, 'model.name')}: unknown model {model.name!r}; "
                          f"known models: {', '.join(model_names())}")
    flavors = get_model_spec(model.name).flavors
    if model.flavor not in flavors and model.flavor != HF_FLAVOR:
        raise ConfigError(f"{_where(sources, 'model.flavor')}: {model.name} has no flavor {model.flavor!r}; "
                          f"flavors: {', '.join(flavors)}, or hf (the sizes of checkpoint.initial_load_hf)")
    args = flavors.get(model.flavor, flavors["debug"])
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
    except HFError as err:
        raise ConfigError(f"checkpoint.initial_load_hf: {err}") from None
    except (ValueError, TypeError) as err:
        keys = ", ".join(f"model.overrides.{name}" for name in model.overrides) or "model.tie_embeddings"
        raise ConfigError(f"{keys}: the {model.name} flavor {model.flavor!r} rejects the result: {err}") from None


def _check_model_fit(config: JobConfig, sources: dict[str, str]) -> None:
    """``training.seq_len <= max_seq_len`` of the model, and ``selective_ac_option = "k"`` leaves a block to
    checkpoint (``k <= n_layers``)."""
    from torchtitan_lite.distributed.activation_checkpoint import selective_every

    args = build_model_args(config)
    seq_len = config.training.seq_len
    if seq_len > args.max_seq_len:
        raise ConfigError(f"{_where(sources, 'training.seq_len')}: {seq_len} exceeds the model's max_seq_len "
                          f"{args.max_seq_len}; lower it or set --model.overrides.max_seq_len={seq_len}")
    ac = config.activation_checkpoint
    every = selective_every(ac.selective_ac_option) if ac.mode == "selective" else None
    n_layers = args.n_layers
    if every is not None and every > n_layers:
        raise ConfigError(f"{_where(sources, 'activation_checkpoint.selective_ac_option')}: {ac.selective_ac_option!r} "
                          f"checkpoints no block of the {n_layers}-layer model; use a value <= {n_layers}")


TP_SPLIT_FIELDS = ("n_heads", "n_kv_heads", "vocab_size", "hidden_dim")
"""Model-args fields that tensor parallelism splits into ``tensor_parallel_degree`` equal parts where a family has
them: attention heads (column-wise q/k/v), key/value heads (GQA: each rank keeps whole kv heads), the vocabulary
(vocab-parallel embedding and output) and the dense SwiGLU width (column-wise w1/w3)."""


def _check_layout_fits_model(config: JobConfig, sources: dict[str, str]) -> None:
    """The parallel degrees fit the model: ``tensor_parallel_degree`` divides every :data:`TP_SPLIT_FIELDS` field
    the model has (and ``training.seq_len`` under sequence parallelism); ``expert_parallel_degree`` > 1 needs experts
    and divides ``num_experts``; ``pipeline_parallel_degree`` has a layer
    per stage, its stages are a multiple of it, and ``pipeline_parallel_microbatch_size`` divides
    ``training.local_batch_size``. (The product of the degrees against the world size: :func:`check_world_size`.)"""
    par = config.parallelism
    args = build_model_args(config)
    tp, tp_key = par.tensor_parallel_degree, _where(sources, "parallelism.tensor_parallel_degree")
    if tp > 1:
        for name in TP_SPLIT_FIELDS:
            value = getattr(args, name, None)
            if value is not None and value % tp:
                raise ConfigError(f"{tp_key}: {tp} does not divide the model's {name} {value} (tensor parallelism "
                                  f"splits it into {tp} equal parts); pick a tensor_parallel_degree that divides it")
        if par.enable_sequence_parallel and config.training.seq_len % tp:
            raise ConfigError(f"{tp_key}: {tp} does not divide training.seq_len {config.training.seq_len} (sequence "
                              f"parallelism splits the sequence); pick a multiple of {tp} or "
                              "--parallelism.enable_sequence_parallel=false")
    ep = par.expert_parallel_degree
    if ep > 1:
        experts = getattr(args, "num_experts", None)
        ep_key = _where(sources, "parallelism.expert_parallel_degree")
        if experts is None:
            raise ConfigError(f"{ep_key}: {ep} needs a mixture-of-experts model, but {config.model.name} has no "
                              "experts; set it to 1")
        if experts % ep:
            raise ConfigError(f"{ep_key}: {ep} does not divide the model's num_experts {experts} (each rank holds "
                              "whole experts); pick an expert_parallel_degree that divides it")
    if par.pipeline_parallel_degree > 1:
        _check_pipeline(config, args, sources)


def _check_pipeline(config: JobConfig, args: Any, sources: dict[str, str]) -> None:
    """Under ``pipeline_parallel_degree`` > 1: untied embeddings (the first stage owns the embedding, the last the
    output), no Hugging Face export (it writes the whole model from one rank),
    ``pipeline_parallel_microbatch_size`` dividing ``training.local_batch_size``, and a split into stages
    the schedule runs (:func:`torchtitan_lite.distributed.pipeline.stage_layer_ids`, the one place those rules
    live)."""
    from torchtitan_lite.distributed.pipeline import stage_layer_ids

    par = config.parallelism
    pp, pp_key = par.pipeline_parallel_degree, _where(sources, "parallelism.pipeline_parallel_degree")
    if getattr(args, "tie_embeddings", False):
        raise ConfigError(f"{pp_key}: {pp} pipeline stages need untied embeddings (the first stage owns "
                          f"tok_embeddings, the last the output), but {config.model.name} flavor {config.model.flavor} "
                          "ties them; use an untied flavor or --model.tie_embeddings=false")
    if config.checkpoint.export_hf is not None:
        raise ConfigError(f"{_where(sources, 'checkpoint.export_hf')}: the Hugging Face export writes the whole model "
                          f"from one rank, not from {pp} pipeline stages; export from the run's DCP checkpoint with "
                          "pipeline_parallel_degree 1 (--checkpoint.load_path=<step-N folder> --training.steps=N "
                          "trains nothing and exports)")
    micro, local = par.pipeline_parallel_microbatch_size, config.training.local_batch_size
    if local % micro:
        raise ConfigError(f"{_where(sources, 'parallelism.pipeline_parallel_microbatch_size')}: {micro} does not "
                          f"divide training.local_batch_size {local}; pick a divisor")
    key = ("pipeline_parallel_split_points" if par.pipeline_parallel_split_points else
           "pipeline_parallel_layers_per_stage" if par.pipeline_parallel_layers_per_stage is not None else
           "pipeline_parallel_degree")
    try:
        stage_layer_ids(args.n_layers, pp, par.pipeline_parallel_schedule, n_microbatches=local // micro,
                        layers_per_stage=par.pipeline_parallel_layers_per_stage,
                        split_points=par.pipeline_parallel_split_points)
    except ValueError as err:
        raise ConfigError(f"{_where(sources, f'parallelism.{key}')} with pipeline_parallel_schedule "
                          f"{par.pipeline_parallel_schedule}: {err}") from None


def check_world_size(config: JobConfig, world_size: int) -> None:
    """The parallel degrees multiply to ``world_size`` (what ``run_train.sh`` launches: ``NGPU`` x nodes).

    Raises:
        ConfigError: one line naming the degrees and the world size.
    """
    from torchtitan_lite.distributed.parallel_dims import ParallelDims
    from torchtitan_lite.errors import LaunchError

    try:
        ParallelDims.from_config(config.parallelism, world_size)
    except LaunchError as err:
        raise ConfigError(f"[parallelism] for world size {world_size} (NGPU x nodes): {err}") from None


WORLD_SIZE_ENV = "TORCHTITAN_LITE_WORLD_SIZE"
"""Environment variable through which ``run_train.sh`` tells ``python -m torchtitan_lite.config`` the world size it
is about to launch (NGPU x nodes); unset (or not a number): the degrees and the memory estimate are checked only
when the workers start."""


def build_model_args(config: JobConfig) -> Any:
    """The flavor's args dataclass with ``model.overrides`` and ``model.tie_embeddings`` (if set) applied; with
    ``checkpoint.initial_load_hf``, the folder's ``config.json`` values on top of the flavor, then the changes
    (``components/hf/args.py``).

    Raises:
        ValueError/TypeError: from the args dataclass's own checks (``parse_args`` turns them into a
            :class:`ConfigError`).
        HFError: the folder's config cannot be read or disagrees with the flavor or an override.
    """
    from models import get_model_spec
    from torchtitan_lite.components.hf.args import model_args_from_hf

    model = config.model
    changes = dict(model.overrides)
    if model.tie_embeddings is not None:
        changes["tie_embeddings"] = model.tie_embeddings
    if config.checkpoint.initial_load_hf is not None:
        return model_args_from_hf(config.checkpoint.initial_load_hf, model.name, model.flavor, changes)
    return dataclasses.replace(get_model_spec(model.name).flavors[model.flavor], **changes)


def tokenizer_path(config: JobConfig) -> str | None:
    """The run's ``tokenizer.json``: the one in ``checkpoint.initial_load_hf`` when the folder has one, else
    ``model.tokenizer_path`` (``None``: the bundled tokenizer)."""
    folder = config.checkpoint.initial_load_hf
    if folder is not None and os.path.isfile(os.path.join(folder, "tokenizer.json")):
        return os.path.join(folder, "tokenizer.json")
    return config.model.tokenizer_path


def check_paths(config: JobConfig) -> None:
    """The files the run reads exist and fit the model, and its output folders can be written; creates nothing.

    Checks, in order: ``model.tokenizer_path`` and ``training.dataset_path`` exist (a folder holds data files);
    the tokenizer (:func:`tokenizer_path`) reads and its vocab fits the model's (checked here only);
    ``job.dump_folder``, the checkpoint folder and ``checkpoint.export_hf`` can be created (and the family can
    export); the checkpoint to resume (if any) is complete, intact (sizes and ``meta.json``; the data files'
    checksums are verified when it is loaded) and from the same model; else the ``checkpoint.initial_load_hf``
    folder's files hold what the model needs, with the right shapes. (A run that writes the checkpoint folder:
    also :func:`check_checkpoint_folder`.)

    Raises:
        ConfigError: the first problem, one line naming the key or file.
    """
    from models import get_model_spec
    from torchtitan_lite.components import checkpoint as ckpt
    from torchtitan_lite.components.hf.folder import HFError
    from torchtitan_lite.components.hf.load import check_hf_folder
    from torchtitan_lite.data.loader import local_data_files
    from torchtitan_lite.data.tokenizer import build_tokenizer

    for key, path in (("model.tokenizer_path", config.model.tokenizer_path),
                      ("training.dataset_path", config.training.dataset_path),
                      ("checkpoint.load_path", config.checkpoint.load_path)):
        if path is not None and not os.path.exists(path):
            raise ConfigError(f"{key}: no such file or folder {path!r}")
    if config.training.dataset_path is not None:
        try:
            local_data_files(config.training.dataset_path)
        except InputError as err:
            raise ConfigError(f"training.dataset_path: {err}") from None
    args = build_model_args(config)
    try:
        tokenizer = build_tokenizer(tokenizer_path(config))
    except InputError as err:
        raise ConfigError(f"model.tokenizer_path: {err}") from None
    if tokenizer.vocab_size > args.vocab_size:
        raise ConfigError(f"model.tokenizer_path: tokenizer {tokenizer.path} has vocab_size {tokenizer.vocab_size} "
                          f"but the model has {args.vocab_size} embedding rows; set --model.overrides.vocab_size="
                          f"{tokenizer.vocab_size} (or more) or use a smaller tokenizer")
    _check_sample_prompt(config, tokenizer, args.max_seq_len)
    cp = config.checkpoint
    folder = ckpt.checkpoint_folder(config.job.dump_folder, cp.folder)
    _check_writable("job.dump_folder", config.job.dump_folder)
    if cp.enable:
        _check_writable("checkpoint.folder", folder)
    if cp.export_hf is not None:
        _check_writable("checkpoint.export_hf", cp.export_hf)
        if get_model_spec(config.model.name).state_dict_adapter is None:
            raise ConfigError(f"checkpoint.export_hf: model {config.model.name} has no Hugging Face state-dict "
                              "adapter (ModelSpec.state_dict_adapter); unset checkpoint.export_hf")
    try:
        path = ckpt.find_checkpoint(folder, cp.load_step, cp.load_path) if cp.enable or cp.load_path else None
        if path is not None:
            meta = ckpt.read_meta(path)
            ckpt.check_compatible(meta, path, config.model.name, config.model.flavor, ckpt.model_args_json(args))
        elif cp.initial_load_hf is not None:
            check_hf_folder(cp.initial_load_hf, config.model.name, args,
                            allow_unexpected=cp.initial_load_hf_allow_unexpected)
    except ckpt.CheckpointError as err:
        raise ConfigError(str(err)) from None
    except HFError as err:
        raise ConfigError(f"checkpoint.initial_load_hf: {err}") from None


def _check_sample_prompt(config: JobConfig, tokenizer, max_seq_len: int) -> None:
    """``validation.sample_prompt`` has tokens, and with ``validation.sample_tokens`` fits in ``max_seq_len``."""
    prompt = config.validation.sample_prompt
    if prompt is None:
        return
    n = len(tokenizer.encode(prompt))
    if n == 0 or n + config.validation.sample_tokens > max_seq_len:
        raise ConfigError(f"validation.sample_prompt: {n} tokens + validation.sample_tokens "
                          f"{config.validation.sample_tokens} must be between 1 and the model's max_seq_len "
                          f"{max_seq_len}; shorten the prompt or the sample")


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


def help_text(argv: list[str] = ()) -> str:
    """The ``--help`` text: every key with its type, default, bounds and documentation, and under each key that
    the config file or the command line in ``argv`` sets, its value there (``this run: 400
    (train_configs/qwen3_debug.toml line 16)``). A file or value that does not read is named in the title."""
    title = ("usage: run_train.sh [--section.key=value ...]   (also: --section.key value; bare --flag = true;\n"
             "       none/null unsets an optional key; lists are comma-separated)")
    try:
        config, sources = _read([arg for arg in argv if arg not in ("--help", "-h")])
        with contextlib.suppress(ConfigError):
            _check_model(config, sources)  # types the model.overrides given on the command line
    except ConfigError as err:
        return format_help(JobConfig, f"{title}\n\nthe values of this run are not shown: {err}")
    if sources:
        title += (f"\n\n'this run:' marks a value set by {config.job.config_file or 'the command line'}"
                  + (" or the command line" if config.job.config_file else "") + "; '=' gives the default")
    set_by = {key: (_value_of(config, key), where) for key, where in sources.items()}
    return format_help(JobConfig, title, set_by=set_by)


def _value_of(config: JobConfig, key: str) -> Any:
    """The value of ``section.key`` or ``section.table.name`` in ``config``."""
    section, name, *item = key.split(".")
    value = getattr(getattr(config, section), name)
    return value[item[0]] if item else value


def check_memory(config: JobConfig, world_size: int, ranks_sharing: int | None = None) -> str | None:
    """The memory one rank of a ``world_size``-rank run needs (:mod:`torchtitan_lite.config.memory`: parameters,
    gradients, AdamW moments and activations from the model's shapes) against its device's memory, or on CPU the
    host's, shared by ``ranks_sharing`` ranks (default: all); ``warning: ...`` when tight, else ``None``.

    Raises:
        ConfigError: clearly impossible (the numbers in the message), or ``training.device`` is not available.
    """
    from models import get_model_spec
    from torchtitan_lite.config.memory import estimate_rank_memory, fit_problem, memory_limit, meta_parameter_count
    from torchtitan_lite.distributed.devices import device_type
    from torchtitan_lite.errors import LaunchError

    try:
        kind = device_type(config.training.device)
    except LaunchError as err:
        raise ConfigError(f"training.device: {err}") from None
    args = build_model_args(config)
    n_params = meta_parameter_count(get_model_spec(config.model.name).model_cls, args)
    fp32 = config.training.compute_dtype == "float32" or (config.training.compute_dtype == "auto" and kind == "cpu")
    estimate = estimate_rank_memory(n_params, args, world_size=world_size, seq_len=config.training.seq_len,
                                    local_batch_size=config.training.local_batch_size, compute_bytes=4 if fp32 else 2,
                                    ac_mode=config.activation_checkpoint.mode,
                                    dense_scores=config.model.attn_backend == "reference")
    total, available, name = memory_limit(kind)
    problem = fit_problem(estimate, ranks_sharing=(ranks_sharing or world_size) if kind == "cpu" else 1, total=total,
                          available=available, name=name, world_size=world_size)
    if problem is None:
        return None
    level, text = problem
    if level == "error":
        raise ConfigError(f"memory: the model has {n_params:,} parameters and {text}")
    return f"warning: {text}"


def check_checkpoint_folder(config: JobConfig) -> None:
    """For a run that will write its checkpoint folder (``checkpoint.enable``): no other run holds the folder's
    lock, and no ``step-N`` in it is anything but a complete checkpoint (a save of step N would fail on it after
    training). Reads only.

    Raises:
        ConfigError: one line naming the folder and the holder or the entry.
    """
    from torchtitan_lite.components import checkpoint as ckpt

    if not config.checkpoint.enable:
        return
    folder = ckpt.checkpoint_folder(config.job.dump_folder, config.checkpoint.folder)
    try:
        ckpt.check_unlocked(folder)
        ckpt.check_leftovers(folder)
    except ckpt.CheckpointError as err:
        raise ConfigError(str(err)) from None


def load_config(argv: list[str], world_size: int | None = None) -> JobConfig:
    """:func:`parse_args` + :func:`check_paths` + :func:`check_checkpoint_folder` (+ :func:`check_world_size` and the
    error part of :func:`check_memory` when ``world_size`` is given): the checks of a training run.

    Raises:
        ConfigError: the first problem.
    """
    config = parse_args(argv)
    if world_size is not None:
        check_world_size(config, world_size)
    check_paths(config)
    check_checkpoint_folder(config)
    from torchtitan_lite.components.attention import check_attention_config
    check_attention_config(config, build_model_args(config))
    if world_size is not None:
        check_memory(config, world_size)
    return config


def load_config_or_exit(argv: list[str], world_size: int | None = None) -> JobConfig:
    """:func:`load_config` for entry points.

    ``--help``/``-h``: prints :func:`help_text` and exits 0. ``--job.print_config``: prints the resolved
    config as TOML and exits 0. A :class:`ConfigError` is printed as ``config error: <line>`` on stderr and
    exits 2.
    """
    if "--help" in argv or "-h" in argv:
        print(help_text(argv))
        sys.exit(0)
    try:
        config = load_config(argv, world_size)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    if config.job.print_config:
        print(format_toml(config), end="")
        sys.exit(0)
    return config
