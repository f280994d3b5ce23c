"""Warmup-stable-decay (WSD) learning-rate schedule.

WSD (Hu et al. 2024, MiniCPM, arXiv 2404.06395; Hägele et al. 2024, arXiv 2405.18392): linear
warmup, a long constant phase, then a short decay ("cooldown") at the end. Decay shapes:
``linear``; ``cosine`` (half cosine, Loshchilov & Hutter 2017, SGDR, arXiv 1608.03983);
``sqrt`` (``1 - sqrt(progress)``, the cooldown Hägele et al. found best, Sec. 3).
"""

from __future__ import annotations

import functools
import math

import torch

DECAY_TYPES = ("linear", "cosine", "sqrt")


def wsd_lr_factor(
    step: int,
    *,
    warmup_steps: int,
    steps: int,
    decay_ratio: float,
    decay_type: str,
    min_lr_factor: float,
) -> float:
    """LR multiplier at training step ``step`` (1-based: the step about to be taken).

    With ``D = round(decay_ratio * steps)`` decay steps, ``S = steps - D`` the last stable step and
    ``W = min(warmup_steps, S)`` warmup steps (:func:`fitted_warmup_steps`):
      * ``step <= W``: ``step / W`` (1/W at step 1, 1.0 at the end);
      * ``W < step <= S``, or any later step when ``D == 0``: 1.0;
      * ``S < step``: ``min_lr_factor + (1 - min_lr_factor) * shape(p)`` with
        ``p = min(1, (step - S) / D)``, so step ``steps`` (and any later one) gets
        ``min_lr_factor``; ``shape`` is ``1 - p`` (linear), ``(1 + cos(pi p)) / 2`` (cosine),
        ``1 - sqrt(p)`` (sqrt).

    Raises:
        ValueError: see :func:`check_wsd_args`.
    """
    check_wsd_args(
        warmup_steps=warmup_steps,
        steps=steps,
        decay_ratio=decay_ratio,
        decay_type=decay_type,
        min_lr_factor=min_lr_factor,
    )
    decay_steps = round(decay_ratio * steps)
    warmup_steps = fitted_warmup_steps(
        warmup_steps=warmup_steps, steps=steps, decay_ratio=decay_ratio
    )
    if step <= warmup_steps:
        return step / warmup_steps
    last_stable = steps - decay_steps
    if step <= last_stable or decay_steps == 0:
        return 1.0
    progress = min(1.0, (step - last_stable) / decay_steps)
    if decay_type == "linear":
        shape = 1.0 - progress
    elif decay_type == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        shape = 1.0 - math.sqrt(progress)
    return min_lr_factor + (1.0 - min_lr_factor) * shape


def check_wsd_args(
    *, warmup_steps: int, steps: int, decay_ratio: float, decay_type: str, min_lr_factor: float
) -> None:
    """Raise ValueError for ``steps < 1``, ``warmup_steps < 0``, ``decay_ratio`` or
    ``min_lr_factor`` outside ``[0, 1]``, or an unknown ``decay_type``. (A warmup longer than the
    steps before the decay is no error: it is clipped, :func:`fitted_warmup_steps`.)"""
    if steps < 1:
        raise ValueError(f"lr schedule: steps must be >= 1, got {steps}")
    if warmup_steps < 0:
        raise ValueError(f"lr schedule: warmup_steps must be >= 0, got {warmup_steps}")
    if not 0.0 <= decay_ratio <= 1.0:
        raise ValueError(f"lr schedule: decay_ratio must be in [0, 1], got {decay_ratio}")
    if decay_type not in DECAY_TYPES:
        raise ValueError(
            f"lr schedule: decay_type must be one of {DECAY_TYPES}, got {decay_type!r}"
        )
    if not 0.0 <= min_lr_factor <= 1.0:
        raise ValueError(f"lr schedule: min_lr_factor must be in [0, 1], got {min_lr_factor}")


