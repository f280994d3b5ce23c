"""Checking the configuration before any work starts: load -> validate -> resolve
(``python -m torchtitan_lite.preflight <args>``, what ``run_train.sh`` runs once before torchrun).

:func:`parse_run` loads the TOML file and the command line (``config/load.py``), resolves the model
(``preflight/model_args.py``: the family and sizes of an HF folder, typed overrides, the model args
built once) and runs each component's checks of its own section: this module's of ``[job]``,
``[training]``'s batch, ``[lr_scheduler]`` and ``[debug]``; ``data/checks.py``;
``distributed/checks.py``; ``components/attention.py``; ``components/muon.py``. :func:`check_paths`
probes the files the run reads and the folders it writes (``data/checks.py``,
``components/checkpoint/checks.py``, ``components/hf/checks.py``); :func:`load_run` adds the
checkpoint folder's lock and, for a known world size, the parallel degrees and the memory estimate
(``preflight/memory.py``). Both give the :class:`~torchtitan_lite.preflight.run.ResolvedRun`. Every
problem is one :class:`ConfigError` line naming the key and where it was set; nothing is created.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from torchtitan_lite.components.attention import check_attention_config
from torchtitan_lite.components.checkpoint.checks import check_checkpoint_folder, check_resume
from torchtitan_lite.components.hf.checks import check_export, check_import
from torchtitan_lite.components.lr_schedule import fitted_warmup_steps
from torchtitan_lite.components.muon import check_muon_config
from torchtitan_lite.config.cli import ConfigError, format_help, format_toml
from torchtitan_lite.config.load import Sources, precedence, read_config, where
from torchtitan_lite.config.paths import check_exists, check_writable
from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.data.checks import check_data_settings, check_tokenizer, check_training_data
from torchtitan_lite.distributed.checks import (
    check_activation_checkpoint_and_compile,
    check_degrees,
    check_layout_fits_model,
    check_model_fit,
    check_world_size,
)
from torchtitan_lite.distributed.float8 import check_float8_config
from torchtitan_lite.preflight.memory import check_memory
from torchtitan_lite.preflight.model_args import resolve_model, type_overrides
from torchtitan_lite.preflight.run import ResolvedRun, resolved_run

WORLD_SIZE_ENV = "TORCHTITAN_LITE_WORLD_SIZE"
"""Environment variable through which ``run_train.sh`` tells ``python -m torchtitan_lite.preflight``
the world size it is about to launch (NGPU x nodes); unset (or not a number): the degrees and the
memory estimate are checked only when the workers start."""


def parse_args(argv: list[str]) -> JobConfig:
    """The config of :func:`parse_run`.

    Raises:
        ConfigError: as :func:`parse_run`.
    """
    return parse_run(argv).config


def parse_run(argv: list[str]) -> ResolvedRun:
    """The run of command-line tokens (``sys.argv[1:]``, without ``--help``), its model resolved
    once.

    Checks types, bounds, cross-field rules and the model (name, flavor, overrides) against every
    section; paths are checked by :func:`check_paths`.

    Raises:
        ConfigError: any problem, one line naming the key and where it was set.
    """
    config, sources = read_config(argv)
    _check_run_settings(config, sources)
    check_data_settings(config, sources)
    check_degrees(config, sources)
    check_activation_checkpoint_and_compile(config, sources)
    check_float8_config(config, sources)
    args = resolve_model(config, sources)
    check_model_fit(config, args, sources)
    check_layout_fits_model(config, args, sources)
    check_attention_config(config, args, sources)
    check_muon_config(config, sources)
    return resolved_run(config, args)


def _check_run_settings(config: JobConfig, sources: Sources) -> None:
    """The output folders are named; ``training.global_batch_size`` is a multiple of
    ``local_batch_size``; the LR warmup and decay fit in ``training.steps`` unless
    ``training.steps`` was set after (more specifically than) ``lr_scheduler.warmup_steps``, which
    the schedule then clips (a shortened run, :func:`fitted_warmup_steps`); a profiled step
    exists."""
    for key, value in (
        ("job.dump_folder", config.job.dump_folder),
        ("checkpoint.folder", config.checkpoint.folder),
        ("metrics.save_tb_folder", config.metrics.save_tb_folder),
    ):
        if not value.strip():
            raise ConfigError(
                f"{where(sources, key)}: is empty, which would write into the "
                "current folder (or the folder above); name a folder, e.g. the default"
            )
    training = config.training
    gbs, lbs = training.global_batch_size, training.local_batch_size
    if gbs != -1 and (gbs < 1 or gbs % lbs):
        raise ConfigError(
            f"{where(sources, 'training.global_batch_size')}: {gbs} is not a "
            f"positive multiple of training.local_batch_size {lbs}; use a multiple, "
            "or -1 for local_batch_size * data-parallel degree"
        )
    sched = config.lr_scheduler
    fit = fitted_warmup_steps(
        warmup_steps=sched.warmup_steps, steps=training.steps, decay_ratio=sched.decay_ratio
    )
    if fit < sched.warmup_steps and precedence(sources, "lr_scheduler.warmup_steps") >= precedence(
        sources, "training.steps"
    ):
        raise ConfigError(
            f"{where(sources, 'lr_scheduler.warmup_steps')}: {sched.warmup_steps} "
            f"warmup steps + {training.steps - fit} decay steps "
            f"(round(lr_scheduler.decay_ratio {sched.decay_ratio} * training.steps "
            f"{training.steps})) exceed {where(sources, 'training.steps')} "
            f"{training.steps}; set warmup_steps <= {fit}, lower decay_ratio, or train longer"
        )
    debug = config.debug
    if debug.profile and debug.profile_start_step > training.steps:
        raise ConfigError(
            f"{where(sources, 'debug.profile_start_step')}: "
            f"{debug.profile_start_step} is after the last step (training.steps = "
            f"{training.steps}); profile an earlier step"
        )


def check_paths(run: ResolvedRun, dp_degree: int | None = None) -> None:
    """The files ``run`` reads exist and fit its model, and its output folders can be written;
    creates nothing.

    Checks, in order: ``model.tokenizer_path``, ``training.dataset_path`` and
    ``checkpoint.load_path`` exist; the tokenizer (``run.tokenizer_path``) reads and its vocab fits
    the model's; the training data (:func:`~torchtitan_lite.data.checks.check_training_data`);
    ``job.dump_folder``, the checkpoint folder and ``checkpoint.export_hf`` can be created (and the
    family can export); the checkpoint to resume (if any) is complete, intact and from the same
    model (and, with ``dp_degree``, holds a streaming loader state this degree can load); else the
    ``checkpoint.initial_load_hf`` folder's files hold what the model needs, with the right shapes.
    (A run that writes the checkpoint folder: also :func:`check_checkpoint_folder`.)

    Raises:
        ConfigError: the first problem, one line naming the key or file.
    """
    config, args = run.config, run.model_args
    for key, path in (
        ("model.tokenizer_path", config.model.tokenizer_path),
        ("training.dataset_path", config.training.dataset_path),
        ("checkpoint.load_path", config.checkpoint.load_path),
    ):
        check_exists(key, path)
    tokenizer = check_tokenizer(config, run.tokenizer_path, args)
    check_training_data(config.training, tokenizer, args.vocab_size)
    check_writable("job.dump_folder", config.job.dump_folder)
    check_export(config)
    if check_resume(config, args, dp_degree) is None:
        check_import(config, args)


def load_run(argv: list[str], world_size: int | None = None) -> ResolvedRun:
    """:func:`parse_run` + :func:`check_paths` + :func:`check_checkpoint_folder` (+
    :func:`check_world_size` and the error part of :func:`check_memory` when ``world_size`` is
    given): the checks of a training run.

    Raises:
        ConfigError: the first problem.
    """
    run = parse_run(argv)
    dp_degree = None
    if world_size is not None:
        dp_degree = check_world_size(run.config, world_size).dp_degree
    check_paths(run, dp_degree)
    check_checkpoint_folder(run.config)
    if world_size is not None:
        check_memory(run, world_size)
    return run


def help_text(argv: list[str] = ()) -> str:
    """The ``--help`` text: every key with its type, default, bounds and documentation, and under
    each key that the config file or the command line in ``argv`` sets, its value there (``this run:
    400 (train_configs/qwen3_debug.toml line 16)``). A file or value that does not read is named in
    the title."""
    title = (
        "usage: run_train.sh [--section.key=value ...]   "
        "(also: --section.key value; bare --flag = true;\n"
        "       none/null unsets an optional key; lists are comma-separated)"
    )
    try:
        config, sources = read_config([arg for arg in argv if arg not in ("--help", "-h")])
        with contextlib.suppress(ConfigError):
            type_overrides(config, sources)  # types the model.overrides given on the command line
    except ConfigError as err:
        return format_help(JobConfig, f"{title}\n\nthe values of this run are not shown: {err}")
    if sources:
        title += (
            "\n\n'this run:' marks a value set by "
            + (config.job.config_file or "the command line")
            + (" or the command line" if config.job.config_file else "")
            + "; '=' gives the default"
        )
    set_by = {key: (_value_of(config, key), where_set) for key, where_set in sources.items()}
    return format_help(JobConfig, title, set_by=set_by)


def _value_of(config: JobConfig, key: str) -> Any:
    """The value of ``section.key`` or ``section.table.name`` in ``config``."""
    section, name, *item = key.split(".")
    value = getattr(getattr(config, section), name)
    return value[item[0]] if item else value


def load_run_or_exit(argv: list[str], world_size: int | None = None) -> ResolvedRun:
    """:func:`load_run` for entry points.

    ``--help``/``-h``: prints :func:`help_text` and exits 0. ``--job.print_config``: prints the
    resolved config as TOML and exits 0. A :class:`ConfigError` is printed as ``config error:
    <line>`` on stderr and exits 2.
    """
    if "--help" in argv or "-h" in argv:
        print(help_text(argv))
        sys.exit(0)
    try:
        run = load_run(argv, world_size)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    if run.config.job.print_config:
        print(format_toml(run.config), end="")
        sys.exit(0)
    return run
