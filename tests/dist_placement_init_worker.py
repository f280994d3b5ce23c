"""torchrun worker of test_keyed_boxes.py: keyed init of DTensors with every placement on a 2 x 2
gloo mesh.

Every rank returns (``dist_helpers.write_result``), per case, whether the gathered tensor equals the
1-process keyed init bitwise, this rank's local elements and the elements it drew.
"""

import torch
import torch.distributed as dist
from dist_helpers import leave_together, write_result
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from torchtitan_lite.init import keyed
from torchtitan_lite.init.keyed import InitKey
from torchtitan_lite.init.sampling import trunc_normal_

CASES = {  # name: (global shape, placements on the (dp, tp) mesh)
    "S0_S1": ((300, 260), (Shard(0), Shard(1))),
    "S1_S0": ((320, 256), (Shard(1), Shard(0))),
    "R_S1": ((97, 512), (Replicate(), Shard(1))),
    "S2_S0_3d": ((6, 40, 256), (Shard(2), Shard(0))),
    "S1_S1": ((64, 1024), (Shard(1), Shard(1))),
}


def counting():
    """Patch ``keyed.keyed_fill`` to record the elements each call draws; returns the running
    list."""
    drawn, real = [], keyed.keyed_fill

    def spy(tensor, key, law, cast, compiled):
        n = real(tensor, key, law, cast, compiled)
        drawn.append(n)
        return n

    keyed.keyed_fill = spy
    return drawn


def check(name, dtensor, shape, drawn, out):
    key = InitKey(11, name)
    start = len(drawn)
    trunc_normal_(dtensor, 0.0, 0.02, -0.06, 0.06, key=key)
    mine = sum(drawn[start:])
    reference = trunc_normal_(torch.empty(shape), 0.0, 0.02, -0.06, 0.06, key=key)
    del drawn[start:]
    out[name] = {
        "equal": bool(torch.equal(dtensor.full_tensor(), reference)),
        "local": dtensor.to_local().numel(),
        "local_shape": list(dtensor.to_local().shape),
        "shape": list(shape),
        "drawn": mine,
        "placements": str(dtensor.placements),
    }


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    drawn, out = counting(), {}
    for name, (shape, placements) in CASES.items():
        check(name, distribute_tensor(torch.zeros(shape), mesh, placements), shape, drawn, out)
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(256, 512, bias=False), nn.Linear(512, 256, bias=False))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "1": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])  # TP + FSDP on dim 0 of the colwise weight: _StridedShard
    model.to_empty(device="cpu")
    for name, param in model.named_parameters():
        check(f"fsdp_tp.{name}", param, tuple(param.shape), drawn, out)
    write_result({"rank": dist.get_rank(), "cases": out})
    leave_together()


if __name__ == "__main__":
    main()
