"""Distributed checkpoints (``torch.distributed.checkpoint``, DCP): atomic step folders, discovery, resume.

Layout: ``<checkpoint folder>/step-N/`` holds DCP's files (``.metadata``, one ``__<rank>_0.distcp`` per rank)
and ``meta.json`` (format, step, model, flavor, model args, world size), written last. The checkpoint folder
is ``checkpoint.folder`` under ``job.dump_folder`` (torchtitan's ``<dump_folder>/checkpoint/step-N``), so
re-running a command resumes. DCP state-dict keys: ``model`` and ``optimizer`` (``get_state_dict``: sharded
DTensors, resharded on load for any world size), ``lr_scheduler``, ``train_state``, and per rank
``dataloader.dp_rank_<r>`` and ``rng.dp_rank_<r>``. On another world size the RNG states are skipped and every
rank loads ``dataloader.dp_rank_0`` (a map-style loader's state is global; a streaming one's is refused).
Saves are atomic (``step-N.tmp`` renamed when complete) and may run in the background; see
``docs/design.md``, "Checkpoints: atomic and async saves".
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_optimizer_state_dict

from torchtitan_lite.errors import UserError

META_FILE = "meta.json"
"""Per-checkpoint description, written last by rank 0."""
FORMAT_VERSION = 2
"""Version of the layout above, stored in ``meta.json`` (2: the map-style loader state is ``windows_consumed``)."""
EXCLUDABLE = ("optimizer", "lr_scheduler", "dataloader", "train_state")
"""Parts that ``checkpoint.exclude_from_loading`` may name (the model is always loaded)."""
_STEP_RE = re.compile(r"^step-(\d+)$")


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be used: one line naming the file or key and what to do."""


def checkpoint_folder(dump_folder: str, folder: str) -> str:
    """Absolute path of the checkpoint folder: ``folder`` under ``dump_folder`` (an absolute ``folder`` wins)."""
    return os.path.abspath(os.path.join(dump_folder, folder))


def complete_steps(folder: str) -> list[int]:
    """Steps of the complete checkpoints in ``folder`` (``step-N`` with ``meta.json``), ascending."""
    if not os.path.isdir(folder):
        return []
    steps = []
    for name in os.listdir(folder):
        match = _STEP_RE.match(name)
        if match and os.path.isfile(os.path.join(folder, name, META_FILE)):
            steps.append(int(match.group(1)))
    return sorted(steps)


def find_checkpoint(folder: str, load_step: int = -1, load_path: str | None = None) -> str | None:
    """The checkpoint to resume from, or ``None`` for a fresh start: ``load_path`` (a ``step-N`` folder anywhere)
    if given, else in ``folder`` the latest complete one (``load_step = -1``) or ``step-<load_step>``.

    Raises:
        CheckpointError: ``load_path`` or the requested step does not exist (message lists what exists).
    """
    if load_path is not None:
        if not os.path.isdir(load_path):
            raise CheckpointError(f"checkpoint.load_path: no such folder {load_path!r}; point it at a step-N "
                                  "checkpoint folder")
        return os.path.abspath(load_path)
    steps = complete_steps(folder)
    if load_step == -1:
        return os.path.join(folder, f"step-{steps[-1]}") if steps else None
    if load_step not in steps:
        raise CheckpointError(f"checkpoint.load_step: no complete checkpoint step-{load_step} in {folder} "
                              f"(complete: {', '.join(f'step-{s}' for s in steps) or 'none'}); "
                              "pick one of these or -1 for the latest")
    return os.path.join(folder, f"step-{load_step}")


