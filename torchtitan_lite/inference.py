"""One process, one device: the model of a job config with trained weights, for ``generate`` and
``evaluate``.

The command line of a tool is its own options followed by the job's config options
(``--job.config_file``, ``--checkpoint.*``, ``--model.*``, ...), checked like the trainer's
(``preflight/checks.py``; one ``config error:`` line and exit 2 on bad input, before any work).
Weights come from, in order: ``checkpoint.load_path`` (a ``step-N`` folder of a training run, with
the job's config), ``checkpoint.initial_load_hf`` (an HF folder: its ``config.json`` gives the
model), or the job's latest checkpoint (``checkpoint.enable`` and a complete ``step-N`` in its
checkpoint folder). No process group is started: the model is built plain (no FSDP), loaded (DCP
reshards any saved layout into it; an HF folder is read by :mod:`components.hf.load`) by
``builder.py`` and run in eval mode, its parameters in the run's compute dtype as the trainer's.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchtitan_lite.builder import build_local_model, compute_dtype, compute_in
from torchtitan_lite.components.checkpoint.storage import checkpoint_folder, find_checkpoint
from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.data.tokenizer import Tokenizer, build_tokenizer
from torchtitan_lite.distributed.devices import device_type
from torchtitan_lite.errors import UserError
from torchtitan_lite.preflight.checks import check_paths, parse_run
from torchtitan_lite.preflight.run import ResolvedRun


@dataclass
class LoadedModel:
    """A model ready to run: ``model`` (eval mode, on ``device``, parameters in ``dtype``), its
    ``args``, the job's ``tokenizer`` and ``source`` (where the weights came from)."""

    model: nn.Module
    args: Any
    tokenizer: Tokenizer
    device: torch.device
    source: str
    dtype: torch.dtype


def parse_tool_args(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[argparse.Namespace, ResolvedRun]:
    """The tool's own options (``parser``) and the checked run of the job from the other tokens of
    ``argv``.

    Exits 2 with ``config error: <line>`` on bad options, a bad config, or no weights to load; 0
    after ``--help``.
    """
    options, rest = parser.parse_known_args(argv)
    try:
        run = parse_run(rest)
        config, cp = run.config, run.config.checkpoint
        if cp.load_path is None and cp.initial_load_hf is not None:
            cp = dataclasses.replace(cp, enable=False)  # the HF folder, not the job's checkpoints
            run = dataclasses.replace(run, config=dataclasses.replace(config, checkpoint=cp))
        check_paths(run)
        if weights_source(run.config) is None:
            raise ConfigError(
                "nothing to load: give --checkpoint.load_path=STEP_FOLDER (with "
                "the job's config), --checkpoint.initial_load_hf=HF_FOLDER, or a job "
                "whose checkpoint folder has a complete checkpoint"
            )
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    return options, run


def weights_source(config: JobConfig) -> tuple[str, str] | None:
    """``("checkpoint", path)``, ``("hf", folder)`` or ``None`` (module docstring's order)."""
    cp = config.checkpoint
    if cp.load_path is not None:
        return "checkpoint", find_checkpoint("", -1, cp.load_path)
    if cp.initial_load_hf is not None:
        return "hf", cp.initial_load_hf
    if not cp.enable:
        return None
    path = find_checkpoint(checkpoint_folder(config.job.dump_folder, cp.folder), cp.load_step)
    return None if path is None else ("checkpoint", path)


@torch.no_grad()
def load_model(run: ResolvedRun) -> LoadedModel:
    """The run's model with its trained weights (module docstring).

    Raises:
        HFError: the HF folder lacks tensors the model needs (a tool runs only fully loaded models).
        UserError: see :func:`components.hf.load.load_hf_folder` and DCP's loading.
    """
    config = run.config
    weights = weights_source(config)
    if config.training.num_threads is not None:
        torch.set_num_threads(config.training.num_threads)
    device = torch.device(device_type(config.training.device))
    model = build_local_model(run, device, weights=weights).model
    dtype = compute_dtype(config, device)
    kind, path = weights
    source = f"checkpoint {path}" if kind == "checkpoint" else f"HF folder {path}"
    return LoadedModel(
        compute_in(model, dtype).eval(),
        run.model_args,
        build_tokenizer(run.tokenizer_path),
        device,
        f"{config.model.name} ({config.model.flavor}) from {source}",
        dtype,
    )


def run_tool(main, argv: list[str] | None) -> int:
    """Run a tool's ``main(argv)``: a :class:`~torchtitan_lite.errors.UserError` raised while
    loading or running is printed as one ``input error:`` line and gives 2."""
    try:
        return main(sys.argv[1:] if argv is None else argv)
    except UserError as err:
        print(f"input error: {err}", file=sys.stderr, flush=True)
        return 2
