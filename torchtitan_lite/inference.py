"""One process, one device: the model of a job config with trained weights, for ``generate`` and
``evaluate``.

The command line of a tool is its own options followed by the job's config options
(``--job.config_file``, ``--checkpoint.*``, ``--model.*``, ...), checked like the trainer's
(``preflight/checks.py``; one ``config error:`` line and exit 2 on bad input, before any work).
Weights come from, in order: ``checkpoint.load_path`` (a ``step-N`` folder of a training run, with
the job's config), ``checkpoint.initial_load_hf`` (an HF folder: its ``config.json`` gives the
model), or the job's latest checkpoint (``checkpoint.enable`` and a complete ``step-N`` in its
checkpoint folder). No process group is started: the model is built plain (no FSDP), loaded (DCP
reshards any saved layout into it; an HF folder is read by :mod:`components.hf.load`) and run in
eval mode; on an accelerator matmuls run in ``training.compute_dtype`` (autocast), on a CPU in fp32.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from torchtitan_lite.components.attention import set_attn_backend
from torchtitan_lite.components.checkpoint.integrity import read_meta, verify_files
from torchtitan_lite.components.checkpoint.storage import checkpoint_folder, find_checkpoint
from torchtitan_lite.components.hf.folder import HFError
from torchtitan_lite.components.hf.load import load_hf_folder
from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.data.tokenizer import Tokenizer, build_tokenizer
from torchtitan_lite.distributed.devices import device_type
from torchtitan_lite.errors import UserError
from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.preflight.checks import check_paths, parse_run
from torchtitan_lite.preflight.run import ResolvedRun


@dataclass
class LoadedModel:
    """A model ready to run: ``model`` (eval mode, on ``device``), its ``args``, the job's
    ``tokenizer``, ``source`` (where the weights came from, for the output) and ``autocast`` (a
    context for its forwards)."""

    model: nn.Module
    args: Any
    tokenizer: Tokenizer
    device: torch.device
    source: str
    dtype: torch.dtype

    def autocast(self) -> contextlib.AbstractContextManager:
        """``torch.autocast`` at the compute dtype on an accelerator; nothing on a CPU (fp32)."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)


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


def _load_checkpoint(model: nn.Module, path: str) -> list[str]:
    """Load the model part of the DCP checkpoint ``path`` into the plain ``model``, after checking
    the checksum of every file (:func:`~torchtitan_lite.components.checkpoint.verify_files`); the
    names loaded."""
    verify_files(path, read_meta(path), rank=0, world_size=1)
    state = {"model": get_model_state_dict(model)}
    with warnings.catch_warnings():  # DCP warns of no process group: one process is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])
    return sorted(state["model"])


@torch.no_grad()
def load_model(run: ResolvedRun) -> LoadedModel:
    """The run's model with its trained weights (module docstring).

    Raises:
        HFError: the HF folder lacks tensors the model needs (a tool runs only fully loaded models).
        UserError: see :func:`components.hf.load.load_hf_folder` and DCP's loading.
    """
    config, spec, args = run.config, run.spec, run.model_args
    kind, path = weights_source(config)
    if config.training.num_threads is not None:
        torch.set_num_threads(config.training.num_threads)
    device = torch.device(device_type(config.training.device))
    with torch.device("meta"):
        model = spec.model_cls(args)
    set_attn_backend(model, config.model.attn_backend)
    materialize(model, device)
    if kind == "checkpoint":
        loaded = _load_checkpoint(model, path)
        source = f"checkpoint {path}"
    else:
        allow = config.checkpoint.initial_load_hf_allow_unexpected
        imported = load_hf_folder(model, path, config.model.name, args, allow_unexpected=allow)
        if imported.missing:
            missing = imported.missing
            raise HFError(
                f"{path} lacks {len(missing)} tensors of the model "
                f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}); "
                "a model to run needs all of them"
            )
        loaded, source = imported.loaded, f"HF folder {path}"
    init_weights(
        model, spec.init_plan(args), config.training.seed, skip=loaded, buffer_device=device
    )
    name = config.training.compute_dtype
    dtype = torch.float32 if device.type == "cpu" or name == "float32" else torch.bfloat16
    return LoadedModel(
        model.eval(),
        args,
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
