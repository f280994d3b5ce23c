"""Activation checkpointing per block: modes none / full / selective (every k-th block, or an op
policy).

Note: docs/design.md, "on telling a forward from its recompute".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from torchtitan_lite.distributed.fsdp import _layers

AC_MODES = ("none", "full", "selective")
"""Values of ``activation_checkpoint.mode`` (see :func:`apply_activation_checkpointing`)."""


def selective_every(option: str) -> int | None:
    """Parse ``activation_checkpoint.selective_ac_option``: ``"op"`` -> ``None``, ``"k"`` (k >= 1)
    -> ``k``.

    Raises:
        ValueError: anything else (names the value and the two valid forms).
    """
    if option == "op":
        return None
    if option.isdecimal() and int(option) >= 1:
        return int(option)
    raise ValueError(
        f'selective_ac_option must be "op" or a positive integer k as a string ("2" = checkpoint '
        f"every 2nd block), got {option!r}"
    )


_ATTENTION_OPS = frozenset(
    {
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_cudnn_attention.default,
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default,
    }
)
"""Fused attention kernels (what ``F.scaled_dot_product_attention`` dispatches to): always saved."""

_MATMUL_OPS = frozenset(
    {
        torch.ops.aten.mm.default,
        torch.ops.aten.addmm.default,
        torch.ops.aten.bmm.default,
        torch.ops.aten.baddbmm.default,
        torch.ops.aten._grouped_mm.default,
    }
)
"""Matrix products: ``nn.Linear`` without (``mm``) and with bias (``addmm``), batched products of
the attention math fallback and MoE (``bmm``, ``baddbmm``), grouped expert GEMMs
(``_grouped_mm``)."""


_recomputing = False


def recomputing() -> bool:
    """Whether the forward running now is an activation-checkpoint recompute (see the note in this
    module)."""
    return _recomputing


@contextlib.contextmanager
def _recomputation(inner: AbstractContextManager) -> Iterator[None]:
    """``inner``, with :func:`recomputing` true inside."""
    global _recomputing
    previous, _recomputing = _recomputing, True
    try:
        with inner:
            yield
    finally:
        _recomputing = previous


def _recompute_everything(ctx, func, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.PREFER_RECOMPUTE


def checkpoint_contexts(
    policy_contexts: Callable[[], tuple[AbstractContextManager, AbstractContextManager]]
    | None = None,
) -> tuple[AbstractContextManager, AbstractContextManager]:
    """``torch.utils.checkpoint``'s ``context_fn`` of a checkpointed block: the forward and
    recompute contexts of ``policy_contexts()`` (selective checkpointing; none: recompute
    everything), the recompute one making :func:`recomputing` true. Under ``torch.compile`` the
    selective-checkpointing modes only (the note)."""
    if torch.compiler.is_compiling():
        return (
            policy_contexts or (lambda: create_selective_checkpoint_contexts(_recompute_everything))
        )()
    forward, recompute = (
        policy_contexts()
        if policy_contexts
        else (contextlib.nullcontext(), contextlib.nullcontext())
    )
    return forward, _recomputation(recompute)


def _op_policy_context():
    """Fresh forward/recompute contexts for one block call: the n-th matmul of forward and of
    recompute get the same decision."""
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


def _op_checkpoint_contexts() -> tuple[AbstractContextManager, AbstractContextManager]:
    """:func:`checkpoint_contexts` of the op policy."""
    return checkpoint_contexts(_op_policy_context)


def apply_activation_checkpointing(
    model: nn.Module, mode: str, selective_ac_option: str = "op", *, compiled: bool = False
) -> nn.Module:
    """Recompute activations in backward, per block of ``model.layers``, in place.

    A checkpointed block is wrapped in ``checkpoint_wrapper`` (non-reentrant) under the same key, so
    names gain only ``_checkpoint_wrapped_module.``. Modes (torchtitan's ``activation_checkpoint``
    config):
    ``"full"``: every block keeps only its input; ``"selective"`` ``"k"``: layer ids with
    ``(layer_id + 1) % k == 0`` (torchtitan's count from 1; ``"1"`` = full); ``"selective"``
    ``"op"``: every block under ``create_selective_checkpoint_contexts``, saving fused attention and
    every other matrix product (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``_grouped_mm`` in call
    order: 1st, 3rd, ...; torchtitan's ``_save_list``) and recomputing the rest. Gradients are
    bitwise those of ``"none"``; recomputes run under :func:`recomputing` (the note in this module).

    Args:
        model: with ``layers`` (``nn.ModuleDict``), on meta or materialized, not yet FSDP-sharded.
        mode: one of ``AC_MODES``.
        selective_ac_option: ``"op"`` or a positive integer as a string; used by ``"selective"``
            only.
        compiled: the blocks will be ``torch.compile``-d: those checkpointed whole get no
            ``context_fn`` (the note).

    Raises:
        ValueError: ``mode`` not in ``AC_MODES``; a bad ``selective_ac_option`` (see
            :func:`selective_every`). A ``k`` beyond the number of blocks checkpoints none (the
            config refuses it for a run).
        TypeError: ``model.layers`` is not an ``nn.ModuleDict``.
    """
    if mode not in AC_MODES:
        raise ValueError(f"activation checkpointing mode must be one of {AC_MODES}, got {mode!r}")
    if mode == "none":
        return model
    layers = _layers(model)
    every = selective_every(selective_ac_option) if mode == "selective" else 1
    for key, block in list(layers.items()):
        if every is None:
            layers[key] = checkpoint_wrapper(block, context_fn=_op_checkpoint_contexts)
        elif (
            int(key) + 1
        ) % every == 0:  # the layer id, also on a pipeline stage that holds later layers only
            layers[key] = (
                checkpoint_wrapper(block)
                if compiled
                else checkpoint_wrapper(block, context_fn=checkpoint_contexts)
            )
    return model
