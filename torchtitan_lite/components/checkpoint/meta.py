"""What a checkpoint's ``meta.json`` says about the run that saved it, checked against this run: the
same model (family, flavor, arguments) and, for a streaming loader state, the same data-parallel
degree. No heavy imports: the checks before launch use it."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from torchtitan_lite.components.checkpoint.storage import META_FILE, CheckpointError


def model_args_json(args) -> dict[str, Any]:
    """A model args dataclass as the JSON-normal dict stored in ``meta.json`` (tuples become
    lists)."""
    return json.loads(json.dumps(dataclasses.asdict(args)))


def check_compatible(
    meta: dict[str, Any], path: str, model_name: str, flavor: str, model_args: dict
) -> None:
    """The checkpoint at ``path`` was saved by the same model family, flavor and model arguments.

    Raises:
        CheckpointError: naming the first key that differs, with both values.
    """
    saved = {
        "model": meta.get("model"),
        "flavor": meta.get("flavor"),
        **(meta.get("model_args") or {}),
    }
    now = {"model": model_name, "flavor": flavor, **model_args}
    for key in now:
        if saved.get(key) != now[key]:
            raise CheckpointError(
                f"checkpoint {os.path.join(path, META_FILE)}: {key} = {saved.get(key)!r} but this "
                f"run has {now[key]!r}; run with the checkpoint's model settings, or use another "
                "job.dump_folder / checkpoint.folder (or checkpoint.enable=false) to start fresh"
            )


def saved_dp_degree(meta: dict[str, Any]) -> int:
    """The data-parallel degree (``dp_replicate * dp_shard``) of the run that saved the checkpoint
    ``meta``."""
    return meta["layout"]["dp_replicate"] * meta["layout"]["dp_shard"]


def check_data_parallel_degree(meta: dict[str, Any], path: str, dp_degree: int) -> None:
    """A streaming dataset's data loader state (per data-parallel rank) loads only with the
    data-parallel degree that saved it.

    Raises:
        CheckpointError: the checkpoint at ``path`` was saved by another degree than ``dp_degree``;
            names both and the two ways on.
    """
    saved = saved_dp_degree(meta)
    if saved != dp_degree:
        raise CheckpointError(
            f"checkpoint {path} was saved by {saved} data-parallel ranks and this run has "
            f"{dp_degree}: "
            "the data loader state of a streaming dataset is per data-parallel rank; pass "
            "--checkpoint.exclude_from_loading=dataloader to load model, optimizer, scheduler and "
            f"step (the data order then restarts), or run with {saved} data-parallel ranks"
        )
