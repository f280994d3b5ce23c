"""ParallelDims: degrees resolve and are checked before any process group exists."""

import pytest

from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.errors import LaunchError


def test_data_parallel_shard_minus_one_takes_the_ranks_left():
    dims = ParallelDims(dp_replicate=2, tp=2, pp=2, world_size=16)
    assert (dims.dp_replicate, dims.dp_shard, dims.tp, dims.pp, dims.dp_degree) == (2, 2, 2, 2, 4)
    assert ParallelDims(world_size=3).dp_shard == 3


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            dict(dp_shard=3, world_size=4),
            LaunchError,
            r"data_parallel_shard_degree 3 .* = 3, not the world size 4",
        ),
        (
            dict(tp=3, world_size=4),
            LaunchError,
            r"world size 4 is not a multiple of .* tensor_parallel_degree 3 .* = 3",
        ),
        (dict(tp=0, world_size=4), ValueError, r"tensor_parallel_degree must be >= 1, got 0"),
        (
            dict(dp_shard=0, world_size=4),
            ValueError,
            r"data_parallel_shard_degree must be -1 .* got 0",
        ),
        (
            dict(dp_shard=2, tp=2, ep=3, world_size=4),
            LaunchError,
            r"expert_parallel_degree 3 must divide .* = 4",
        ),
    ],
)
def test_impossible_layouts_name_the_degrees_and_the_world_size(kwargs, error, message):
    with pytest.raises(error, match=message):
        ParallelDims(**kwargs)


def test_meshes_need_build_mesh_first():
    with pytest.raises(RuntimeError, match=r"call build_mesh"):
        _ = ParallelDims(world_size=1).dp_rank


def test_from_config_reads_the_parallelism_section():
    from torchtitan_lite.preflight.checks import parse_args

    config = parse_args(
        ["--parallelism.data_parallel_replicate_degree=2", "--parallelism.tensor_parallel_degree=2"]
    )
    dims = ParallelDims.from_config(config.parallelism, world_size=8)
    assert (dims.dp_replicate, dims.dp_shard, dims.tp, dims.pp, dims.dp_degree) == (2, 2, 2, 1, 4)
