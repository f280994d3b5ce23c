"""The parallelize body every family shares: float8 conversion of the linear layers (``[float8]``)
-> tensor parallelism (the family's block plan) -> expert parallelism -> activation checkpointing ->
compile -> FSDP2 (torchtitan's order), through the engine's helpers in
``torchtitan_lite/distributed/``."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from torchtitan_lite.distributed.activation_checkpoint import apply_activation_checkpointing
from torchtitan_lite.distributed.compile import apply_compile
from torchtitan_lite.distributed.expert_parallel import ExpertParallel
from torchtitan_lite.distributed.float8 import convert_to_float8
from torchtitan_lite.distributed.fsdp import apply_fsdp
from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.parallel_options import ParallelOptions
from torchtitan_lite.distributed.tensor_parallel import (
    apply_embedding_and_output_tp,
    head_norm,
    input_gathered,
    norm_plan,
    residual_layout,
)
from torchtitan_lite.models.common.moe import moe_layers

BlockPlan = Callable[[nn.Module, DeviceMesh, bool], dict[str, ParallelStyle]]
"""``(block, tp_mesh, sequence_parallel) -> plan``: the ``parallelize_module`` plan of one block of
``model.layers`` (submodule names relative to the block); it may also replace parameters that are
not a module's weight (e.g. GPT-OSS's sinks,
:func:`torchtitan_lite.distributed.tensor_parallel.shard_parameter`)."""


def attention_plan(sequence_parallel: bool, qk_norm: bool) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan of a block's GQA ``attention``
    (:class:`torchtitan_lite.models.common.attention.Attention`; Qwen3, Qwen3-MoE, Llama 3) and its
    norm (torchtitan's llama3 and qwen3 plans, Megatron layout): input gathered (``cos``/``sin``
    plain), ``wq``/``wk``/``wv`` column-wise (whole query and key/value heads per rank: GQA's kv
    heads split with their query groups), the QK-norm (when ``qk_norm``) whole on every rank over
    the rank's heads, ``wo`` row-wise."""
    norms = {"attention.q_norm": head_norm(), "attention.k_norm": head_norm()} if qk_norm else {}
    return {
        **norm_plan("attention_norm", sequence_parallel),
        "attention": input_gathered(sequence_parallel, n_extra=2),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        **norms,
        "attention.wo": RowwiseParallel(output_layouts=residual_layout(sequence_parallel)),
    }


def parallelize_decoder(
    model: nn.Module, parallel_dims: ParallelDims, options: ParallelOptions, block_plan: BlockPlan
) -> nn.Module:
    """Float8 linear layers when ``options.float8``
    (:func:`~torchtitan_lite.distributed.float8.convert_to_float8`, before any parallelism, as
    torchtitan converts), tensor parallelism when ``parallel_dims.tp > 1`` (vocab-parallel embedding
    and output, then ``block_plan`` per block over ``parallel_dims.tp_mesh``), expert parallelism
    when ``parallel_dims.ep > 1`` (every MoE layer's ``experts`` split by whole experts over
    ``parallel_dims.ep_mesh``, tokens dispatched by all-to-all:
    :class:`~torchtitan_lite.distributed.expert_parallel.ExpertParallel`), then
    :func:`apply_ac_compile_fsdp`, in place.

    Returns:
        ``model`` (now an FSDP2 module, its tensor-parallel parameters 2-D or 3-D DTensors).
    """
    if options.float8 is not None:
        convert_to_float8(model, options.float8)
    if parallel_dims.tp > 1:
        mesh = parallel_dims.tp_mesh
        apply_embedding_and_output_tp(
            model,
            mesh,
            sequence_parallel=options.sequence_parallel,
            loss_parallel=options.loss_parallel,
        )
        for block in model.layers.values():
            parallelize_module(block, mesh, block_plan(block, mesh, options.sequence_parallel))
    if parallel_dims.ep > 1:
        for moe in moe_layers(model).values():
            parallelize_module(
                moe.experts,
                parallel_dims.ep_mesh,
                ExpertParallel(parallel_dims.tp_mesh if parallel_dims.tp > 1 else None),
            )
    return apply_ac_compile_fsdp(model, parallel_dims, options)


def apply_ac_compile_fsdp(
    model: nn.Module, parallel_dims: ParallelDims, options: ParallelOptions
) -> nn.Module:
    """Per block of ``model.layers``: activation checkpointing (``options.ac_mode``),
    ``torch.compile`` when ``options.compile``, then ``fully_shard`` over
    ``parallel_dims.fsdp_mesh`` (blocks, the output group, the root; under expert parallelism each
    MoE layer's ``experts`` first, over ``parallel_dims.efsdp_mesh``), in place. Parameter names
    stay canonical (wrappers add only prefixes the init engine strips).

    Args:
        model: a decoder built on meta (the model contract of
            ``torchtitan_lite/protocols/model_spec.py``), not yet sharded (tensor parallelism may
            have been applied).
        parallel_dims: the run's layout, with its mesh built.
        options: what to apply.

    Returns:
        ``model`` (now an FSDP2 module).

    Raises:
        ValueError, TypeError: from the helpers (a bad AC mode or option, ``layers`` not a
        ``ModuleDict``).
    """
    apply_activation_checkpointing(
        model, options.ac_mode, options.selective_ac_option, compiled=options.compile
    )
    if options.compile:
        apply_compile(model, backend=options.compile_backend)
    experts = [moe.experts for moe in moe_layers(model).values()] if parallel_dims.ep > 1 else []
    return apply_fsdp(
        model,
        parallel_dims.fsdp_mesh,
        param_dtype=options.param_dtype,
        reduce_dtype=options.reduce_dtype,
        reshard_after_forward=options.reshard_after_forward,
        expert_modules=experts,
        expert_mesh=parallel_dims.efsdp_mesh if experts else None,
    )
