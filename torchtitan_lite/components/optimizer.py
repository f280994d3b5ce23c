"""AdamW with decay / no-decay parameter groups (or Muon for the matrices: ``muon.py``), and
global-norm gradient clipping over DTensors."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from torchtitan_lite.components.muon import MuonWithAdamW, split_muon_params

IMPLEMENTATIONS = ("auto", "fused", "foreach")
"""Values of ``optimizer.implementation``."""

NamedParams = list[tuple[str, nn.Parameter]]


def split_decay_params(
    model: nn.Module, *, decay_embeddings: bool, decay_norms_and_biases: bool
) -> tuple[NamedParams, NamedParams]:
    """Split the trainable parameters of ``model`` into (decay, no_decay), each ``[(name, param)]``.

    Rules, in order (GPT-2/nanoGPT and torchtitan practice: decay the matrices that mix features):
    an ``nn.Embedding``'s parameter (a tied output too) decays iff ``decay_embeddings``; a bias or a
    parameter with fewer than 2 dims iff ``decay_norms_and_biases``; everything else decays. Frozen
    parameters and buffers are left out; each tensor appears once, in ``model.named_parameters()``
    order.
    """
    embedding_ids = {
        id(p)
        for m in model.modules()
        if isinstance(m, nn.Embedding)
        for p in m.parameters(recurse=False)
    }
    decay: NamedParams = []
    no_decay: NamedParams = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if id(param) in embedding_ids:
            wants_decay = decay_embeddings
        elif name.endswith("bias") or param.ndim < 2:
            wants_decay = decay_norms_and_biases
        else:
            wants_decay = True
        (decay if wants_decay else no_decay).append((name, param))
    return decay, no_decay


def fused_adamw_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch's fused AdamW kernel runs for ``dtype`` parameters on ``device``: one step of
    ``torch.optim.AdamW(fused=True)`` on a 1-element parameter there. Torch names no public list of
    such devices; it checks each parameter's device and dtype when a fused optimizer first steps
    (``RuntimeError``), and a backend without the kernel raises ``NotImplementedError`` (a
    ``RuntimeError``) from the step itself."""
    probe = torch.zeros(1, device=device, dtype=dtype, requires_grad=True)
    probe.grad = torch.zeros_like(probe)
    try:
        torch.optim.AdamW([probe], fused=True).step()
    except RuntimeError:
        return False
    return True


def muon_settings(optimizer_config) -> dict | None:
    """The ``muon`` argument of :func:`build_optimizer` for an ``[optimizer]`` section
    (``config.schema.Optimizer``): ``None`` unless ``name = "Muon"``."""
    if optimizer_config.name != "Muon":
        return None
    return {
        key: getattr(optimizer_config, key)
        for key in (
            "momentum",
            "nesterov",
            "ns_coefficients",
            "ns_steps",
            "muon_eps",
            "adjust_lr_fn",
        )
    }


