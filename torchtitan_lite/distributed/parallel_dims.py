"""The parallel layout of a run: its degrees, the one named ``DeviceMesh`` built from them, and the answers to
"which data-parallel rank am I, how many are there" that every consumer asks (data loader, loss scaling,
checkpoint keys, metrics, expert-load sums).

Names follow torchtitan's ``ParallelDims``: ``dp_shard`` is the FSDP2 sharding degree. The mesh has one named
dimension per degree (``dp_shard`` always, so FSDP2 has a mesh even for one process).
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torchtitan_lite.errors import LaunchError


class ParallelDims:
    """Degrees of the parallelisms of a run and, after :meth:`build_mesh`, its device mesh.

    Args:
        dp_shard: FSDP2 sharding degree; -1 = every rank.
        world_size: processes in the job.

    Raises:
        ValueError: ``world_size < 1``.
        LaunchError: degrees whose product is not ``world_size`` (the message names the degrees and the
            world size; their ranges are checked by the config).
    """

    def __init__(self, *, dp_shard: int, world_size: int):
        if world_size < 1:
            raise ValueError(f"world size must be >= 1, got {world_size}")
        self.dp_shard = world_size if dp_shard == -1 else dp_shard
        self.world_size = world_size
        if self.dp_shard != world_size:
            raise LaunchError(f"parallelism.data_parallel_shard_degree = {self.dp_shard} but the world size is "
                             f"{world_size}; the degrees must multiply to the world size (-1 = all ranks)")
        self._mesh: DeviceMesh | None = None

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """Create the mesh over the default process group (call once, on every rank): dimension ``dp_shard``."""
        self._mesh = init_device_mesh(device_type, (self.dp_shard,), mesh_dim_names=("dp_shard",))
        return self._mesh

    @property
    def mesh(self) -> DeviceMesh:
        """The world mesh.

        Raises:
            RuntimeError: :meth:`build_mesh` was not called.
        """
        if self._mesh is None:
            raise RuntimeError("ParallelDims.mesh: call build_mesh(device_type) first")
        return self._mesh

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """The mesh ``fully_shard`` shards over: the ``dp_shard`` dimension."""
        return self.mesh["dp_shard"]

    @property
    def dp_degree(self) -> int:
        """Data-parallel ranks: ranks that see different batches."""
        return self.dp_shard

    @property
    def dp_rank(self) -> int:
        """This rank's index among the data-parallel ranks, ``0 <= dp_rank < dp_degree``."""
        return self.fsdp_mesh.get_local_rank()

    @property
    def dp_group(self) -> dist.ProcessGroup:
        """The process group of the data-parallel ranks (sums over distinct batches: loss, expert loads)."""
        return self.fsdp_mesh.get_group()

    def __repr__(self) -> str:
        return f"ParallelDims(dp_shard={self.dp_shard}, world_size={self.world_size})"
