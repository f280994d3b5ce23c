"""torchrun worker for tests/test_muon_layouts.py: Muon on row shards that torch.chunk splits
unevenly, vs one process.

Every rank builds the same matrices (seeded), row-shards them over a 1-D gloo mesh
(``distribute_tensor``,
``Shard(0)``: over 3 ranks 7 rows are 3 + 3 + 1, 2 rows are 1 + 1 + 0), and takes 3 Muon steps with
the same seeded gradients as a plain-tensor copy on the rank. Rank 0 returns
(``dist_helpers.write_result``) the names of the parameters whose gathered weights or momenta differ
from the copy's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from dist_helpers import leave_together, write_result
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from torchtitan_lite.components.muon import MuonWithAdamW

SHAPES = {
    "tall": (7, 5),
    "one_row_each": (3, 9),
    "an_empty_shard": (2, 6),
    "wide": (4, 10),
    "experts": (4, 3, 5),
    "norm": (5,),
}
SETTINGS = {
    "lr": 0.02,
    "weight_decay": 0.1,
    "momentum": 0.95,
    "nesterov": True,
    "ns_coefficients": (3.4445, -4.7750, 2.0315),
    "ns_steps": 5,
    "muon_eps": 1e-7,
    "adjust_lr_fn": "match_rms_adamw",
    "betas": (0.9, 0.95),
    "eps": 1e-8,
    "fused": False,
}


def _optimizer(params: dict[str, torch.Tensor]) -> MuonWithAdamW:
    return MuonWithAdamW(
        [p for n, p in params.items() if n != "norm"], [{"params": [params["norm"]]}], **SETTINGS
    )


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    gen = torch.Generator().manual_seed(0)
    full = {name: torch.randn(shape, generator=gen) for name, shape in SHAPES.items()}
    whole = {name: torch.nn.Parameter(t.clone()) for name, t in full.items()}
    sharded = {
        name: torch.nn.Parameter(distribute_tensor(t.clone(), mesh, [Shard(0)]))
        for name, t in full.items()
    }
    opts = _optimizer(whole), _optimizer(sharded)
    for _ in range(3):
        for name in SHAPES:
            grad = torch.randn(SHAPES[name], generator=gen)
            whole[name].grad = grad.clone()
            sharded[name].grad = distribute_tensor(grad.clone(), mesh, [Shard(0)])
        for opt in opts:
            opt.step()
    differ = [
        name
        for name in SHAPES
        if not torch.equal(sharded[name].full_tensor(), whole[name].detach())
    ]
    differ += [
        f"{name}.momentum_buffer"
        for name in SHAPES
        if name != "norm"
        and not torch.equal(
            opts[1].state[sharded[name]]["momentum_buffer"].full_tensor(),
            opts[0].state[whole[name]]["momentum_buffer"],
        )
    ]
    moved = [name for name in SHAPES if torch.equal(whole[name].detach(), full[name])]
    if dist.get_rank() == 0:
        write_result({"differ": differ, "unchanged": moved})
    leave_together()


if __name__ == "__main__":
    main()
