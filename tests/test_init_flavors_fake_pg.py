"""The fake-process-group path of ``benchmarks/bench_init_flavors.py`` initializes the real shard of
a rank.

What makes that benchmark honest: playing rank ``r`` of ``N`` on a fake process group, after
``apply_fsdp`` and ``materialize``, ``init_weights`` gives bitwise the rows a 1-process init of the
same model and seed puts on rank ``r`` (``torch.chunk`` of dim 0, FSDP2's Shard(0)), uneven shards
included, and the benchmark's shard-size prediction is FSDP2's.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from dist_helpers import REPO, env
from model_helpers import build_planned

from torchtitan_lite.models import get_model_spec, model_names

sys.path.insert(0, str(REPO / "benchmarks"))
from bench_init_flavors import build_meta, choose_rank, shard_numels  # noqa: E402

# One fake rank per process (one thread), as the benchmark runs it (see its module docstring): saves
# the local shards.
CHILD = """
import sys, torch, torch.distributed as dist
from torch.distributed.tensor import DTensor
sys.path.insert(0, "benchmarks")
from bench_init_flavors import init_rank
model, timing = init_rank(sys.argv[1], "debug", int(sys.argv[2]), int(sys.argv[3]), seed=7)
shards = {n: p.to_local().clone() for n, p in model.named_parameters() if isinstance(p, DTensor)}
dist.destroy_process_group()
torch.save((shards, timing.__dict__), sys.argv[4])
"""


RANKS = {"gpt_oss": (3, 1), "deepseek_v3": (5, 4)}
"""The fake rank each family plays, ``(world_size, rank)``; the others play rank 2 of 3 (uneven
shards)."""


@pytest.mark.parametrize(
    "family, world_size, rank", [(name, *RANKS.get(name, (3, 2))) for name in model_names()]
)
def test_fake_pg_rank_holds_the_rows_of_a_one_process_init(family, world_size, rank, tmp_path):
    spec = get_model_spec(family)
    whole = dict(
        build_planned(
            spec.model_cls, spec.init_plan, spec.flavors["debug"], seed=7
        ).named_parameters()
    )
    out = tmp_path / "shards.pt"
    subprocess.run(
        [sys.executable, "-c", CHILD, family, str(world_size), str(rank), str(out)],
        cwd=REPO,
        env=env(),
        check=True,
    )
    shards, timing = torch.load(out)
    assert sorted(shards) == sorted(whole)
    for name, local in shards.items():
        expected = torch.chunk(whole[name].detach(), world_size, dim=0)
        expected = (
            expected[rank]
            if rank < len(expected)
            else whole[name].new_empty(0, *whole[name].shape[1:])
        )
        assert torch.equal(local, expected), name
    assert timing["shard_params"] == sum(t.numel() for t in shards.values())
    assert timing["shard_params"] == shard_numels(build_meta(family, "debug")[0], world_size)[rank]
    assert timing["total_params"] == sum(t.numel() for t in whole.values())


def test_world_size_is_the_smallest_power_of_two_whose_rank_0_fits():
    model, _ = build_meta("qwen3", "debug")
    total = sum(p.numel() for p in model.parameters())
    assert choose_rank(model, total) == (1, 0, total)
    n, rank, rank0 = choose_rank(model, total // 3)
    assert (n, rank) == (4, 0) and rank0 == shard_numels(model, 4)[0] <= total // 3 < shard_numels(
        model, 2
    )[0]


def test_when_one_expert_is_over_budget_a_rank_without_experts_is_chosen():
    model, args = build_meta(
        "gpt_oss", "debug"
    )  # 8 experts: rank 0 keeps >= 1 expert of each MoE tensor
    one_expert_per_layer = args.n_layers * (
        args.dim * 2 * args.moe_inter_dim + args.moe_inter_dim * args.dim
    )
    n, rank, rank0 = choose_rank(model, one_expert_per_layer)
    counts = shard_numels(model, n)
    assert rank0 > one_expert_per_layer >= counts[rank] and rank >= args.num_experts
    with pytest.raises(
        ValueError, match="budget must be > 0 parameters, got 0; raise --max-shard-gib"
    ):
        choose_rank(model, 0)
