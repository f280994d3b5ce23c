"""Distributed checkpoints (``torch.distributed.checkpoint``, DCP): save and load the training
state.

Layout: ``<checkpoint folder>/step-N/`` holds DCP's files (``.metadata``, one ``__<rank>_0.distcp``
per rank) and ``meta.json`` (format, step, model, flavor, model args, world size, parallel layout,
the run's config, the LR schedule it followed, and the size and checksum of every file:
:mod:`.integrity`), written last. The checkpoint folder is ``checkpoint.folder`` under
``job.dump_folder`` (torchtitan's ``<dump_folder>/checkpoint/step-N``), so re-running a command
resumes. DCP state-dict keys: ``model`` and ``optimizer`` (``get_state_dict``: sharded DTensors,
resharded on load for any world size and layout; the optimizer state flattened to one key per
parameter, ``state.<fqn>.<key>`` and ``param_groups.<fqn>.<hyperparameter>``, so that pipeline
stages, each holding other parameters, write and read their own keys, as torchtitan does),
``lr_scheduler``, ``train_state``, per data-parallel rank ``dataloader.dp_rank_<d>`` (the ranks of a
tensor-parallel group hold the same one) and per global rank ``rng.rank_<r>``. With another
data-parallel degree every rank loads ``dataloader.dp_rank_0`` (a map-style loader's state is
global; a streaming one's is refused); with another layout the RNG states are skipped. Saves are
atomic (``step-N.tmp`` renamed when complete, :mod:`.storage`) and may run in the background; see
``docs/design.md``, "Checkpoints: atomic and async saves".
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from torchtitan_lite.components.checkpoint.integrity import (
    FORMAT_VERSION,
    describe_files,
    read_meta,
    seal,
    verify_files,
)
from torchtitan_lite.components.checkpoint.meta import check_data_parallel_degree, saved_dp_degree
from torchtitan_lite.components.checkpoint.storage import (
    META_FILE,
    CheckpointError,
    complete_steps,
    free_bytes,
    is_no_space,
    publish,
    remove_step,
    write_json,
)
from torchtitan_lite.distributed.parallel_dims import ParallelDims

_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
"""``get_state_dict`` / ``set_optimizer_state_dict`` options: one optimizer key per parameter (see
the module docstring); nested ``param_groups`` lists would be one key that every pipeline stage
writes with its own parameters, and DCP keeps one rank's."""

EXCLUDABLE = ("optimizer", "lr_scheduler", "dataloader", "train_state")
"""Parts that ``checkpoint.exclude_from_loading`` may name (the model is always loaded)."""


@dataclass
class TrainState:
    """Counters that continue across restarts (saved as ``train_state``)."""

    step: int = 0
    """Optimizer steps done."""
    tokens_seen: int = 0
    """Training tokens consumed over all ranks."""
    skipped_steps: int = 0
    """Steps skipped for a non-finite loss or gradient norm."""


