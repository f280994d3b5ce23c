"""What a run starts from (:func:`load_at_start`: a checkpoint to resume, else an HF folder to
import, else nothing), and resuming with changed settings: the config a checkpoint was saved with
against this run's, in one line.

Every checkpoint records the run's resolved config (``meta.json["config"]``, :func:`config_values`)
and the LR schedule the run followed (``meta.json["lr_schedule"]``, the settings of
:data:`~..lr_schedule.SCHEDULE_KEYS`). On resume the model settings must match
(``check_compatible``); every other value is this run's, except the LR schedule: it continues as
saved unless ``checkpoint.reset_lr_schedule`` asks for this run's, which then applies from the
resumed step (a longer ``training.steps`` without it: the LR stays at the saved schedule's final
value after its last step).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from torch import nn

from torchtitan_lite.components.checkpoint.checkpointer import Checkpointer, TrainState
from torchtitan_lite.components.checkpoint.storage import checkpoint_folder, find_checkpoint
from torchtitan_lite.components.hf.load import load_hf_folder
from torchtitan_lite.components.lr_schedule import SCHEDULE_KEYS, follow_schedule
from torchtitan_lite.components.metrics import folder_bytes, format_bytes

IGNORED = (
    "job.config_file",
    "job.dump_folder",
    "job.description",
    "job.print_config",
    "checkpoint.folder",
    "checkpoint.load_step",
    "checkpoint.load_path",
    "checkpoint.exclude_from_loading",
    "checkpoint.reset_lr_schedule",
)
"""Keys that say where this run is and how it starts, not how it trains: never reported as
changed."""
_UNSET = object()


def config_values(config: Any) -> dict[str, Any]:
    """Every key of the sectioned config dataclass ``config`` as ``section.key`` (table entries as
    ``section.key.name``) -> its JSON-normal value (tuples become lists)."""
    values: dict[str, Any] = {}
    for section in dataclasses.fields(config):
        part = getattr(config, section.name)
        for f in dataclasses.fields(part):
            value = getattr(part, f.name)
            if isinstance(value, dict):
                values.update({f"{section.name}.{f.name}.{k}": v for k, v in value.items()})
            else:
                values[f"{section.name}.{f.name}"] = value
    return json.loads(json.dumps(values))


def schedule_settings(values: dict[str, Any]) -> dict[str, Any]:
    """The LR schedule settings (``follow_schedule``'s arguments) from :func:`config_values`
    output."""
    return {name: values[key] for name, key in SCHEDULE_KEYS.items()}


def _text(value: Any) -> str:
    return "unset" if value is _UNSET or value is None else json.dumps(value)


def resume_line(
    saved: dict[str, Any],
    now: dict[str, Any],
    saved_schedule: dict[str, Any],
    *,
    reset: bool,
    step: int,
) -> str | None:
    """The line that lists every config value of this run (``now``) that differs from the
    checkpoint's (``saved``) and says which one applies, or ``None`` when nothing differs;
    ``warning: ...`` when the LR schedule of this run differs from the one the checkpoint followed
    (``saved_schedule``) and ``reset`` (``checkpoint.reset_lr_schedule``) is off. ``step``: the
    resumed step."""
    changed = [
        f"{key} {_text(saved.get(key, _UNSET))} -> {_text(now.get(key, _UNSET))}"
        for key in sorted(saved.keys() | now.keys())
        if key not in IGNORED and saved.get(key, _UNSET) != now.get(key, _UNSET)
    ]
    mine = schedule_settings(now)
    if mine == saved_schedule:
        return (
            f"resumed with settings changed since the checkpoint: {', '.join(changed)}; this run's "
            "values apply"
            if changed
            else None
        )
    listed = f": {', '.join(changed)}" if changed else ""
    if reset:
        return (
            f"resumed with settings changed since the checkpoint{listed}; this run's values apply, "
            f"the LR schedule too (checkpoint.reset_lr_schedule: from step {step})"
        )
    kept = ", ".join(
        f"{SCHEDULE_KEYS[name]} {_text(value)}"
        for name, value in saved_schedule.items()
        if value != mine[name]
    )
    return (
        f"warning: resumed with settings changed since the checkpoint{listed}; this run's values "
        "apply except "
        f"the LR schedule, which continues as saved ({kept}): pass --checkpoint.reset_lr_schedule "
        f"to follow this run's from step {step}"
    )


def load_at_start(
    config: Any, checkpointer: Checkpointer, scheduler: Any, model: nn.Module, args: Any
) -> tuple[TrainState, list[str], Callable[[int], list[str]]]:
    """``(train_state, loaded model names, lines)``: resume from a checkpoint if there is one to
    resume (into ``checkpointer``'s model, optimizer, ``scheduler`` and data position), else import
    ``checkpoint.initial_load_hf`` into ``model`` (of ``args``) if set, else a fresh start
    ``(TrainState(), [],
    ...)``; ``lines(n)`` describes what was loaded given ``n``, the count of loaded tensors (a tied
    pair counts once, as in the init line). Call it with the checkpoint folder held (``hold.py``).

    On resume the LR schedule continues as the checkpoint followed it, or with
    ``checkpoint.reset_lr_schedule`` as this run's settings say, from the resumed step; a line lists
    the settings that differ from the checkpoint's (:func:`resume_line`).

    Raises:
        CheckpointError, HFError: see :meth:`Checkpointer.load` and ``components/hf/load.py``.
    """
    cp = config.checkpoint
    folder = checkpoint_folder(config.job.dump_folder, cp.folder)
    path = (
        find_checkpoint(folder, cp.load_step, cp.load_path) if cp.enable or cp.load_path else None
    )
    if path is not None:
        result, train_state = checkpointer.load(path, tuple(cp.exclude_from_loading))
        skipped = f"; not loaded: {', '.join(result.excluded)}" if result.excluded else ""
        size = format_bytes(folder_bytes(path))
        saved = f", saved at step {result.step}" if result.step != train_state.step else ""
        now, saved_schedule = checkpointer.meta["config"], result.meta["lr_schedule"]
        if "lr_scheduler" not in result.excluded:
            schedule = schedule_settings(now) if cp.reset_lr_schedule else saved_schedule
            follow_schedule(scheduler, **schedule)
            checkpointer.meta["lr_schedule"] = schedule
        changed = resume_line(
            result.meta["config"],
            now,
            saved_schedule,
            reset=cp.reset_lr_schedule,
            step=scheduler.last_epoch,
        )
        return (
            train_state,
            result.loaded_names,
            lambda n: [
                f"resumed at step {train_state.step} from {path} ({size}{saved}): {n} model "
                f"tensors loaded{skipped}",
                *([changed] if changed else []),
            ],
        )
    if cp.initial_load_hf is None:
        return TrainState(), [], lambda n: []
    imported = load_hf_folder(
        model,
        cp.initial_load_hf,
        config.model.name,
        args,
        allow_unexpected=cp.initial_load_hf_allow_unexpected,
    )
    return TrainState(), imported.loaded, lambda n: imported.describe(cp.initial_load_hf, n)