def fitted_warmup_steps(*, warmup_steps: int, steps: int, decay_ratio: float) -> int:
    """The warmup steps the schedule takes: ``warmup_steps`` clipped to the
    ``steps - round(decay_ratio * steps)`` steps before the decay, so a run shorter than the
    configured warmup warms up for as long as it can and keeps its decay as a fraction of the run
    (torchtitan's ``build_lr_schedulers`` also clips the warmup to the run, though it shortens the
    decay instead)."""
    return min(warmup_steps, steps - round(decay_ratio * steps))


def warmup_clipped_line(*, warmup_steps: int, steps: int, decay_ratio: float) -> str | None:
    """The start-up line saying that the warmup was clipped (:func:`fitted_warmup_steps`), or
    ``None`` when the configured ``warmup_steps`` fits in the run."""
    fitted = fitted_warmup_steps(warmup_steps=warmup_steps, steps=steps, decay_ratio=decay_ratio)
    if fitted == warmup_steps:
        return None
    return (
        f"lr schedule: warming up for {fitted} step{'s' * (fitted != 1)}, "
        f"not lr_scheduler.warmup_steps {warmup_steps}, so that "
        f"the warmup and the {round(decay_ratio * steps)} decay steps (lr_scheduler.decay_ratio "
        f"{decay_ratio}) fit in training.steps {steps}"
    )


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    steps: int,
    decay_ratio: float,
    decay_type: str,
    min_lr_factor: float,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following :func:`wsd_lr_factor`: the LR of step 1 at construction, of step
    ``k + 1`` after ``k`` calls of ``scheduler.step()`` (one per ``optimizer.step()``).

    Raises:
        ValueError: see :func:`check_wsd_args`.
    """
    kwargs = dict(
        warmup_steps=warmup_steps,
        steps=steps,
        decay_ratio=decay_ratio,
        decay_type=decay_type,
        min_lr_factor=min_lr_factor,
    )
    check_wsd_args(**kwargs)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, functools.partial(_factor_at_index, **kwargs)
    )


def _factor_at_index(index: int, **kwargs) -> float:
    """``LambdaLR``'s 0-based ``last_epoch`` -> factor of training step ``index + 1``."""
    return wsd_lr_factor(index + 1, **kwargs)


SCHEDULE_KEYS = {
    "lr": "optimizer.lr",
    "warmup_steps": "lr_scheduler.warmup_steps",
    "steps": "training.steps",
    "decay_ratio": "lr_scheduler.decay_ratio",
    "decay_type": "lr_scheduler.decay_type",
    "min_lr_factor": "lr_scheduler.min_lr_factor",
}
"""The settings that define the LR of every step (the arguments of :func:`follow_schedule`) -> their
config keys."""


def follow_schedule(
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    *,
    lr: float,
    warmup_steps: int,
    steps: int,
    decay_ratio: float,
    decay_type: str,
    min_lr_factor: float,
) -> None:
    """Make ``scheduler`` (from :func:`build_lr_scheduler`) follow the schedule of these settings
    from the step it has reached (``last_epoch`` steps done): peak LR ``lr``, and every param
    group's LR set now to that of the next step. Used on resume, where the settings are the
    checkpoint's or, when asked, this run's.

    Raises:
        ValueError: see :func:`check_wsd_args`.
    """
    kwargs = dict(
        warmup_steps=warmup_steps,
        steps=steps,
        decay_ratio=decay_ratio,
        decay_type=decay_type,
        min_lr_factor=min_lr_factor,
    )
    check_wsd_args(**kwargs)
    factor = functools.partial(_factor_at_index, **kwargs)
    groups = scheduler.optimizer.param_groups
    scheduler.lr_lambdas = [factor] * len(groups)
    scheduler.base_lrs = [lr] * len(groups)
    for group in groups:
        group["initial_lr"] = lr
        group["lr"] = lr * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in groups]  # what get_last_lr() returns
