"""The parallel layout of a run: its degrees, the one device mesh built from them, and the answers
to "which data-parallel rank am I, how many are there" that every consumer asks (data loader, loss
scaling, checkpoint keys, metrics, expert-load sums).

Names and layout follow torchtitan's ``ParallelDims`` (``torchtitan/distributed/parallel_dims.py``):
the world is one 1-D mesh, unflattened (``DeviceMesh._unflatten``) into named views over the same
ranks, with the innermost dimension varying fastest:

  * dense ``(pp, dp_replicate, dp_shard, cp, tp)``: pipeline stages, HSDP replicas, FSDP2 shards,
    context parallel (a window's sequence split), tensor parallel;
  * batch ``(pp, dp, cp, tp)``: ``dp = dp_replicate * dp_shard``, the ranks that see different
    batches (the ranks of one ``cp`` group see the same windows, each its share of the positions);
  * sparse ``(pp, dp_replicate, efsdp, ep)`` when ``ep > 1``: expert parallelism borrows its ``ep``
    ranks from the ``dp_shard * cp * tp`` ranks of a replica (innermost first), and the experts are
    FSDP-sharded over the ``efsdp = dp_shard * cp * tp / ep`` ranks left.

Under context parallelism FSDP2 shards over ``dp_shard x cp`` (one ``dp_shard_cp`` dimension of the
``fsdp`` view, as torchtitan's), and the token sums (loss, expert loads) are taken over ``dp x cp``
(:attr:`ParallelDims.loss_group`).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torchtitan_lite.errors import LaunchError


class ParallelDims:
    """Degrees of the parallelisms of a run and, after :meth:`build_mesh`, its device meshes.

    Args:
        dp_replicate: HSDP replica groups (``data_parallel_replicate_degree``), >= 1.
        dp_shard: FSDP2 sharding degree (``data_parallel_shard_degree``); -1 = the ranks left by the
            others.
        tp: tensor-parallel degree, >= 1.
        cp: context-parallel degree (``context_parallel_degree``), >= 1.
        pp: pipeline-parallel degree (stages), >= 1.
        ep: expert-parallel degree, >= 1, dividing ``dp_shard * cp * tp``.
        world_size: processes in the job.

    Raises:
        ValueError: a degree out of range (the config checks ranges first).
        LaunchError: degrees whose product is not ``world_size`` or an ``ep`` that does not divide
            ``dp_shard * cp * tp`` (each message names the degrees and the world size).
    """

    def __init__(
        self,
        *,
        dp_replicate: int = 1,
        dp_shard: int = -1,
        tp: int = 1,
        pp: int = 1,
        ep: int = 1,
        cp: int = 1,
        world_size: int,
    ):
        if world_size < 1:
            raise ValueError(f"world size must be >= 1, got {world_size}")
        named = {
            "data_parallel_replicate_degree": dp_replicate,
            "tensor_parallel_degree": tp,
            "context_parallel_degree": cp,
            "pipeline_parallel_degree": pp,
            "expert_parallel_degree": ep,
        }
        for key, value in named.items():
            if value < 1:
                raise ValueError(f"parallelism.{key} must be >= 1, got {value}")
        if dp_shard != -1 and dp_shard < 1:
            raise ValueError(
                f"parallelism.data_parallel_shard_degree must be -1 (the ranks left) or >= 1, got "
                f"{dp_shard}"
            )
        others = dp_replicate * cp * tp * pp
        cp_text = f"context_parallel_degree {cp} * " if cp > 1 else ""
        if dp_shard == -1:
            if world_size % others:
                raise LaunchError(
                    f"the world size {world_size} is not a multiple of "
                    f"data_parallel_replicate_degree {dp_replicate} * {cp_text}"
                    f"tensor_parallel_degree {tp} * pipeline_parallel_degree {pp} = "
                    f"{others}; pick degrees that divide it"
                )
            dp_shard = world_size // others
        if dp_replicate * dp_shard * cp * tp * pp != world_size:
            raise LaunchError(
                f"data_parallel_replicate_degree {dp_replicate} * "
                f"data_parallel_shard_degree {dp_shard} * {cp_text}tensor_parallel_degree "
                f"{tp} * pipeline_parallel_degree {pp} = "
                f"{dp_replicate * dp_shard * cp * tp * pp}, not the world size "
                f"{world_size}; set data_parallel_shard_degree = -1 or degrees that "
                "multiply to the world size"
            )
        if (dp_shard * cp * tp) % ep:
            raise LaunchError(
                f"expert_parallel_degree {ep} must divide data_parallel_shard_degree "
                f"{dp_shard} * {cp_text}tensor_parallel_degree {tp} = "
                f"{dp_shard * cp * tp} (expert parallelism borrows those ranks)"
            )
        self.dp_replicate, self.dp_shard, self.tp, self.pp, self.ep = (
            dp_replicate,
            dp_shard,
            tp,
            pp,
            ep,
        )
        self.cp = cp
        self.world_size = world_size
        self._meshes: dict[str, DeviceMesh] = {}

    @classmethod
    def from_config(cls, parallelism: Any, world_size: int) -> ParallelDims:
        """The degrees of a ``[parallelism]`` config section (``config/schema.py``) on
        ``world_size`` ranks.

        Raises:
            LaunchError: as the constructor.
        """
        return cls(
            dp_replicate=parallelism.data_parallel_replicate_degree,
            dp_shard=parallelism.data_parallel_shard_degree,
            tp=parallelism.tensor_parallel_degree,
            pp=parallelism.pipeline_parallel_degree,
            ep=parallelism.expert_parallel_degree,
            cp=parallelism.context_parallel_degree,
            world_size=world_size,
        )

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """Create the world mesh and its views over the default process group (call once, on every
        rank), with ``cp > 1`` the ``fsdp`` view ``(pp, dp_replicate, dp_shard_cp, tp)`` and the
        ``loss`` view ``(pp, dp_cp, tp)``, and the flattened ``dp_replicate_dp_shard`` (HSDP),
        ``dp_shard_tp`` (TP) and ``dp_replicate_dp_shard_tp`` (both) meshes of the layouts that
        have them (``dp_shard_cp`` in place of ``dp_shard`` with ``cp > 1``), and under expert
        parallelism ``efsdp_ep`` (``dp_replicate_efsdp_ep`` with HSDP): a DTensor reduced over the
        dimensions of its FSDP x TP or experts' mesh (a gradient norm) then takes one collective
        instead of one per dimension."""
        world = init_device_mesh(device_type, (self.world_size,), mesh_dim_names=("world",))
        self._meshes = {
            "world": world,
            "dense": world._unflatten(
                0,
                (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp),
                ("pp", "dp_replicate", "dp_shard", "cp", "tp"),
            ),
            "batch": world._unflatten(
                0, (self.pp, self.dp_degree, self.cp, self.tp), ("pp", "dp", "cp", "tp")
            ),
        }
        dense = self._meshes["dense"]
        shard = ("dp_shard", "cp") if self.cp > 1 else ("dp_shard",)  # the dims FSDP2 shards over
        if self.cp > 1:  # views with the two dims as one (the same ranks, innermost first)
            self._meshes["fsdp"] = world._unflatten(
                0,
                (self.pp, self.dp_replicate, self.dp_shard * self.cp, self.tp),
                ("pp", "dp_replicate", "dp_shard_cp", "tp"),
            )
            self._meshes["loss"] = world._unflatten(
                0, (self.pp, self.dp_degree * self.cp, self.tp), ("pp", "dp_cp", "tp")
            )
        shard_name = "_".join(shard)
        for names in (
            ("dp_replicate", "dp_shard"),
            ("dp_shard", "tp"),
            ("dp_replicate", "dp_shard", "tp"),
        ):
            # the meshes FSDP x TP builds: one collective where a DTensor reduces over these dims
            if all(getattr(self, name) > 1 for name in names if name != "dp_shard"):
                dims = tuple(d for n in names for d in (shard if n == "dp_shard" else (n,)))
                if len(dims) > 1 and dims != shard:
                    dense[dims]._flatten("_".join(names).replace("dp_shard", shard_name))
        if self.ep > 1:
            self._meshes["sparse"] = world._unflatten(
                0,
                (self.pp, self.dp_replicate, self.dp_shard * self.cp * self.tp // self.ep, self.ep),
                ("pp", "dp_replicate", "efsdp", "ep"),
            )
            sparse = self._meshes["sparse"]
            names = ("dp_replicate", "efsdp", "ep") if self.dp_replicate > 1 else ("efsdp", "ep")
            sparse[names]._flatten(
                "_".join(names)
            )  # one collective where an expert DTensor reduces over these dims
        return world

    def _view(self, name: str) -> DeviceMesh:
        if not self._meshes:
            raise RuntimeError("ParallelDims: call build_mesh(device_type) first")
        if name not in self._meshes:
            raise RuntimeError(f"ParallelDims: no {name} mesh in this layout ({self})")
        return self._meshes[name]

    @property
    def mesh(self) -> DeviceMesh:
        """The 1-D world mesh (``"world"``)."""
        return self._view("world")

    @property
    def dense_mesh(self) -> DeviceMesh:
        """The ``(pp, dp_replicate, dp_shard, cp, tp)`` view."""
        return self._view("dense")

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """The mesh ``fully_shard`` shards dense parameters over: ``dp_shard`` (``dp_shard_cp``
        under context parallelism), or the 2-D ``(dp_replicate, dp_shard[_cp])`` for HSDP
        (replicated over the first, sharded over the second)."""
        if self.cp > 1:
            view, shard = self._view("fsdp"), "dp_shard_cp"
        else:
            view, shard = self.dense_mesh, "dp_shard"
        return view["dp_replicate", shard] if self.dp_replicate > 1 else view[shard]

    @property
    def tp_mesh(self) -> DeviceMesh:
        """The tensor-parallel mesh (size ``tp``; size 1 when off)."""
        return self.dense_mesh["tp"]

    @property
    def pp_mesh(self) -> DeviceMesh:
        """The pipeline mesh (size ``pp``; size 1 when off)."""
        return self.dense_mesh["pp"]

    @property
    def ep_mesh(self) -> DeviceMesh:
        """The expert-parallel mesh (``ep > 1`` only)."""
        return self._view("sparse")["ep"]

    @property
    def efsdp_mesh(self) -> DeviceMesh:
        """The mesh experts are FSDP-sharded over under expert parallelism (``ep > 1`` only)."""
        sparse = self._view("sparse")
        return sparse["dp_replicate", "efsdp"] if self.dp_replicate > 1 else sparse["efsdp"]

    @property
    def dp_mesh(self) -> DeviceMesh:
        """The ranks that see different batches (``dp_replicate * dp_shard`` of them), as one
        dimension."""
        return self._view("batch")["dp"]

    @property
    def dp_degree(self) -> int:
        """Data-parallel ranks: ranks that see different batches."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_rank(self) -> int:
        """This rank's index among the data-parallel ranks, ``0 <= dp_rank < dp_degree``."""
        return self.dp_mesh.get_local_rank()

    @property
    def dp_group(self) -> dist.ProcessGroup:
        """The process group of the data-parallel ranks (sums over distinct batches: loss, expert
        loads)."""
        return self.dp_mesh.get_group()

    @property
    def cp_mesh(self) -> DeviceMesh:
        """The context-parallel mesh: the ranks that share one window's positions (size ``cp``; 1
        when off)."""
        return self.dense_mesh["cp"]

    @property
    def cp_rank(self) -> int:
        """This rank's index in its context-parallel group, ``0 <= cp_rank < cp``."""
        return self.cp_mesh.get_local_rank()

    @property
    def loss_mesh(self) -> DeviceMesh:
        """The ranks whose token sums make the global batch's (loss, validation, expert loads):
        ``dp`` x ``cp`` as one dimension (``dp`` when ``cp`` is 1; torchtitan's ``loss_mesh``)."""
        return self._view("loss")["dp_cp"] if self.cp > 1 else self.dp_mesh

    @property
    def loss_degree(self) -> int:
        """Ranks of :attr:`loss_mesh`: ``dp_degree * cp``."""
        return self.dp_degree * self.cp

    @property
    def loss_group(self) -> dist.ProcessGroup:
        """The process group of :attr:`loss_mesh`."""
        return self.loss_mesh.get_group()

    @property
    def tp_rank(self) -> int:
        """This rank's index in its tensor-parallel group."""
        return self.tp_mesh.get_local_rank()

    @property
    def pp_rank(self) -> int:
        """This rank's pipeline stage group index, ``0 <= pp_rank < pp``."""
        return self.pp_mesh.get_local_rank()

    def __repr__(self) -> str:
        return (
            f"ParallelDims(dp_replicate={self.dp_replicate}, dp_shard={self.dp_shard}, "
            f"tp={self.tp}, pp={self.pp}, ep={self.ep}, cp={self.cp}, world_size={self.world_size})"
        )
