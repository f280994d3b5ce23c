"""torchrun worker for tests/test_parallelize.py: FSDP2 on gloo vs a single-process reference.

Every rank builds the same toy transformer-shaped model twice: a full reference (seeded, plain CPU)
and a copy built on meta, sharded with ``apply_fsdp`` (optionally after activation checkpointing),
materialized with ``to_empty`` and filled from the reference's state dict. Each rank feeds its
slice of one global batch with loss = local token-loss sum / GLOBAL token count; the reference
feeds the whole batch. Rank 0 returns (``dist_helpers.write_result``) the largest differences of
each mode.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from dist_helpers import leave_together, write_result
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, distribute_tensor

from torchtitan_lite.components.optimizer import build_optimizer, clip_grad_norm_
from torchtitan_lite.distributed.activation_checkpoint import apply_activation_checkpointing
from torchtitan_lite.distributed.fsdp import apply_fsdp
from torchtitan_lite.models.common.norm import RMSNorm

VOCAB, DIM, HIDDEN, N_LAYERS = 33, 16, 24, 2  # 33 rows: uneven Shard(0) over 2 ranks
BATCH, SEQ = 4, 8


class Block(nn.Module):
    """Pre-norm residual MLP: ``x + w2(silu(w1(norm(x))))``, ``(bs, seq, dim) -> same``."""

    def __init__(self):
        super().__init__()
        self.ffn_norm = RMSNorm(DIM)
        self.w1 = nn.Linear(DIM, HIDDEN)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        return x + self.w2(F.silu(self.w1(self.ffn_norm(x))))


class ToyLM(nn.Module):
    """tok_embeddings -> layers (ModuleDict) -> norm -> output, output tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(N_LAYERS)})
        self.norm = RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for block in self.layers.values():
            h = block(h)
        return self.output(self.norm(h))


def loss_fn(model, tokens, targets, global_count):
    """Token cross-entropy summed over this batch, divided by the global token count."""
    logits = model(tokens)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum") / global_count


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def run(ac_mode: str, rank: int, world: int, mesh) -> dict:
    torch.manual_seed(0)
    ref = ToyLM()
    with torch.no_grad():  # RMSNorm weights are created empty: set them near 1
        for name, p in ref.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    ref_state = {k: v.clone() for k, v in ref.state_dict().items()}
    data = torch.randint(0, VOCAB, (2, BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))

    with torch.device("meta"):
        model = ToyLM()
    apply_activation_checkpointing(model, ac_mode)
    apply_fsdp(
        model,
        mesh,
        param_dtype=torch.float32,
        reduce_dtype=torch.float32,
        reshard_after_forward=True,
    )
    model.to_empty(device="cpu")
    tied_after_to_empty = model.output.weight is model.tok_embeddings.weight
    canonical = {
        k.replace("_checkpoint_wrapped_module.", ""): v for k, v in model.named_parameters()
    }
    with torch.no_grad():
        for name, p in canonical.items():
            p.copy_(distribute_tensor(ref_state[name], p.device_mesh, p.placements))

    opt_kwargs = dict(
        lr=1e-2,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=0.1,
        decay_embeddings=False,
        decay_norms_and_biases=False,
    )
    opt = build_optimizer(model, **opt_kwargs)
    ref_opt = build_optimizer(ref, **opt_kwargs)
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    count = BATCH * SEQ
    grad_diff, norm_diff, norms = 0.0, 0.0, []
    for step in range(2):
        tokens, targets = data[step, :, :-1], data[step, :, 1:]
        loss_fn(model, tokens[rows], targets[rows], count).backward()
        loss_fn(ref, tokens, targets, count).backward()
        if step == 0:
            ref_grads = {k: p.grad for k, p in ref.named_parameters()}
            grad_diff = max(
                (full(p.grad) - ref_grads[k]).abs().max().item() for k, p in canonical.items()
            )
        norm = clip_grad_norm_(model.parameters(), max_norm=0.5)
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm=0.5)
        norm_diff = max(norm_diff, abs(norm.item() - ref_norm.item()))
        norms.append(norm.item())
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    ref_after = dict(ref.named_parameters())
    weight_diff = max((full(p) - ref_after[k]).abs().max().item() for k, p in canonical.items())
    moved = (full(model.output.weight) - ref_state["tok_embeddings.weight"]).abs().max().item()
    return {
        "ac_mode": ac_mode,
        "grad_diff": grad_diff,
        "norm_diff": norm_diff,
        "grad_norms": norms,
        "weight_diff": weight_diff,
        "tied_after_to_empty": tied_after_to_empty,
        "tied_after_steps": model.output.weight is model.tok_embeddings.weight,
        "tied_names_equal": torch.equal(
            full(model.output.weight), full(model.tok_embeddings.weight)
        ),
        "embedding_moved": moved,
        "params_are_dtensor": all(isinstance(p, DTensor) for p in canonical.values()),
        "tied_group_is_one": len(
            {id(m._get_fsdp_state()) for m in (model.tok_embeddings, model.norm, model.output)}
        )
        == 1,
    }


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    results = [run(mode, rank, world, mesh) for mode in ("none", "full")]
    if rank == 0:
        write_result(results)
    leave_together()


if __name__ == "__main__":
    main()
