"""Apply a model family's :class:`~torchtitan_lite.init.spec.InitPlan`: :func:`init_weights`,
:func:`materialize`.

Persistent buffers (MoE load-balancing bias, counters) are state, covered by the plan;
non-persistent ones (RoPE tables) are derived and recomputed by
``model.init_buffers(buffer_device)``. Tensors in ``skip`` (loaded from a checkpoint or HF) are
never drawn.

Notes in docs/design.md: "on canonical names", "on tied weights".
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from fnmatch import fnmatchcase

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from torchtitan_lite.init import draw
from torchtitan_lite.init.keyed import InitKey, local_box, name_digest
from torchtitan_lite.init.sampling import trunc_normal_
from torchtitan_lite.init.spec import InitPlan, InitSpec

WRAPPER_NAMES = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")
"""Name components added by torch.compile, activation checkpointing and FSDP1 wrappers."""


def canonical_name(name: str) -> str:
    """``name`` with wrapper components removed: ``layers.0._checkpoint_wrapped_module.w`` ->
    ``layers.0.w``."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_NAMES)


def named_state_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(canonical name, tensor)`` for every parameter and persistent buffer, aliases included.

    Order: parameters as ``named_parameters(remove_duplicate=False)`` yields them, then buffers.
    A tied tensor appears once per name.
    """
    out = [(canonical_name(n), p) for n, p in model.named_parameters(remove_duplicate=False)]
    for module_name, module in model.named_modules(remove_duplicate=False):
        for buffer_name, buffer in module._buffers.items():
            if buffer is not None and buffer_name not in module._non_persistent_buffers_set:
                full = f"{module_name}.{buffer_name}" if module_name else buffer_name
                out.append((canonical_name(full), buffer))
    return out


def tensor_groups(model: nn.Module) -> list[tuple[tuple[str, ...], torch.Tensor]]:
    """One ``(names, tensor)`` per distinct tensor object; ``names`` are its canonical aliases,
    sorted."""
    groups: dict[int, tuple[list[str], torch.Tensor]] = {}
    for name, tensor in named_state_tensors(model):
        names, _ = groups.setdefault(id(tensor), ([], tensor))
        if name not in names:
            names.append(name)
    return [(tuple(sorted(names)), tensor) for names, tensor in groups.values()]


@dataclass(frozen=True)
class ResolvedTensor:
    """How one tensor (group of tied names) is initialized.

    Attributes:
        name: canonical name (keys the random stream).
        names: every canonical alias of the tensor, sorted (more than one when tied).
        pattern: the winning plan pattern.
        spec: the winning spec.
        loaded: ``True`` when skipped because a checkpoint provides it.
    """

    name: str
    names: tuple[str, ...]
    pattern: str
    spec: InitSpec
    loaded: bool

    @property
    def tied(self) -> bool:
        """The tensor has more than one name."""
        return len(self.names) > 1


@dataclass(frozen=True)
class InitResult:
    """What :func:`init_weights` did. Element counts are global (a DTensor counts its full shape).

    Attributes:
        initialized_tensors, initialized_elements: tensors drawn or filled.
        skipped_tensors, skipped_elements: tensors left untouched (in ``skip``).
        table: canonical name -> :class:`ResolvedTensor`, in model order.
    """

    initialized_tensors: int
    initialized_elements: int
    skipped_tensors: int
    skipped_elements: int
    table: dict[str, ResolvedTensor]


def resolve_plan(
    model: nn.Module, plan: InitPlan, skip: Collection[str] = (), *, partial: bool = False
) -> list[tuple[ResolvedTensor, torch.Tensor]]:
    """Match every parameter / persistent buffer of ``model`` to its plan entry.

    ``partial``: ``model`` holds only some of the plan's tensors (a rank's pipeline stages), so
    entries may match none of them.

    Raises:
        ValueError: a tensor matches no entry, an entry matches no tensor (unless ``partial``), or a
            ``skip`` name is not a tensor of the model (each message names the culprit).
        RuntimeError: two canonical names share a 128-bit digest (their streams would coincide).
    """
    groups = tensor_groups(model)
    all_names = {name for names, _ in groups for name in names}
    skip_set = {canonical_name(s) for s in skip}
    unknown = sorted(skip_set - all_names)
    if unknown:
        raise ValueError(
            f"init_weights: skip names {unknown} are not parameters or persistent buffers of "
            f"the model; pass names as in model.named_parameters()"
        )
    used_patterns: set[str] = set()
    resolved = []
    digests: dict[bytes, str] = {}
    for names, tensor in groups:
        matches = [(p, s) for p, s in plan.entries if any(fnmatchcase(n, p) for n in names)]
        if not matches:
            raise ValueError(
                f"init plan of {plan.model}: tensor {' = '.join(names)} (shape "
                f"{tuple(tensor.shape)}) matches no entry; add a pattern for it"
            )
        pattern, spec = matches[-1]
        used_patterns.update(p for p, _ in matches)
        name = min(n for n in names if fnmatchcase(n, pattern))
        digest = name_digest(name)
        if digest in digests:
            raise RuntimeError(
                f"name digest collision between {digests[digest]!r} and {name!r}; rename one"
            )
        digests[digest] = name
        loaded = any(n in skip_set for n in names)
        resolved.append((ResolvedTensor(name, names, pattern, spec, loaded), tensor))
    unused = [p for p, _ in plan.entries if p not in used_patterns]
    if unused and not partial:
        raise ValueError(
            f"init plan of {plan.model}: entries {unused} match no parameter or persistent "
            f"buffer; remove them or fix the pattern"
        )
    return resolved


@torch.no_grad()
def _fill(tensor: torch.Tensor, value: float) -> None:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    local.fill_(value)


def init_weights(
    model: nn.Module,
    plan: InitPlan,
    seed: int,
    *,
    skip: Collection[str] = (),
    buffer_device: torch.device | str | None = None,
    partial: bool = False,
) -> InitResult:
    """Initialize every parameter and persistent buffer of ``model`` (materialized: plain, wrapped
    or FSDP2-sharded) from ``plan``, then ``model.init_buffers(buffer_device)`` if it has one.

    Random kinds draw from :func:`trunc_normal_` with ``key=InitKey(seed, canonical name)``, one
    call per tensor, independent of sharding; fills set the local shard. The draws use the native
    CPU kernels, and on other devices compiled kernels when the random tensors' local elements
    number at least :data:`~torchtitan_lite.init.draw.COMPILE_MIN_ELEMENTS` in all (the same values
    either way). ``seed`` is in ``[0, 2**64)``; tensors named
    in ``skip`` (any alias) are untouched. ``partial``: ``model`` is a rank's pipeline stages (see
    :func:`resolve_plan`); each tensor still draws from its canonical name, so the values are the
    whole model's.

    Raises:
        ValueError: bad seed, or see :func:`resolve_plan`.
    """
    InitKey(seed, "init_weights")  # validates the seed before any tensor is touched
    resolved = resolve_plan(model, plan, skip, partial=partial)
    counts = [0, 0, 0, 0]
    random = [t for e, t in resolved if not e.loaded and e.spec.kind in ("normal", "trunc_normal")]
    compiled = (
        True if sum(local_box(t)[0].numel() for t in random) >= draw.COMPILE_MIN_ELEMENTS else None
    )
    for entry, tensor in resolved:
        numel = tensor.numel()
        if entry.loaded:
            counts[2] += 1
            counts[3] += numel
            continue
        spec = entry.spec
        if spec.kind in ("normal", "trunc_normal"):
            trunc_normal_(
                tensor,
                spec.mean,
                spec.std,
                *spec.bounds,
                key=InitKey(seed, entry.name),
                compiled=compiled,
            )
        else:
            _fill(tensor, {"zeros": 0.0, "ones": 1.0, "constant": spec.value}[spec.kind])
        counts[0] += 1
        counts[1] += numel
    init_buffers = getattr(model, "init_buffers", None)
    if init_buffers is not None:
        init_buffers(buffer_device)
    return InitResult(*counts, table={entry.name: entry for entry, _ in resolved})


def materialize(model: nn.Module, device: torch.device | str) -> nn.Module:
    """``model.to_empty(device=device)`` that re-ties the parameters tied before (``to_empty`` gives
    every module a new Parameter); returns ``model``, uninitialized: call :func:`init_weights`
    next."""
    ties: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                ties.setdefault(id(param), []).append((module, name))
    model.to_empty(device=device)
    for members in ties.values():
        owner, owner_name = members[0]
        first = owner._parameters[owner_name]
        for module, name in members[1:]:
            if module._parameters[name] is not first:
                module._parameters[name] = first
    return model
