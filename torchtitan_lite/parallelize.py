"""Parallelism for one model: activation checkpointing, per-block compile, FSDP2.

Apply them in this order (torchtitan's): :func:`apply_activation_checkpointing`, :func:`apply_compile`,
then :func:`apply_fsdp`, all on the model built under ``torch.device("meta")``; then
``model.to_empty(device=...)`` and the init engine. Every function keeps parameter names stable
(checkpoint wrappers add only ``_checkpoint_wrapped_module.``, which the init plan strips).

Note: on gradient reduction semantics. The trainer divides every rank's summed token loss by the
GLOBAL token count (all ranks, all micro-batches), so each rank's gradient is already its share of
the global mean and the right reduction across ranks is a plain SUM. :func:`apply_fsdp` therefore
sets, on every FSDP module, ``set_gradient_divide_factor(1.0)`` and
``set_force_sum_reduction_for_comms(True)``. In torch 2.13
(``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``, ``_get_gradient_divide_factors``) that
pair selects ``ReduceOp.SUM`` for the reduce-scatter with no pre- or post-division, on every backend.
Measured on gloo with 2 ranks: FSDP2's default (``ReduceOp.AVG``) gives the mean over ranks (half the
right gradient here); a divide factor of 1.0 alone selects ``PREMUL_SUM(1.0)``, which gloo rejects
("Cannot use ReduceOp.PREMUL_SUM with Gloo"); factor 1.0 plus force-sum gives the sum.
"""

from __future__ import annotations

import functools
import shutil
import sys

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

AC_MODES = ("none", "full", "selective")
"""Values of ``activation_checkpoint.mode`` (see :func:`apply_activation_checkpointing`)."""


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
        ValueError: ``mode`` not in ``AC_MODES``; a bad ``selective_ac_option`` (see :func:`selective_every`);
            ``k`` larger than the number of blocks (no block would be checkpointed).
        TypeError: ``model.layers`` is not an ``nn.ModuleDict``.
    """
    if mode not in AC_MODES:
        raise ValueError(f"activation checkpointing mode must be one of {AC_MODES}, got {mode!r}")
    if mode == "none":
        return model
    layers = _layers(model)
    every = selective_every(selective_ac_option) if mode == "selective" else 1
    if every is not None and every > len(layers):
        raise ValueError(f"selective_ac_option {selective_ac_option!r} checkpoints no block of a model with "
                         f"{len(layers)} layers; use a value <= {len(layers)}, or mode \"none\"")
    for layer_id, (key, block) in enumerate(list(layers.items())):
        if every is None:
            layers[key] = checkpoint_wrapper(block, context_fn=_op_policy_context)
        elif (layer_id + 1) % every == 0:
            layers[key] = checkpoint_wrapper(block)
    return model


def apply_compile(model: nn.Module, *, backend: str = "inductor") -> nn.Module:
    """``torch.compile`` each block of ``model.layers`` in place (``nn.Module.compile``).

    Compiling per block reuses one graph for all identical blocks (torchtitan's choice) and keeps
    the embedding and output out of the graph. ``nn.Module.compile`` compiles the module's call
    in place, so parameter names and state-dict keys stay unchanged (no ``_orig_mod.`` prefix).

    Args:
        backend: ``torch.compile`` backend; ``"inductor"`` for speed, ``"eager"`` to debug.

    Raises:
        TypeError: ``model.layers`` is not an ``nn.ModuleDict``.
    """
    for block in _layers(model).values():
        block.compile(backend=backend)
    return model


def _inductor_cpu_compilers() -> list[str]:
    """The C++ compilers inductor tries on CPU, in order (``torch._inductor.config.cpp.cxx``; ``None``
    entries mean a conda install inductor does only when asked to, skipped here)."""
    from torch._inductor import config as inductor_config

    cxx = inductor_config.cpp.cxx
    return [c for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c is not None]


def _probe(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2 + 1


def compile_fallback_reason(backend: str, device_type: str) -> str | None:
    """Why ``torch.compile(backend=backend)`` cannot run on ``device_type`` in this process, or ``None``.

    Two checks, made before any model is built:
      1. inductor on CPU needs a C++ compiler: the names of ``torch._inductor.config.cpp.cxx`` (``$CXX``
         or ``g++``) are looked up with ``shutil.which``;
      2. a probe: a two-op function is compiled with ``backend`` (``fullgraph=True``) and run on a
         4-element tensor of ``device_type``; any exception (no triton, a broken toolchain, an unknown
         backend) is the reason. The probe costs one compile (about 10 s for inductor on a cold cache on
         a 2-core CPU, under a second for ``eager``/``aot_eager``).

    Args:
        backend: a ``torch.compile`` backend name, e.g. ``"inductor"``.
        device_type: ``"cpu"``, ``"cuda"``, ``"npu"``, ...

    Returns:
        One line naming the cause and the fix, or ``None`` when compile works.
    """
    avoid = "set --compile.enable=false (or --compile.backend=aot_eager) to silence this"
    if backend == "inductor" and device_type == "cpu":
        compilers = _inductor_cpu_compilers()
        if not any(shutil.which(c) for c in compilers):
            return (f"inductor compiles C++ on CPU and found none of {compilers} on PATH; install g++ or set CXX "
                    f"to a C++ compiler, or {avoid}")
    try:
        torch.compile(_probe, backend=backend, fullgraph=True)(torch.ones(4, device=device_type))
    except Exception as err:  # noqa: BLE001 - any failure of the backend means: run eager
        while (inner := getattr(err, "inner_exception", None) or err.__cause__) is not None:
            err = inner  # dynamo wraps the backend's own error (BackendCompilerFailed.inner_exception)
        detail = (str(err).strip().splitlines() or [""])[0]
        return (f"torch.compile(backend={backend!r}) failed on a probe: {type(err).__name__}: {detail}; fix the "
                f"backend's toolchain, or {avoid}")
    return None


@functools.cache
def compile_available(backend: str, device_type: str) -> bool:
    """Whether to compile with ``backend`` on ``device_type``; when not, print ONE warning line.

    Decided once per process and ``(backend, device_type)`` (cached): the line, to stderr, is
    ``warning: torch.compile disabled, running eager: <reason>`` (:func:`compile_fallback_reason`), so a
    run never crashes on compile, nor runs without it unannounced.
    """
    reason = compile_fallback_reason(backend, device_type)
    if reason is not None:
        print(f"warning: torch.compile disabled, running eager: {reason}", file=sys.stderr, flush=True)
    return reason is None