@dataclass
class LoadResult:
    """What :meth:`Checkpointer.load` restored from the checkpoint folder ``path`` of step ``step``:
    ``loaded_names`` (model state names, for ``init_weights(skip=...)``), the ``excluded`` parts
    (``checkpoint.exclude_from_loading``, plus ``rng`` on a new layout) and the checkpoint's
    ``meta.json``."""

    path: str
    step: int
    loaded_names: list[str]
    excluded: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def expected_bytes(model: torch.nn.Module) -> int:
    """Bytes of a checkpoint of ``model`` trained with AdamW: every parameter three times (the
    weights and the two moments, in the parameters' dtype) and the persistent buffers once (global
    sizes: the same on every rank; DCP's metadata, a few KiB per tensor, comes on top)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return 3 * params + buffers


def layout_of(dims: ParallelDims) -> dict[str, int]:
    """The degrees of a layout as ``meta.json`` stores them: ``dp_replicate``, ``dp_shard``,
    ``tp``, ``pp``, ``ep``, and ``cp`` when above 1."""
    layout = {
        "dp_replicate": dims.dp_replicate,
        "dp_shard": dims.dp_shard,
        "tp": dims.tp,
        "pp": dims.pp,
        "ep": dims.ep,
    }
    return layout | ({"cp": dims.cp} if dims.cp > 1 else {})


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type != "cpu":
        state[device.type] = torch.get_device_module(device.type).get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type != "cpu":
        torch.get_device_module(device.type).set_rng_state(state[device.type], device)


class Checkpointer:
    """Saves and loads the training state of one run (call every method on every rank).

    Args:
        folder: the checkpoint folder (:func:`~.storage.checkpoint_folder`).
        dataloader: a ``StatefulDataLoader`` of a :mod:`torchtitan_lite.data.loader` training set.
        dims: the run's layout: global rank and world size, data-parallel rank and degree, the
            degrees.
        meta: what ``meta.json`` records besides step, world size, layout and files: ``model``,
            ``flavor``, ``model_args``, ``config``, ``lr_schedule`` (the caller may update it
            between saves).
        keep_latest_k: complete checkpoints to keep (0 = all).
        async_mode: ``"disabled"`` or ``"async"`` (a background write; :meth:`finish` completes it).
    """

    def __init__(
        self,
        folder: str,
        *,
        model,
        optimizer,
        lr_scheduler,
        dataloader,
        dims: ParallelDims,
        device: torch.device,
        meta: dict[str, Any],
        keep_latest_k: int = 0,
        async_mode: str = "disabled",
    ):
        if async_mode not in ("disabled", "async"):
            raise ValueError(
                f"checkpoint.async_mode must be 'disabled' or 'async', got {async_mode!r}"
            )
        self.folder, self.model, self.optimizer = folder, model, optimizer
        self.lr_scheduler, self.dataloader = lr_scheduler, dataloader
        self.rank, self.world_size, self.device = dist.get_rank(), dims.world_size, device
        self.dp_rank, self.dp_degree, self.layout = dims.dp_rank, dims.dp_degree, layout_of(dims)
        self.meta, self.keep_latest_k, self.async_mode = meta, keep_latest_k, async_mode
        self._pending: tuple[Any, str, int, int] | None = None
        self._rng: dict[str, torch.Tensor] | None = None
        self._async_group = dist.new_group(backend="gloo") if async_mode == "async" else None

    def _state(
        self, train_state: TrainState | None, parts: tuple[str, ...], data_rank: int
    ) -> dict[str, Any]:
        """The DCP state dict of the ``parts`` to save or load into; the data loader's under
        data-parallel rank ``data_rank``."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=_OPTIONS)
        state: dict[str, Any] = {"model": model_sd}
        if "optimizer" in parts:
            state["optimizer"] = optim_sd
        if "lr_scheduler" in parts:
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        if "train_state" in parts:
            state["train_state"] = dataclasses.asdict(train_state or TrainState())
        if "dataloader" in parts:
            state[f"dataloader.dp_rank_{data_rank}"] = self.dataloader.state_dict()
        if "rng" in parts:
            state[f"rng.rank_{self.rank}"] = _rng_state(self.device)
        return state

    def save(self, train_state: TrainState) -> str | None:
        """Save everything as ``step-<train_state.step>``, atomically; its path, or ``None`` while
        an async write continues (:meth:`finish` completes it).

        Raises:
            CheckpointError: the file system is full (one line: bytes needed and free); the partial
                save is removed, the previous checkpoints are untouched.
        """
        self.finish()
        tmp = os.path.join(self.folder, f"step-{train_state.step}.tmp")
        if self.rank == 0:
            os.makedirs(self.folder, exist_ok=True)
        free = free_bytes(self.folder)
        dist.barrier()
        state = self._state(train_state, (*EXCLUDABLE, "rng"), self.dp_rank)
        try:
            if self.async_mode == "async":
                future = dcp.async_save(state, checkpoint_id=tmp, process_group=self._async_group)
                self._pending = (future, tmp, train_state.step, free)
                return None
            dcp.save(state, checkpoint_id=tmp)
        except (Exception, CheckpointException) as err:  # CheckpointException is a BaseException
            self._failed(err, tmp, free)
        self._pending = (None, tmp, train_state.step, free)
        return self.finish()

    def _failed(self, err: BaseException, tmp: str, free: int) -> None:
        """After a failed write into ``tmp`` (on every rank: DCP gathers the failures of all ranks;
        the ranks follow rank 0's verdict): a full file system becomes one :class:`CheckpointError`,
        with the partial save removed; anything else is re-raised."""
        needed = expected_bytes(self.model)
        verdict = [is_no_space(err, free_bytes(self.folder), needed)]
        dist.broadcast_object_list(verdict, src=0)  # rank 0 holds every rank's failure
        if not verdict[0]:
            raise err
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        latest = complete_steps(self.folder)
        intact = (
            f"the last complete checkpoint step-{latest[-1]} is intact"
            if latest
            else "no checkpoint was saved"
        )
        raise CheckpointError(
            f"no space left on device writing {tmp}: {needed:,} bytes needed, {free:,} free; "
            f"{intact}; free space or "
            "set checkpoint.folder to a larger disk, then run again to resume"
        ) from None

    def finish(self) -> str | None:
        """Complete the pending save: wait for it, record the size and checksum of each file (every
        rank those it wrote, rank 0 also ``.metadata``), write ``meta.json``, rename ``step-N.tmp``
        to ``step-N``, delete checkpoints beyond ``keep_latest_k``. Its path, or ``None`` if none is
        pending.

        Raises:
            CheckpointError: as :meth:`save` (a full file system while the files or ``meta.json``
                were written).
        """
        if self._pending is None:
            return None
        future, tmp, step, free = self._pending
        self._pending = None
        if future is not None:
            try:
                future.result()
            except (Exception, CheckpointException) as err:
                self._failed(err, tmp, free)
        dist.barrier()
        mine = sorted(n for n in os.listdir(tmp) if n.startswith(f"__{self.rank}_")) + (
            [".metadata"] if self.rank == 0 else []
        )
        files: list[dict[str, Any] | None] = [None] * self.world_size
        dist.all_gather_object(files, describe_files(tmp, mine))
        final = tmp.removesuffix(".tmp")
        failure: list[BaseException | None] = [None]
        if self.rank == 0:
            try:
                self._publish(tmp, final, step, {k: v for part in files for k, v in part.items()})
            except OSError as err:
                failure[0] = err
        dist.broadcast_object_list(failure, src=0)
        if failure[0] is not None:
            self._failed(failure[0], tmp, free)
        return final

    def _publish(self, tmp: str, final: str, step: int, files: dict[str, dict[str, Any]]) -> None:
        """Rank 0: check that ``files`` covers every file DCP's ``.metadata`` references, write
        ``meta.json``, publish, prune."""
        referenced = {
            info.relative_path
            for info in dcp.FileSystemReader(tmp).read_metadata().storage_data.values()
        }
        missing = sorted(referenced - files.keys())
        files.update(describe_files(tmp, missing))
        meta = seal(
            {
                "format": FORMAT_VERSION,
                "step": step,
                "world_size": self.world_size,
                "layout": self.layout,
                **self.meta,
                "files": files,
            }
        )
        write_json(os.path.join(tmp, META_FILE), meta)
        publish(tmp, final)
        if self.keep_latest_k:
            for old in complete_steps(self.folder)[: -self.keep_latest_k]:
                remove_step(self.folder, old)

    def load(self, path: str, exclude: tuple[str, ...] = ()) -> tuple[LoadResult, TrainState]:
        """Restore the parts of the checkpoint at ``path`` not in ``exclude``; the model always.

        Reads ``meta.json`` (:func:`~.integrity.read_meta`; the model match was checked before
        launch by ``config.check_paths``) and verifies the size and checksum of every file
        (:func:`~.integrity.verify_files`) before any tensor is read. The optimizer's
        hyperparameters (``lr``, ``betas``, ``eps``, ``weight_decay`` of each param group) stay this
        run's: the checkpoint restores its state (steps, moments); the trainer sets the learning
        rate from the LR schedule it follows. The RNG states are applied by :meth:`restore_rng`.
        With another data-parallel degree every rank loads data-parallel rank 0's data loader state
        (``dataset.world_size_invariant`` must be true); with another layout (world size or any
        degree) the RNG states are skipped (``LoadResult.excluded``).

        Raises:
            CheckpointError: an incomplete or corrupt folder (nothing is loaded or modified), an
                unknown part in ``exclude``, or a data-parallel degree that differs while the data
                loader state of a streaming data set is to be loaded.
        """
        meta = read_meta(path)
        verify_files(path, meta, self.rank, self.world_size)
        bad = sorted(set(exclude) - set(EXCLUDABLE))
        if bad:
            raise CheckpointError(
                f"checkpoint.exclude_from_loading: unknown parts {bad}; choose from {EXCLUDABLE}"
            )
        excluded = list(exclude)
        same_dp = saved_dp_degree(meta) == self.dp_degree
        if "dataloader" not in exclude and not self.dataloader.dataset.world_size_invariant:
            check_data_parallel_degree(meta, path, self.dp_degree)
        if meta["layout"] != self.layout:
            excluded.append("rng")
        parts = tuple(p for p in (*EXCLUDABLE, "rng") if p not in excluded)
        data_rank = self.dp_rank if same_dp else 0
        state = self._state(None, parts, data_rank)
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(self.model, state["model"])
        if "optimizer" in state:
            hyperparameters = [
                {k: v for k, v in group.items() if k != "params"}
                for group in self.optimizer.param_groups
            ]
            set_optimizer_state_dict(
                self.model, self.optimizer, state["optimizer"], options=_OPTIONS
            )
            for group, own in zip(self.optimizer.param_groups, hyperparameters, strict=False):
                group.update(own)
        if "lr_scheduler" in state:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        if "dataloader" in parts:
            self.dataloader.load_state_dict(state[f"dataloader.dp_rank_{data_rank}"])
        if "rng" in parts:
            self._rng = state[f"rng.rank_{self.rank}"]
        train_state = TrainState(**state["train_state"]) if "train_state" in state else TrainState()
        result = LoadResult(path, int(meta["step"]), sorted(state["model"]), excluded, meta)
        return result, train_state

    def restore_rng(self) -> None:
        """Apply the RNG states of the loaded checkpoint (if any), once: call right before the first
        step (building the data loader's iterator draws from the global generator, as it did in the
        run that saved)."""
        if self._rng is not None:
            _set_rng_state(self._rng, self.device)
            self._rng = None
