"""torchrun worker of test_init_distributed.py: FSDP2-sharded init on gloo, results returned by rank
0 (``dist_helpers.write_result``).

Usage: ``TORCHTITAN_LITE_TEST_RESULTS=DIR torchrun --nproc_per_node=N tests/dist_init_worker.py``.
The shards of the 255x66 parameter cut through its keyed tiles (16 rows each).
"""

import torch
import torch.distributed as dist
from dist_helpers import leave_together, write_result
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

from torchtitan_lite.init import keyed, sampling
from torchtitan_lite.init.apply import init_weights, materialize, tensor_groups
from torchtitan_lite.init.fingerprint import model_fingerprint
from torchtitan_lite.init.report import init_report
from torchtitan_lite.init.spec import InitPlan, normal, ones, trunc_normal


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.small = nn.Parameter(torch.empty(7, 5))
        self.big = nn.Parameter(torch.empty(255, 66))


class TinyModel(nn.Module):
    """Uneven shapes for 2 and 3 ranks (7x5, 255x66, 37x16) and a tied embedding/output pair."""

    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(37, 16)
        self.layers = nn.ModuleDict({"0": Block()})
        self.norm = nn.Parameter(torch.empty(16))
        self.output = nn.Linear(16, 37, bias=False)
        self.output.weight = self.tok_embeddings.weight


PLAN = InitPlan(
    "tiny_dist",
    (
        ("tok_embeddings.weight", normal(1.0)),
        ("layers.0.small", trunc_normal(0.5, cutoff=2.0)),
        ("layers.0.big", trunc_normal(0.02)),
        ("norm", ones()),
        ("output.weight", trunc_normal(0.1)),
    ),
)
SEED = 20260


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Canonical first name -> full tensor (gathered; collective)."""
    out = {}
    for names, tensor in tensor_groups(model):
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        out[names[0]] = full.detach().clone()
    return out


def _spied_fingerprint(model: nn.Module) -> tuple[str, dict[str, int], int]:
    """``(fingerprint, collectives it ran by name, full_tensor() calls)``."""
    calls, real = [], DTensor.full_tensor

    def spy(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    DTensor.full_tensor = spy
    try:
        with CommDebugMode() as comms:
            fingerprint = model_fingerprint(model)
    finally:
        DTensor.full_tensor = real
    return fingerprint, {str(op): n for op, n in comms.get_comm_counts().items()}, len(calls)


class Pair(nn.Module):
    """Two parameters to place on meshes (uneven for 2 and 3 ranks)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor):
        super().__init__()
        self.a, self.b = nn.Parameter(a), nn.Parameter(b)


def _layout_fingerprints(world: int) -> dict[str, list[str]]:
    """Fingerprints of one pair of tensors, plain and as DTensors on 1-D and 2-D meshes, on this
    rank."""
    gen = torch.Generator().manual_seed(SEED)
    a, b = torch.randn(7, 2 * world + 1, generator=gen), torch.randn(5, generator=gen).bfloat16()
    mesh_1d, mesh_2d = init_device_mesh("cpu", (world,)), init_device_mesh("cpu", (world, 1))
    layouts = {
        "plain": (None, [], []),
        "R": (mesh_1d, [Replicate()], [Replicate()]),
        "S(1),S(0)": (mesh_1d, [Shard(1)], [Shard(0)]),
        "2-D R,S(0)": (mesh_2d, [Replicate(), Shard(0)], [Replicate(), Shard(0)]),
        "2-D S(1),S(0)": (mesh_2d, [Shard(1), Shard(0)], [Shard(0), Replicate()]),
    }
    out = {}
    for name, (mesh, place_a, place_b) in layouts.items():
        pair = (
            Pair(a.clone(), b.clone())
            if mesh is None
            else Pair(distribute_tensor(a, mesh, place_a), distribute_tensor(b, mesh, place_b))
        )
        out[name] = [model_fingerprint(pair), _spied_fingerprint(pair)[2]]
    return out


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    with torch.device("meta"):
        model = TinyModel()
    fully_shard(model.layers["0"], mesh=mesh)
    fully_shard(model, mesh=mesh)
    materialize(model, "cpu")
    result = init_weights(model, PLAN, SEED)
    try:
        sampling.trunc_normal_(model.layers["0"].big)
        unkeyed_dtensor_raises = False
    except ValueError:
        unkeyed_dtensor_raises = True
    placements_match = {}
    for placement in (Replicate(), Shard(1)):
        dt = distribute_tensor(torch.zeros(9, 2 * world + 1), mesh, [placement])
        sampling.trunc_normal_(dt, 0.0, 1.0, -2.0, 2.0, key=keyed.InitKey(SEED, "extra"))
        reference = sampling.trunc_normal_(
            torch.empty(9, 2 * world + 1), 0.0, 1.0, -2.0, 2.0, key=keyed.InitKey(SEED, "extra")
        )
        placements_match[str(placement)] = torch.equal(dt.full_tensor(), reference)
    locals_ = [None] * world
    dist.all_gather_object(
        locals_,
        {n: t.to_local().clone() for n, t in [(names[0], t) for names, t in tensor_groups(model)]},
    )
    fingerprint, comms, gathers = _spied_fingerprint(model)
    fingerprints = [None] * world
    dist.all_gather_object(fingerprints, (fingerprint, comms, gathers))
    layouts = _layout_fingerprints(world)
    weights = full_weights(model)
    report = init_report(model, PLAN, result)
    if rank == 0:
        write_result(
            {
                "weights": weights,
                "locals": locals_,
                "fingerprints": fingerprints,
                "layouts": layouts,
                "tied": model.output.weight is model.tok_embeddings.weight,
                "unkeyed_dtensor_raises": unkeyed_dtensor_raises,
                "placements_match": placements_match,
                "flags": {r.name: r.flags for r in report.rows},
                "initialized_elements": result.initialized_elements,
            }
        )
    leave_together()


if __name__ == "__main__":
    main()
