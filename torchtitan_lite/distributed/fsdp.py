"""FSDP2 (``fully_shard``) of one model, with mixed precision and summed gradients.

Apply after activation checkpointing and compile (torchtitan's order), on the model built on meta.

Note: docs/design.md, "on gradient reduction semantics".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def _layers(model: nn.Module) -> nn.ModuleDict:
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleDict):
        raise TypeError(
            f"{type(model).__name__}.layers must be an nn.ModuleDict keyed by str(layer_id) "
            "(the model contract in torchtitan_lite/protocols/model_spec.py), got "
            f"{type(layers).__name__}"
        )
    return layers


def is_tied(model: nn.Module) -> bool:
    """Whether ``model.output.weight is model.tok_embeddings.weight`` (one tensor, two names);
    ``False`` on a pipeline stage that lacks either module (``None``)."""
    if model.output is None or model.tok_embeddings is None:
        return False
    return model.output.weight is model.tok_embeddings.weight


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    reshard_after_forward: bool,
    expert_modules: Sequence[nn.Module] = (),
    expert_mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Shard ``model`` with FSDP2 (``fully_shard``, Shard(0) on ``mesh``), in place.

    Groups (one all-gather / reduce-scatter each), after torchtitan's llama3 ``apply_fsdp``: each of
    ``expert_modules`` over ``expert_mesh`` (expert parallelism: torchtitan's ``dp_shard_mod_ep``
    sharding); each block; the output group ``[norm, output]``, with ``tok_embeddings`` when tied (a
    tensor in two groups would be sharded twice), kept unsharded after forward (backward starts with
    it); the root. On a pipeline stage the modules it lacks (``None``) are left out, and the output
    group with them. Parameters stay in their dtype (fp32), compute in ``param_dtype``, gradients
    reduce in ``reduce_dtype`` and are SUMMED over ranks (see the note on gradient reduction
    semantics).

    Args:
        model: with ``layers`` (``nn.ModuleDict``), ``tok_embeddings``, ``norm`` and ``output``.
        mesh: the data-parallel ``DeviceMesh``: 1-D (FSDP: sharded over it) or 2-D
            ``(dp_replicate, dp_shard)`` (HSDP: replicated over the first dimension, sharded over
            the second). Parameters that are already DTensors (tensor parallelism) become 2-D or 3-D
            DTensors over ``mesh`` and their own mesh.
        param_dtype, reduce_dtype: compute and gradient reduce-scatter dtypes.
        reshard_after_forward: free each block's gathered parameters after its forward (ZeRO-3) or
            keep them until backward (one all-gather less per block).
        expert_modules: modules (inside the blocks) whose parameters are sharded by whole experts
            over the expert-parallel mesh; each becomes its own group over ``expert_mesh``.
        expert_mesh: the mesh the experts are FSDP-sharded over (1-D, or 2-D for HSDP), with
            ``expert_modules``.

    Returns:
        ``model`` itself, an ``FSDPModule`` with ``DTensor`` parameters.

    Raises:
        TypeError: ``model.layers`` is not an ``nn.ModuleDict``.
        ValueError: ``mesh`` is not 1-D or 2-D.
    """
    if mesh.ndim not in (1, 2):
        raise ValueError(
            f"apply_fsdp needs a 1-D (FSDP) or 2-D (HSDP) data-parallel mesh, got a {mesh.ndim}-D "
            f"mesh {mesh}"
        )
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for experts in expert_modules:
        fully_shard(
            experts,
            mesh=expert_mesh,
            mp_policy=mp_policy,
            reshard_after_forward=reshard_after_forward,
        )
    for block in _layers(model).values():
        fully_shard(
            block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward
        )
    output_group = [
        module for module in (model.norm, model.output) if module is not None
    ]  # a stage may lack them
    if is_tied(model):
        output_group = [model.tok_embeddings, *output_group]
    if output_group:
        fully_shard(output_group, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model
