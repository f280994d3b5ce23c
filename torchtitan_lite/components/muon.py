"""Muon for the weight matrices, AdamW for the rest, on whole matrices under FSDP2 / HSDP.

Muon (Keller Jordan 2024; Moonlight, "Muon is Scalable for LLM Training", arXiv 2502.16982): a
momentum buffer ``B <- lerp(B, G, 1 - momentum)``, the update ``U = lerp(G, B, momentum)``
(Nesterov) orthogonalized by a quintic Newton-Schulz iteration in bfloat16, decoupled weight decay
``W <- W * (1 - lr * wd)`` and ``W <- W - lr' * NS(U)``, ``lr' = lr * 0.2 * sqrt(max(rows, cols))``
(Moonlight's update RMS matched to AdamW's). The op sequence is ``torch.optim.Muon``'s (torch 2.13
``torch/optim/_muon.py``); ``tests/test_muon.py`` holds it bitwise equal.

Note: docs/design.md, "on whole matrices".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.load import where

ADJUST_LR_FNS = ("match_rms_adamw", "original")
"""Values of ``optimizer.adjust_lr_fn`` (``torch.optim.Muon``'s names)."""


def check_muon_config(config, sources) -> None:
    """``optimizer.name = "Muon"`` runs on data-parallel layouts only (FSDP2, HSDP; its matrices are
    gathered over the row-shard dimension), and ``ns_coefficients`` is three numbers; one
    :class:`ConfigError` line otherwise. Tensor- and expert-parallel weights are split over more
    mesh dimensions (and pipeline stages were not run with it), which this gather does not cover."""
    opt = config.optimizer
    if opt.name != "Muon":
        return
    for name in ("tensor_parallel_degree", "expert_parallel_degree", "pipeline_parallel_degree"):
        degree = getattr(config.parallelism, name)
        if degree > 1:
            raise ConfigError(
                f"{where(sources, 'optimizer.name')}: Muon gathers whole matrices over FSDP2 / "
                f"HSDP shards only, but parallelism.{name} = {degree}; set it to 1 (use data "
                "parallelism) "
                'or optimizer.name = "AdamW"'
            )
    if len(opt.ns_coefficients) != 3:
        raise ConfigError(
            f"{where(sources, 'optimizer.ns_coefficients')}: must be three numbers (a, b, c), got "
            f"{opt.ns_coefficients}; e.g. [3.4445, -4.7750, 2.0315]"
        )


def newton_schulz(
    update: torch.Tensor, coefficients: Sequence[float], steps: int, eps: float
) -> torch.Tensor:
    """The quintic Newton-Schulz orthogonalization of one matrix (Keller Jordan's Muon;
    ``torch.optim.Muon``'s op order): in bfloat16, the wide orientation, divided by
    ``max(||X||_F, eps)``, then ``steps`` times ``A = X X^T``, ``X <- a X + (b A + c A A) X``.

    Args:
        update: ``(rows, cols)`` matrix, any float dtype.
        coefficients: ``(a, b, c)``.
        steps: iterations, >= 1.
        eps: floor of the norm, > 0.

    Returns:
        ``(rows, cols)`` bfloat16, singular values near 1 (in about ``[0.7, 1.2]``, not exactly
        orthogonal).
    """
    a, b, c = coefficients
    x = update.bfloat16()
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    return x.T if tall else x


def adjusted_lr(lr: float, adjust_lr_fn: str, rows: int, cols: int) -> float:
    """The learning rate of a ``(rows, cols)`` matrix's orthogonalized update: ``match_rms_adamw`` =
    ``lr * 0.2 * sqrt(max(rows, cols))`` (Moonlight, eq. 4), ``original`` =
    ``lr * sqrt(max(1, rows / cols))`` (Keller Jordan's Muon); as ``torch.optim.Muon``."""
    if adjust_lr_fn == "match_rms_adamw":
        return lr * (0.2 * math.sqrt(max(rows, cols)))
    return lr * math.sqrt(max(1, rows / cols))


def split_muon_params(
    model: nn.Module, decay: list[tuple[str, nn.Parameter]]
) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """Split the weight-decay group ``decay`` (:func:`~.optimizer.split_decay_params`) into (Muon,
    AdamW): Muon takes the parameters with >= 2 dims that are neither an ``nn.Embedding``'s nor
    ``model.output``'s (Moonlight's reference split: the embedding and the head stay on AdamW); 3-D
    parameters are stacks of expert matrices."""
    kept_out = {
        id(p)
        for m in model.modules()
        if isinstance(m, nn.Embedding)
        for p in m.parameters(recurse=False)
    }
    output = getattr(model, "output", None)
    if isinstance(output, nn.Module):
        kept_out.update(id(p) for p in output.parameters())
    muon = [(n, p) for n, p in decay if p.ndim in (2, 3) and id(p) not in kept_out]
    chosen = {id(p) for _, p in muon}
    return muon, [(n, p) for n, p in decay if id(p) not in chosen]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _shard_group(param: torch.Tensor) -> tuple[dist.ProcessGroup | None, int, int]:
    """(process group, size, this rank's index) of the mesh dimension that row-shards ``param``;
    ``(None, 1, 0)`` when every rank holds it whole.

    Raises:
        ValueError: a placement other than ``Shard(0)`` on one mesh dimension and ``Replicate`` on
            the others (tensor or expert parallelism; ``check_optimizer`` refuses those layouts
            before launch).
    """
    if not isinstance(param, DTensor):
        return None, 1, 0
    sharded = [d for d, pl in enumerate(param.placements) if not isinstance(pl, Replicate)]
    if not sharded:
        return None, 1, 0
    if len(sharded) > 1 or param.placements[sharded[0]] != Shard(0):
        raise ValueError(
            "Muon needs parameters row-sharded on one mesh dimension (FSDP2 / HSDP), got "
            f"placements {param.placements} of shape {tuple(param.shape)}"
        )
    dim = sharded[0]
    mesh = param.device_mesh
    return mesh.get_group(dim), mesh.size(dim), mesh.get_local_rank(dim)


def _rows(n: int, size: int) -> list[int]:
    """Rows of each of ``size`` shards of ``n`` rows (``torch.chunk``'s split, which FSDP2's
    ``Shard(0)`` uses)."""
    per = -(-n // size)
    return [max(0, min(per, n - k * per)) for k in range(size)]


def _orthogonalize(matrix: torch.Tensor, coefficients, steps: int, eps: float) -> torch.Tensor:
    """:func:`newton_schulz` of a 2-D matrix, or of each matrix of a 3-D expert stack (none: an
    empty shard), contiguous bfloat16."""
    if matrix.ndim == 2:
        return newton_schulz(matrix, coefficients, steps, eps).contiguous()
    if matrix.shape[0] == 0:
        return matrix.bfloat16()
    return torch.stack([newton_schulz(m, coefficients, steps, eps) for m in matrix.unbind(0)])


def owners(numels: list[int], size: int) -> list[int]:
    """The owner rank of each matrix: the largest first, each to the rank with the fewest elements
    so far (ties: the lower rank, then the earlier matrix), so every rank computes the same
    assignment from the shapes."""
    load, owner = [0] * size, [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: -numels[i]):
        owner[i] = min(range(size), key=load.__getitem__)
        load[owner[i]] += numels[i]
    return owner


def orthogonalize_sharded(
    updates: list[torch.Tensor],
    shapes: list[torch.Size],
    group,
    size: int,
    rank: int,
    coefficients,
    steps: int,
    eps: float,
) -> list[torch.Tensor]:
    """Newton-Schulz of whole matrices held as row shards over ``group``, each on its owner
    (:func:`owners`): docs/design.md, "Note: on whole matrices".

    Args:
        updates: this rank's row shards, bfloat16, ``(rows of this rank, cols)`` each.
        shapes: each update's global ``(rows, cols)``.
        group, size, rank: the shard dimension's process group, its size and this rank's index in
        it.

    Returns:
        this rank's row shards of the orthogonalized updates, bfloat16, the shapes of ``updates``.
    """
    rows = [_rows(shape[0], size) for shape in shapes]
    inner = [math.prod(shape[1:]) for shape in shapes]
    owner = owners([math.prod(shape) for shape in shapes], size)
    owned = [[i for i in range(len(shapes)) if owner[i] == k] for k in range(size)]
    mine = owned[rank]
    device = updates[0].device if updates else torch.device("cpu")

    def exchange(send_parts: list[list[torch.Tensor]], recv_sizes: list[int]) -> list[torch.Tensor]:
        send = (
            torch.cat([t.reshape(-1) for parts in send_parts for t in parts])
            if any(send_parts)
            else torch.empty(0, dtype=torch.bfloat16, device=device)
        )
        recv = torch.empty(sum(recv_sizes), dtype=torch.bfloat16, device=device)
        # as bytes: gloo's all-to-all has no 16-bit types
        dist.all_to_all_single(
            recv.view(torch.uint8),
            send.view(torch.uint8),
            output_split_sizes=[2 * n for n in recv_sizes],
            input_split_sizes=[2 * sum(t.numel() for t in parts) for parts in send_parts],
            group=group,
        )
        return list(recv.split(recv_sizes))

    # 1. every rank's shard of each matrix to its owner; the owner concatenates them in rank order
    received = exchange(
        [[updates[i] for i in owned[k]] for k in range(size)],
        [sum(rows[i][j] * inner[i] for i in mine) for j in range(size)],
    )
    pieces = [
        block.split([rows[i][j] * inner[i] for i in mine]) for j, block in enumerate(received)
    ]
    results = {}
    for n, i in enumerate(mine):
        whole = torch.cat([pieces[j][n].view(rows[i][j], *shapes[i][1:]) for j in range(size)])
        results[i] = _orthogonalize(whole, coefficients, steps, eps)
    # 2. each rank's rows of the results back from their owners
    starts = [[sum(r[:k]) for k in range(size)] for r in rows]
    back = exchange(
        [[results[i][starts[i][k] : starts[i][k] + rows[i][k]] for i in mine] for k in range(size)],
        [sum(rows[i][rank] * inner[i] for i in owned[j]) for j in range(size)],
    )
    out: list[torch.Tensor | None] = [None] * len(shapes)
    for j, block in enumerate(back):
        for i, piece in zip(
            owned[j], block.split([rows[i][rank] * inner[i] for i in owned[j]]), strict=True
        ):
            out[i] = piece.view(updates[i].shape)
    return out


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon for ``muon_params`` and ``torch.optim.AdamW`` for ``adamw_groups``, as one optimizer:
    one set of param groups (``use_muon`` tells them apart) and one ``state`` for the LR schedule,
    ``zero_grad`` and DCP checkpoints.

    The AdamW groups are an inner ``torch.optim.AdamW``'s own group dicts, which steps them on the
    shared state (re-linked after ``load_state_dict``). A Muon group's state is ``momentum_buffer``,
    shaped and sharded as the parameter. Muon parameters are 2-D matrices or 3-D
    ``(experts, rows, cols)`` stacks, each expert's matrix orthogonalized and learning-rate-scaled
    on its own; FSDP2 / HSDP row shards of 2-D matrices are orthogonalized whole
    (:func:`orthogonalize_sharded`), every rank taking part in every step (docs/design.md, "Note: on
    whole matrices").

    Args:
        muon_params: the matrices (same order on every rank).
        adamw_groups: ``[{"params": [...], "weight_decay": wd}, ...]`` for ``torch.optim.AdamW``.
        lr, weight_decay: of the Muon group (``adamw_groups`` carry their own weight decay; ``lr``
        is shared). momentum, nesterov, ns_coefficients, ns_steps, muon_eps, adjust_lr_fn:
        ``torch.optim.Muon``'s
            ``momentum``, ``nesterov``, ``ns_coefficients``, ``ns_steps``, ``eps``,
            ``adjust_lr_fn``.
        betas, eps, fused: the AdamW part's (``fused=False`` is ``foreach``).

    Raises:
        ValueError: no Muon parameter, a parameter that is not 2-D or 3-D, an unknown
            ``adjust_lr_fn`` or a ``ns_coefficients`` that is not three numbers.
    """

    def __init__(
        self,
        muon_params: list[nn.Parameter],
        adamw_groups: list[dict],
        *,
        lr: float,
        weight_decay: float,
        momentum: float,
        nesterov: bool,
        ns_coefficients: Sequence[float],
        ns_steps: int,
        muon_eps: float,
        adjust_lr_fn: str,
        betas: tuple[float, float],
        eps: float,
        fused: bool,
    ):
        if not muon_params:
            raise ValueError(
                "optimizer.name = 'Muon' found no weight matrix to optimize; use AdamW"
            )
        bad = [tuple(p.shape) for p in muon_params if p.ndim not in (2, 3)]
        if bad:
            raise ValueError(f"Muon optimizes 2-D matrices and 3-D expert stacks, got shapes {bad}")
        if adjust_lr_fn not in ADJUST_LR_FNS:
            raise ValueError(
                f"optimizer.adjust_lr_fn must be one of {ADJUST_LR_FNS}, got {adjust_lr_fn!r}"
            )
        if len(ns_coefficients) != 3:
            raise ValueError(
                f"optimizer.ns_coefficients must be three numbers (a, b, c), got {ns_coefficients}"
            )
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": tuple(ns_coefficients),
            "eps": muon_eps,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
            "use_muon": True,
        }
        super().__init__([{"params": muon_params}], defaults)
        self._adamw = (
            torch.optim.AdamW(
                adamw_groups, lr=lr, betas=betas, eps=eps, fused=fused, foreach=not fused
            )
            if adamw_groups
            else None
        )
        if self._adamw is not None:
            for group in self._adamw.param_groups:
                group["use_muon"] = False
                self.param_groups.append(group)
        self._link_adamw()
        self.defaults["fused"] = (
            fused  # the AdamW part's kernel, as torch.optim.AdamW reports it (start-up line)
        )

    def _link_adamw(self) -> None:
        if self._adamw is not None:
            self._adamw.param_groups = [g for g in self.param_groups if not g["use_muon"]]
            self._adamw.state = self.state

    def load_state_dict(self, state_dict) -> None:
        """``torch.optim.Optimizer.load_state_dict``, then the inner AdamW re-linked to the new
        groups and state."""
        super().load_state_dict(state_dict)
        self._link_adamw()

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every group (a collective under FSDP2: every rank must call it); returns
        ``closure()``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["use_muon"]:
                self._muon_step(group)
        if self._adamw is not None:
            self._adamw.step()
        return loss

    def _muon_step(self, group: dict) -> None:
        """Each matrix held whole here is updated as soon as its momentum is (one update alive at a
        time); the row shards of each shard group are kept, bfloat16, for one exchange
        (:func:`orthogonalize_sharded`)."""
        momentum, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
        ns = (group["ns_coefficients"], group["ns_steps"], group["eps"])

        def apply(p: torch.Tensor, ortho: torch.Tensor) -> None:
            local = _local(p)
            local.mul_(1 - lr * wd)
            local.add_(ortho, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], *p.shape[-2:]))

        sharded: dict[tuple, tuple[dist.ProcessGroup, list[torch.Tensor], list[torch.Tensor]]] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(
                    p.grad, memory_format=torch.preserve_format
                )
            grad, buf = _local(p.grad), _local(state["momentum_buffer"])
            buf.lerp_(grad, 1 - momentum)
            update = (grad.lerp(buf, momentum) if group["nesterov"] else buf).bfloat16()
            pg, size, rank = _shard_group(p)
            if (
                size == 1 or p.ndim == 3
            ):  # whole here: unsharded, or an expert stack split by whole experts
                apply(p, _orthogonalize(update, *ns))
                continue
            _, params, updates = sharded.setdefault((id(pg), size, rank), (pg, [], []))
            params.append(p)
            updates.append(update)
        for (_, size, rank), (pg, params, updates) in sharded.items():
            for p, ortho in zip(
                params,
                orthogonalize_sharded(updates, [p.shape for p in params], pg, size, rank, *ns),
                strict=True,
            ):
                apply(p, ortho)
