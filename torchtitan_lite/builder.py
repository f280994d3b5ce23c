"""A run's model, built in one place: on meta, converted and parallelized (``spec.parallelize``:
float8, TP, EP, AC, compile, FSDP2), materialized, then loaded and initialized. Its callers are
listed in docs/design.md, "Note: one model builder".
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from torchtitan_lite.components.attention import set_attn_backend
from torchtitan_lite.components.checkpoint.integrity import read_meta, verify_files
from torchtitan_lite.components.hf.folder import HFError
from torchtitan_lite.components.hf.load import load_hf_folder
from torchtitan_lite.components.loss import build_loss_fn
from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.distributed.compile import compiles
from torchtitan_lite.distributed.float8 import float8_settings
from torchtitan_lite.distributed.parallel_options import ParallelOptions
from torchtitan_lite.distributed.pipeline import Pipeline, build_pipeline
from torchtitan_lite.distributed.process_group import DistInfo
from torchtitan_lite.init.apply import InitResult, init_weights, materialize

if TYPE_CHECKING:  # type hints only: the entry points resolve the run and pass it here
    from torchtitan_lite.preflight.run import ResolvedRun


def compute_dtype(config: JobConfig, device: torch.device) -> torch.dtype:
    """``training.compute_dtype``; ``auto`` = bf16 on accelerators, fp32 on CPU (no fast bf16 on
    AVX2)."""
    name = config.training.compute_dtype
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return getattr(torch, name)


def parallel_options(config: JobConfig, device: torch.device) -> ParallelOptions:
    """What ``spec.parallelize`` applies besides the mesh: sequence and loss parallelism, AC,
    compile of the blocks (``compile.enable`` with ``"model"``, where the backend works), FSDP2
    mixed precision (:func:`compute_dtype`, fp32 reduction), resharding and ``[float8]``."""
    ac, par, cc = config.activation_checkpoint, config.parallelism, config.compile
    return ParallelOptions(
        sequence_parallel=par.enable_sequence_parallel,
        loss_parallel=par.enable_loss_parallel,
        ac_mode=ac.mode,
        selective_ac_option=ac.selective_ac_option,
        compile=compiles(cc.enable, cc.components, cc.backend, device.type, "model"),
        compile_backend=config.compile.backend,
        param_dtype=compute_dtype(config, device),
        reduce_dtype=torch.float32,
        reshard_after_forward=par.fsdp_reshard_after_forward,
        float8=float8_settings(config),
    )


def build_meta_model(run: ResolvedRun, n_layers: int | None = None) -> nn.Module:
    """The run's model on meta (no memory, no RNG), its attention backend set; ``n_layers``: only
    the first blocks."""
    args = (
        run.model_args
        if n_layers is None
        else dataclasses.replace(run.model_args, n_layers=n_layers)
    )
    with torch.device("meta"):
        model = run.spec.model_cls(args)
    set_attn_backend(model, run.config.model.attn_backend)
    return model


def parallelize_model(model: nn.Module, run: ResolvedRun, info: DistInfo) -> nn.Module:
    """``spec.parallelize`` (:func:`parallel_options`), then ``to_empty`` on the device:
    uninitialized."""
    model = run.spec.parallelize(model, info.dims, parallel_options(run.config, info.device))
    materialize(model, info.device)
    return model


def build_model(run: ResolvedRun, info: DistInfo) -> nn.Module:
    """:func:`build_meta_model` -> :func:`parallelize_model`: the model on the device,
    uninitialized."""
    return parallelize_model(build_meta_model(run), run, info)


def build_pipelined_model(run: ResolvedRun, info: DistInfo) -> Pipeline:
    """This rank's pipeline stages, each parallelized like a whole model and on the device,
    uninitialized (:func:`~torchtitan_lite.distributed.pipeline.build_pipeline`);
    ``pipeline.model`` is what the run sees as the model."""
    config = run.config
    par, training = config.parallelism, config.training
    return build_pipeline(
        build_meta_model(run),
        info.dims,
        run.spec.parallelize,
        parallel_options(config, info.device),
        device=info.device,
        schedule=par.pipeline_parallel_schedule,
        local_batch_size=training.local_batch_size,
        microbatch_size=par.pipeline_parallel_microbatch_size,
        seq_len=training.seq_len,
        layers_per_stage=par.pipeline_parallel_layers_per_stage,
        split_points=par.pipeline_parallel_split_points,
        loss_fn=build_loss_fn(config, info.device),
    )


def init_model(
    model: nn.Module,
    run: ResolvedRun,
    device: torch.device | str,
    *,
    skip: frozenset[str] | set[str] = frozenset(),
    partial: bool = False,
) -> InitResult:
    """The family's init plan of the full model with ``training.seed`` on every tensor but
    ``skip`` (loaded); ``partial``: a pipeline stage's part of the plan."""
    plan = run.spec.init_plan(run.model_args)
    return init_weights(
        model, plan, run.config.training.seed, skip=skip, buffer_device=device, partial=partial
    )


def load_weights(model: nn.Module, run: ResolvedRun, kind: str, path: str) -> list[str]:
    """Load ``kind`` ``"checkpoint"`` (a DCP ``step-N`` folder, its checksums checked first) or
    ``"hf"`` (an HF folder) into the plain (one-process) ``model``; the names loaded.

    Raises:
        HFError: the HF folder lacks tensors of the model (a tool runs only fully loaded models).
        UserError: see :func:`~torchtitan_lite.components.hf.load.load_hf_folder` and DCP's load.
    """
    if kind == "checkpoint":
        verify_files(path, read_meta(path), rank=0, world_size=1)
        state = {"model": get_model_state_dict(model)}
        with warnings.catch_warnings():  # DCP warns of no process group: one process is the intent
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=path)
        set_model_state_dict(model, state["model"])
        return sorted(state["model"])
    config = run.config
    allow = config.checkpoint.initial_load_hf_allow_unexpected
    imported = load_hf_folder(
        model, path, config.model.name, run.model_args, allow_unexpected=allow
    )
    if missing := imported.missing:
        raise HFError(
            f"{path} lacks {len(missing)} tensors of the model "
            f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}); "
            "a model to run needs all of them"
        )
    return list(imported.loaded)


@dataclass
class LocalModel:
    """A model built in one process without parallelism: fp32 values on ``device``, ``init`` what
    the plan initialized, ``loaded`` the names read from ``weights``."""

    model: nn.Module
    init: InitResult
    loaded: list[str]


def build_local_model(
    run: ResolvedRun,
    device: torch.device | str,
    *,
    weights: tuple[str, str] | None = None,
    n_layers: int | None = None,
) -> LocalModel:
    """:func:`build_meta_model` -> ``to_empty`` on ``device`` -> :func:`load_weights` of
    ``weights`` (``(kind, path)``) -> :func:`init_model` of the rest; no process group."""
    model = materialize(build_meta_model(run, n_layers), device)
    loaded = load_weights(model, run, *weights) if weights is not None else []
    result = init_model(model, run, device, skip=set(loaded))
    return LocalModel(model, result, loaded)


@torch.no_grad()
def compute_in(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """The parameters cast to ``dtype`` (buffers kept), as FSDP2's ``param_dtype`` casts them for
    the trainer's forward: a one-process model computes as the run does."""
    for param in model.parameters():
        param.data = param.data.to(dtype)
    return model