def read_meta(path: str) -> dict[str, Any]:
    """``meta.json`` of the checkpoint at ``path``, after checking that it parses, that DCP's ``.metadata``
    reads and that every data file it references exists and is long enough (truncated or deleted shards).

    Raises:
        CheckpointError: the first problem found, naming the file.
    """
    meta_path = os.path.join(path, META_FILE)
    try:
        with open(meta_path, encoding="utf-8") as handle:
            meta = json.load(handle)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path}: no {META_FILE}, so it is incomplete or not a checkpoint; "
                              "point checkpoint.load_path at a step-N folder written by this trainer") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {meta_path} is corrupt ({err}); load another step with "
                              "checkpoint.load_step or delete this folder") from None
    found = meta.get("format") if isinstance(meta, dict) else meta
    if found != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {meta_path}: format {found!r} is not {FORMAT_VERSION}; it was not "
                              "written by this version of the trainer")
    try:
        metadata = dcp.FileSystemReader(path).read_metadata()
    except Exception as err:  # DCP raises whatever unpickling or reading the file raised
        raise CheckpointError(f"checkpoint {os.path.join(path, '.metadata')} is missing or corrupt "
                              f"({type(err).__name__}: {err}); load another step with checkpoint.load_step "
                              "or delete this folder") from None
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        file = os.path.join(path, name)
        actual = os.path.getsize(file) if os.path.isfile(file) else None
        if actual is None or actual < size:
            found = "missing" if actual is None else f"{actual} bytes, expected at least {size}"
            raise CheckpointError(f"checkpoint file {file} is {found} (truncated or deleted); load another "
                                  "step with checkpoint.load_step or delete this folder")
    return meta


