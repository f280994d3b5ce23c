"""Activation checkpointing per block: modes none / full / selective (every k-th block, or an op policy).

Every function keeps parameter names stable (checkpoint wrappers add only ``_checkpoint_wrapped_module.``,
which canonical names strip).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from torchtitan_lite.distributed.fsdp import _layers

AC_MODES = ("none", "full", "selective")
"""Values of ``activation_checkpoint.mode`` (see :func:`apply_activation_checkpointing`)."""


def selective_every(option: str) -> int | None:
    """Parse ``activation_checkpoint.selective_ac_option``: ``"op"`` -> ``None``, ``"k"`` (k >= 1) -> ``k``.

    Raises:
        ValueError: anything else (names the value and the two valid forms).
    """
    if option == "op":
        return None
    if option.isdecimal() and int(option) >= 1:
        return int(option)
    raise ValueError(f"selective_ac_option must be \"op\" or a positive integer k as a string (\"2\" = checkpoint "
                     f"every 2nd block), got {option!r}")


_ATTENTION_OPS = frozenset({
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default,
})
"""Fused attention kernels (what ``F.scaled_dot_product_attention`` dispatches to): always saved."""

_MATMUL_OPS = frozenset({
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default,
    torch.ops.aten._grouped_mm.default,
})
"""Matrix products: ``nn.Linear`` without (``mm``) and with bias (``addmm``), batched products of the
attention math fallback and MoE (``bmm``, ``baddbmm``), grouped expert GEMMs (``_grouped_mm``)."""


def _op_policy_context():
    """Fresh forward/recompute contexts for one checkpointed block call (see ``"op"`` in
    :func:`apply_activation_checkpointing`); the counters restart per call, so forward and recompute
    of a block make the same save/recompute decision for the n-th matmul."""
    matmuls = {False: 0, True: 0}  # per pass: forward (False) and recompute (True)

    def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if func in _ATTENTION_OPS:
            return CheckpointPolicy.MUST_SAVE
        if func in _MATMUL_OPS:
            matmuls[ctx.is_recompute] += 1
            if matmuls[ctx.is_recompute] % 2 == 1:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_activation_checkpointing(model: nn.Module, mode: str, selective_ac_option: str = "op") -> nn.Module:
    """Recompute activations in backward, per block of ``model.layers``, in place.

    A checkpointed block is wrapped in ``checkpoint_wrapper`` (non-reentrant ``torch.utils.checkpoint``)
    under the same ModuleDict key, so parameter names gain only ``_checkpoint_wrapped_module.`` (which
    the init plan and the MoE counters strip). Modes (torchtitan's ``activation_checkpoint`` config):
      * ``"none"``: the model is unchanged;
      * ``"full"``: every block; backward keeps only each block's input and recomputes the rest;
      * ``"selective"`` with ``selective_ac_option = "k"``: every k-th block, torchtitan's convention
        (its wrapper counts blocks from 1 and wraps when the count is a multiple of k): layer ids
        ``k-1, 2k-1, ...``, i.e. ``(layer_id + 1) % k == 0``; ``"1"`` equals ``"full"``;
      * ``"selective"`` with ``"op"``: every block, under a selective-checkpoint policy
        (``torch.utils.checkpoint.create_selective_checkpoint_contexts``) that saves the outputs of
        the costly ops and recomputes the cheap ones (norms, activations, elementwise, routing).
        Saved: fused attention (every ``F.scaled_dot_product_attention`` kernel) and every other
        matrix product (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_grouped_mm``, counted together in
        call order within the block: the 1st, 3rd, ...), after torchtitan's ``_save_list`` policy, which
        saves every other ``mm`` to trade half the matmul recompute for half their memory. MoE blocks
        run the same policy (expert ``mm``/``addmm``, router scores); their expert-load counters skip
        recomputes (see ``models/common/moe.py``).

    Gradients are bitwise those of ``"none"``: the recompute runs the same kernels on the same inputs.

    Args:
        model: with ``layers`` (``nn.ModuleDict``), on meta or materialized, not yet FSDP-sharded.
        mode: one of ``AC_MODES``.
        selective_ac_option: ``"op"`` or a positive integer as a string; used by ``"selective"`` only.

    Raises:
        ValueError: ``mode`` not in ``AC_MODES``; a bad ``selective_ac_option`` (see :func:`selective_every`).
            A ``k`` beyond the number of blocks checkpoints none (the config refuses it for a run).
        TypeError: ``model.layers`` is not an ``nn.ModuleDict``.
    """
    if mode not in AC_MODES:
        raise ValueError(f"activation checkpointing mode must be one of {AC_MODES}, got {mode!r}")
    if mode == "none":
        return model
    layers = _layers(model)
    every = selective_every(selective_ac_option) if mode == "selective" else 1
    for layer_id, (key, block) in enumerate(list(layers.items())):
        if every is None:
            layers[key] = checkpoint_wrapper(block, context_fn=_op_policy_context)
        elif (layer_id + 1) % every == 0:
            layers[key] = checkpoint_wrapper(block)
    return model
