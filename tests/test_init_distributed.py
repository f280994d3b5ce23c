"""Sharded init on 2 and 3 gloo ranks (FSDP2, uneven shards, tied pair) equals the 1-process init
bitwise."""

import pytest
import torch
from dist_helpers import REPO, launch
from dist_init_worker import PLAN, SEED, TinyModel, full_weights

from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.init.fingerprint import model_fingerprint

WORKER = REPO / "tests" / "dist_init_worker.py"


def _single_process():
    with torch.device("meta"):
        model = TinyModel()
    materialize(model, "cpu")
    init_weights(model, PLAN, SEED)
    return full_weights(model), model_fingerprint(model)


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_sharded_init_equals_single_process_bitwise(world_size):
    got = launch(WORKER, nproc=world_size, timeout=120).result()
    weights, fingerprint = _single_process()

    assert got["weights"].keys() == weights.keys()
    for name, full in weights.items():
        assert torch.equal(got["weights"][name], full), name
    assert (
        got["fingerprints"]
        == [(fingerprint, {"c10d.allreduce_": 1, "c10d._allgather_base_": 1}, 0)] * world_size
    ), "the count of (box, sum) pairs all-reduced, the pairs gathered, no full_tensor"
    plain = got["layouts"]["plain"][0]
    assert got["layouts"] == {
        name: [plain, 0] for name in ("plain", "R", "S(1),S(0)", "2-D R,S(0)", "2-D S(1),S(0)")
    }
    assert got["tied"] and got["unkeyed_dtensor_raises"]
    assert got["placements_match"] == {"R": True, "S(1)": True}, (
        "Replicate and Shard(1) DTensors too"
    )
    assert all(flags == [] for flags in got["flags"].values()), got["flags"]
    for name in ("layers.0.big", "layers.0.small", "output.weight"):
        shards = [local[name] for local in got["locals"]]
        assert sum(s.shape[0] for s in shards) == weights[name].shape[0]
        if weights[name].shape[0] % world_size:
            assert len({s.shape[0] for s in shards}) > 1, f"{name} is unevenly sharded"
        rows = min(s.shape[0] for s in shards)
        for i in range(1, world_size):
            assert not torch.equal(shards[0][:rows], shards[i][:rows]), (
                f"{name}: ranks 0 and {i} drew the same"
            )
