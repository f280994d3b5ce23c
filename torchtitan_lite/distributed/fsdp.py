"""FSDP2 (``fully_shard``) of one model, with mixed precision and summed gradients.

Apply after activation checkpointing and compile (torchtitan's order), on the model built under
``torch.device("meta")``; then ``model.to_empty(device=...)`` and the init engine.

Note: on gradient reduction semantics. The trainer divides every rank's summed token loss by the
GLOBAL token count (all ranks, all micro-batches), so each rank's gradient is already its share of
the global mean and the right reduction across ranks is a plain SUM. :func:`apply_fsdp` therefore
sets, on every FSDP module, ``set_gradient_divide_factor(1.0)`` and
``set_force_sum_reduction_for_comms(True)``. In torch 2.13
(``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``, ``_get_gradient_divide_factors``) that
pair selects ``ReduceOp.SUM`` for the reduce-scatter with no pre- or post-division, on every backend:
FSDP2's default (``ReduceOp.AVG``) would give the mean over ranks, and a divide factor of 1.0 alone
selects ``PREMUL_SUM(1.0)``, which gloo rejects ("Cannot use ReduceOp.PREMUL_SUM with Gloo").
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def _layers(model: nn.Module) -> nn.ModuleDict:
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleDict):
        raise TypeError(
            f"{type(model).__name__}.layers must be an nn.ModuleDict keyed by str(layer_id) "
            f"(the model contract in models/__init__.py), got {type(layers).__name__}"
        )
    return layers


def is_tied(model: nn.Module) -> bool:
    """Whether ``model.output.weight is model.tok_embeddings.weight`` (one tensor, two names)."""
    return model.output.weight is model.tok_embeddings.weight


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    reshard_after_forward: bool,
) -> nn.Module:
    """Shard ``model`` with FSDP2 (``fully_shard``, Shard(0) on ``mesh``), in place.

    Groups (one all-gather / reduce-scatter each), following torchtitan's llama3 ``apply_fsdp``:
      * each block of ``model.layers``;
      * tied output (``output.weight is tok_embeddings.weight``): ``[tok_embeddings, norm, output]``
        as ONE group, because a tensor split across two groups would be sharded twice and one copy
        would never see the other's gradient; untied: ``[norm, output]``, and ``tok_embeddings``
        stays with the root;
      * the root (everything not yet covered).
    The output group keeps its parameters unsharded after forward (``reshard_after_forward=False``):
    the backward pass starts with it, so resharding would only all-gather it again at once.

    Mixed precision by ``MixedPrecisionPolicy``: parameters are stored (and optimized) in their
    original dtype (fp32), all-gathered and computed in ``param_dtype``, gradients reduced in
    ``reduce_dtype`` (use fp32). Gradients are SUMMED over ranks (see "Note: on gradient reduction
    semantics" in this module): the loss on each rank must be divided by the global token count.

    Args:
        model: built on meta (or any device), with ``layers`` (``nn.ModuleDict``),
            ``tok_embeddings``, ``norm`` and ``output``.
        mesh: 1-D data-parallel ``DeviceMesh``.
        param_dtype: compute dtype, e.g. ``torch.bfloat16`` on accelerators, ``torch.float32`` on CPU.
        reduce_dtype: gradient reduce-scatter dtype (``torch.float32``).
        reshard_after_forward: free each block's gathered parameters after its forward (ZeRO-3,
            less memory) or keep them until backward (ZeRO-2-like, one all-gather less per block).

    Returns:
        ``model`` itself (now an ``FSDPModule``; its parameters are ``DTensor``s).

    Raises:
        TypeError: ``model.layers`` is not an ``nn.ModuleDict``.
        ValueError: ``mesh`` is not 1-D.
    """
    if mesh.ndim != 1:
        raise ValueError(f"apply_fsdp needs a 1-D data-parallel mesh, got a {mesh.ndim}-D mesh {mesh}")
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in _layers(model).values():
        fully_shard(block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    output_group = [model.norm, model.output]
    if is_tied(model):
        output_group = [model.tok_embeddings, *output_group]
    fully_shard(output_group, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model