def model_args_json(args) -> dict[str, Any]:
    """A model args dataclass as the JSON-normal dict stored in ``meta.json`` (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(args)))


def check_compatible(meta: dict[str, Any], path: str, model_name: str, flavor: str, model_args: dict) -> None:
    """The checkpoint at ``path`` was saved by the same model family, flavor and model arguments.

    Raises:
        CheckpointError: naming the first key that differs, with both values.
    """
    saved = {"model": meta.get("model"), "flavor": meta.get("flavor"), **(meta.get("model_args") or {})}
    now = {"model": model_name, "flavor": flavor, **model_args}
    for key in now:
        if saved.get(key) != now[key]:
            raise CheckpointError(
                f"checkpoint {os.path.join(path, META_FILE)}: {key} = {saved.get(key)!r} but this run has "
                f"{now[key]!r}; run with the checkpoint's model settings, or use another job.dump_folder / "
                "checkpoint.folder (or checkpoint.enable=false) to start fresh")


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
    ``loaded_names`` (model state names, for ``init_weights(skip=...)``) and the ``excluded`` parts
    (``checkpoint.exclude_from_loading``, plus ``rng`` on a new world size)."""

    path: str
    step: int
    loaded_names: list[str]
    excluded: list[str] = field(default_factory=list)


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
        folder: the checkpoint folder (:func:`checkpoint_folder`).
        dataloader: a ``StatefulDataLoader`` of a :mod:`torchtitan_lite.data.loader` training set.
        meta: what ``meta.json`` records besides step and world size: ``model``, ``flavor``, ``model_args``.
        keep_latest_k: complete checkpoints to keep (0 = all).
        async_mode: ``"disabled"`` or ``"async"`` (a background write; :meth:`finish` completes it).
    """

    def __init__(self, folder: str, *, model, optimizer, lr_scheduler, dataloader, rank: int, world_size: int,
                 device: torch.device, meta: dict[str, Any], keep_latest_k: int = 0, async_mode: str = "disabled"):
        if async_mode not in ("disabled", "async"):
            raise ValueError(f"checkpoint.async_mode must be 'disabled' or 'async', got {async_mode!r}")
        self.folder, self.model, self.optimizer = folder, model, optimizer
        self.lr_scheduler, self.dataloader = lr_scheduler, dataloader
        self.rank, self.world_size, self.device = rank, world_size, device
        self.meta, self.keep_latest_k, self.async_mode = meta, keep_latest_k, async_mode
        self._pending: tuple[Any, str, int] | None = None
        self._cleaned = False
        self._async_group = dist.new_group(backend="gloo") if async_mode == "async" else None

    def _state(self, train_state: TrainState | None, parts: tuple[str, ...], data_rank: int) -> dict[str, Any]:
        """The DCP state dict of the ``parts`` to save or load into; the data loader's under ``data_rank``."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
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
            state[f"rng.dp_rank_{self.rank}"] = _rng_state(self.device)
        return state

    def save(self, train_state: TrainState) -> str | None:
        """Save everything as ``step-<train_state.step>``, atomically; its path, or ``None`` while an async
        write continues (:meth:`finish` completes it)."""
        self.finish()
        final = os.path.join(self.folder, f"step-{train_state.step}")
        tmp = final + ".tmp"
        if self.rank == 0:
            os.makedirs(self.folder, exist_ok=True)
            if not self._cleaned:
                for name in os.listdir(self.folder):
                    if name.endswith(".tmp"):
                        shutil.rmtree(os.path.join(self.folder, name))
                self._cleaned = True
        dist.barrier()
        state = self._state(train_state, (*EXCLUDABLE, "rng"), self.rank)
        if self.async_mode == "async":
            future = dcp.async_save(state, checkpoint_id=tmp, process_group=self._async_group)
            self._pending = (future, tmp, train_state.step)
            return None
        dcp.save(state, checkpoint_id=tmp)
        self._pending = (None, tmp, train_state.step)
        return self.finish()

    def finish(self) -> str | None:
        """Complete the pending save (wait, barrier, ``meta.json``, rename, prune); its path, or ``None``."""
        if self._pending is None:
            return None
        future, tmp, step = self._pending
        self._pending = None
        if future is not None:
            future.result()
        dist.barrier()
        final = tmp.removesuffix(".tmp")
        if self.rank == 0:
            meta = {"format": FORMAT_VERSION, "step": step, "world_size": self.world_size, **self.meta}
            with open(os.path.join(tmp, META_FILE), "w", encoding="utf-8") as handle:
                json.dump(meta, handle, indent=1)
                handle.flush()
                os.fsync(handle.fileno())
            if os.path.exists(final):  # resumed from an older step: replace the newer one of the old run
                shutil.rmtree(final)
            os.rename(tmp, final)
            self._prune()
        dist.barrier()
        return final

    def _prune(self) -> None:
        """Delete complete checkpoints beyond the latest ``keep_latest_k`` (rank 0)."""
        if self.keep_latest_k:
            for step in complete_steps(self.folder)[: -self.keep_latest_k]:
                shutil.rmtree(os.path.join(self.folder, f"step-{step}"))

    def load(self, path: str, exclude: tuple[str, ...] = ()) -> tuple[LoadResult, TrainState]:
        """Restore the parts of the checkpoint at ``path`` not in ``exclude``; the model always.

        Reads ``meta.json`` with :func:`read_meta` (the model match was checked before launch by
        ``config.check_paths``). With another world size the RNG states are skipped (``LoadResult.excluded``)
        and every rank loads rank 0's data loader state (``dataset.world_size_invariant`` must be true).

        Raises:
            CheckpointError: an incomplete or corrupt folder, an unknown part in ``exclude``, or a world size
                that differs while the data loader state of a streaming data set is to be loaded.
        """
        meta = read_meta(path)
        bad = sorted(set(exclude) - set(EXCLUDABLE))
        if bad:
            raise CheckpointError(f"checkpoint.exclude_from_loading: unknown parts {bad}; choose from {EXCLUDABLE}")
        excluded = list(exclude)
        same_world = meta["world_size"] == self.world_size
        if not same_world:
            if "dataloader" not in exclude and not self.dataloader.dataset.world_size_invariant:
                raise CheckpointError(
                    f"checkpoint {path} was saved by {meta['world_size']} ranks and this run has {self.world_size}: "
                    "the data loader state of a streaming dataset is per rank; pass "
                    "--checkpoint.exclude_from_loading=dataloader to load model, optimizer, scheduler and step "
                    f"(the data order then restarts), or run with {meta['world_size']} ranks")
            excluded.append("rng")
        parts = tuple(p for p in (*EXCLUDABLE, "rng") if p not in excluded)
        data_rank = self.rank if same_world else 0
        state = self._state(None, parts, data_rank)
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(self.model, state["model"])
        if "optimizer" in state:
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        if "lr_scheduler" in state:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        if "dataloader" in parts:
            self.dataloader.load_state_dict(state[f"dataloader.dp_rank_{data_rank}"])
        if "rng" in parts:
            _set_rng_state(state[f"rng.dp_rank_{self.rank}"], self.device)
        train_state = TrainState(**state["train_state"]) if "train_state" in state else TrainState()
        result = LoadResult(path, int(meta["step"]), sorted(state["model"]), excluded)
        return result, train_state