def build_optimizer(
    model: nn.Module,
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    decay_embeddings: bool,
    decay_norms_and_biases: bool,
    implementation: str = "auto",
    muon: dict | None = None,
) -> torch.optim.Optimizer:
    """AdamW (Loshchilov & Hutter 2019, arXiv 1711.05101) over the trainable params of ``model``;
    with ``muon``, Muon for the decay group's matrices (:func:`~.muon.split_muon_params`) and AdamW
    for the rest (:class:`~.muon.MuonWithAdamW`, same ``lr``; the matrices' weight decay is
    ``weight_decay``).

    Param groups ``[decay (weight_decay), no_decay (0.0)]`` (:func:`split_decay_params`; empty ones
    omitted). ``fused`` is one kernel for all parameters, ``foreach`` a few batched ones (both take
    FSDP2 shards); ``auto`` is fused where torch's kernel runs for the parameters' device and dtype
    (:func:`fused_adamw_runs`), else foreach. Build it after ``apply_fsdp``, so it holds the sharded
    parameters.

    Args:
        lr: peak learning rate (the LR schedule multiplies it).
        betas: Adam ``(beta1, beta2)``, each in ``[0, 1)``.
        eps: Adam epsilon, > 0.
        weight_decay: decoupled weight decay of the decay group, >= 0.
        implementation: ``"auto"``, ``"fused"`` or ``"foreach"`` (of the AdamW part under Muon).
        muon: ``None`` (AdamW only) or the keyword arguments ``momentum``, ``nesterov``,
            ``ns_coefficients``, ``ns_steps``, ``muon_eps``, ``adjust_lr_fn`` of
            :class:`~.muon.MuonWithAdamW`.

    Raises:
        ValueError: an out-of-range hyperparameter (named, with its value), an unknown
            implementation, fused asked for a device without fused kernels, or no trainable
            parameter.
    """
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"optimizer lr must be finite and > 0, got {lr}")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"optimizer betas must be two values in [0, 1), got {betas}")
    if not eps > 0:
        raise ValueError(f"optimizer eps must be > 0, got {eps}")
    if not weight_decay >= 0:
        raise ValueError(f"optimizer weight_decay must be >= 0, got {weight_decay}")
    decay, no_decay = split_decay_params(
        model, decay_embeddings=decay_embeddings, decay_norms_and_biases=decay_norms_and_biases
    )
    matrices: NamedParams = []
    if muon is not None:
        matrices, decay = split_muon_params(model, decay)
    groups = [
        {"params": [p for _, p in named], "weight_decay": wd}
        for named, wd in ((decay, weight_decay), (no_decay, 0.0))
        if named
    ]
    if not groups and not matrices:
        raise ValueError(
            f"{type(model).__name__} has no parameter with requires_grad=True to optimize"
        )
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"optimizer.implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}"
        )
    first = groups[0]["params"][0] if groups else matrices[0][1]
    fused_here = fused_adamw_runs(first.device, first.dtype)
    if implementation == "fused" and not fused_here:
        raise ValueError(
            f"optimizer.implementation = 'fused' but this torch build has no fused AdamW for "
            f"{first.device.type} parameters; use 'foreach' or 'auto'"
        )
    fused = implementation == "fused" or (implementation == "auto" and fused_here)
    if muon is not None:
        return MuonWithAdamW(
            [p for _, p in matrices],
            groups,
            lr=lr,
            weight_decay=weight_decay,
            betas=tuple(betas),
            eps=eps,
            fused=fused,
            **muon,
        )
    return torch.optim.AdamW(
        groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused, foreach=not fused
    )


@torch.no_grad()
def clip_grad_norm_(
    parameters: Iterable[torch.Tensor], max_norm: float, pp_mesh: DeviceMesh | None = None
) -> torch.Tensor:
    """Scale gradients in place so their global L2 norm is at most ``max_norm``.

    The norm covers every rank's shard of every gradient, whatever mesh it lives on (dense FSDP x
    TP, expert meshes, pipeline stages): the gradients are grouped by their DTensor mesh (plain
    tensors form one group), ``torch.nn.utils.get_total_norm`` gives each group's norm,
    ``full_tensor()`` all-reduces it over that mesh (as torchtitan's
    ``dist_utils.clip_grad_norm_``), the groups' squares add up, and with ``pp_mesh`` the sum is
    all-reduced over the pipeline stages, each of which holds other parameters. Scaling is torch's
    ``clip_grads_with_norm_`` per group (factor ``min(1, max_norm / (norm + 1e-6))``). A non-finite
    norm leaves the gradients untouched and is returned for the caller to decide. One ``foreach``
    norm and one all-reduce per mesh (plus one over ``pp_mesh``), no host-device sync. Parameters
    without a grad are ignored.

    Returns:
        0-dim fp32 tensor: the global gradient norm before clipping (0.0 if no grads), the same on
        every rank.

    Raises:
        ValueError: ``max_norm`` is not finite and > 0.
    """
    if not (math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"max_norm must be finite and > 0, got {max_norm}")
    groups: dict[DeviceMesh | None, list[torch.Tensor]] = {}
    for param in parameters:
        if param.grad is not None:
            groups.setdefault(
                param.grad.device_mesh if isinstance(param.grad, DTensor) else None, []
            ).append(param)
    if not groups:
        return torch.zeros((), dtype=torch.float32)
    norms = []
    for params in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0, foreach=True)
        norms.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).float())
    total_norm = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
    if pp_mesh is not None:
        squares = total_norm.square()
        dist.all_reduce(squares, group=pp_mesh.get_group())
        total_norm = squares.sqrt()
    finite_norm = torch.where(
        torch.isfinite(total_norm), total_norm, 0.0
    )  # non-finite: factor 1, no host read
    for params in groups.values():
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, finite_norm, foreach=True)
    return total_norm
