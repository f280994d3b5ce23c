"""The parallelize body every family shares: activation checkpointing -> compile -> FSDP2 (torchtitan's order),
through the engine's helpers in ``torchtitan_lite/distributed/``."""

from __future__ import annotations

from torch import nn

from torchtitan_lite.distributed.activation_checkpoint import apply_activation_checkpointing
from torchtitan_lite.distributed.compile import apply_compile
from torchtitan_lite.distributed.fsdp import apply_fsdp
from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.parallel_options import ParallelOptions


def apply_ac_compile_fsdp(model: nn.Module, parallel_dims: ParallelDims, options: ParallelOptions) -> nn.Module:
    """Per block of ``model.layers``: activation checkpointing (``options.ac_mode``), ``torch.compile`` when
    ``options.compile``, then ``fully_shard`` over ``parallel_dims.fsdp_mesh`` (blocks, the output group, the root),
    in place. Parameter names stay canonical (wrappers add only prefixes the init engine strips).

    Args:
        model: a decoder built on meta (the model contract of ``models/__init__.py``), not yet sharded.
        parallel_dims: the run's layout, with its mesh built.
        options: what to apply.

    Returns:
        ``model`` (now an FSDP2 module).

    Raises:
        ValueError, TypeError: from the helpers (a bad AC mode or option, ``layers`` not a ``ModuleDict``).
    """
    apply_activation_checkpointing(model, options.ac_mode, options.selective_ac_option)
    if options.compile:
        apply_compile(model, backend=options.compile_backend)
    return apply_fsdp(model, parallel_dims.fsdp_mesh, param_dtype=options.param_dtype,
                      reduce_dtype=options.reduce_dtype, reshard_after_forward=options.reshard_after_forward)
