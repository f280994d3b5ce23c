"""Faults during training: stop requests (SIGTERM/SIGINT) and non-finite losses or gradient norms.

Note: on preemption. ``run_train.sh`` forwards SIGTERM/SIGINT to torchrun, which forwards it to the workers
and SIGKILLs them after ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` (30 s by default). :class:`StopRequest` turns the
signal into a flag; after each step the ranks agree on it (one all-reduce on a CPU group: the signal may
reach them in different steps), save and return, so the workers exit 0.

Note: on non-finite steps without a sync per step. :class:`NonFiniteGuard` records on the device, with
tensor ops only, the first step whose local loss or global gradient norm was not finite; the ranks agree on
it (one all-reduce, one host read) at log steps, before every save, and every step under ``skip``. ``stop``
then raises :class:`NonFiniteError` naming that step: with ``log_freq = 1`` before its update is applied,
otherwise after the updates up to the sync step (the error says so); saving checks first, so no checkpoint
holds a non-finite state. ``skip`` drops the update (weights and moments unchanged, data and LR move on) up
to ``max_skipped_steps`` times in the run, at one host sync per step.
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

from torchtitan_lite.errors import UserError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Signals that ask the run to save and stop."""
NONFINITE_POLICIES = ("stop", "skip")
"""Values of ``training.nonfinite_policy``."""


class NonFiniteError(UserError, RuntimeError):
    """A non-finite loss or gradient norm that the policy does not (or no longer) allow to skip."""


class StopRequest:
    """Records SIGTERM/SIGINT instead of dying (handlers of :data:`STOP_SIGNALS` replaced in this process, main
    thread only, until :meth:`restore`); :meth:`agreed` tells every rank whether any got one. Repeated
    signals are harmless."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}

    def _handle(self, signum: int, frame) -> None:
        self.signal_name = signal.Signals(signum).name

    def agreed(self, group: dist.ProcessGroup | None = None) -> bool:
        """Whether any rank received a stop signal (a collective on ``group``, a gloo group such as
        ``DistInfo.cpu_group``; ``None`` = the default group, then gloo)."""
        flag = torch.tensor([1 if self.signal_name else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag.item())

    def restore(self) -> None:
        """Reinstall the signal handlers that were there before."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class NonFiniteGuard:
    """Applies ``training.nonfinite_policy`` to each step's loss and gradient norm (see the module notes).

    Args:
        policy: ``"stop"`` or ``"skip"``.
        max_skipped_steps: steps ``skip`` may drop in the whole run (a resumed run continues the count).
        skipped: steps already skipped (from the checkpoint's train state).
        device: where the per-step evidence lives (the training device).

    Raises:
        ValueError: an unknown policy or a negative ``max_skipped_steps``.
    """

    _NONE = torch.iinfo(torch.int64).max  # "no bad step yet" (reduced with MIN over ranks)

    def __init__(self, policy: str, max_skipped_steps: int, skipped: int = 0, device: torch.device | str = "cpu"):
        if policy not in NONFINITE_POLICIES:
            raise ValueError(f"training.nonfinite_policy must be one of {NONFINITE_POLICIES}, got {policy!r}")
        if max_skipped_steps < 0:
            raise ValueError(f"training.max_skipped_steps must be >= 0, got {max_skipped_steps}")
        self.policy, self.max_skipped_steps, self.skipped = policy, max_skipped_steps, skipped
        self._device = torch.device(device)
        self._reset()

    def _reset(self) -> None:
        self._first_step = torch.full((), self._NONE, dtype=torch.int64, device=self._device)
        self._first_values = torch.zeros(2, dtype=torch.float32, device=self._device)

    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Note 1-based step ``step`` if this rank's ``loss`` or ``grad_norm`` (0-dim tensors on the device, any
        float dtype) is not finite: tensor ops only, no sync."""
        values = torch.stack([loss.detach().float(), grad_norm.detach().float()])  # (2,)
        first = ~torch.isfinite(values).all() & (self._first_step == self._NONE)
        self._first_step = torch.where(first, step, self._first_step)
        self._first_values = torch.where(first, values, self._first_values)

    def agreed_first_bad_step(self) -> int | None:
        """The first recorded bad step over all ranks, or ``None`` (a collective, and a host sync)."""
        first = self._first_step.clone()
        dist.all_reduce(first, op=dist.ReduceOp.MIN)
        step = int(first.item())
        return None if step == self._NONE else step

    def apply_update(self, step: int, *, sync: bool) -> bool:
        """Whether step ``step``'s update may be applied (after :meth:`record`, on every rank): at once ``True``
        without ``sync`` under ``stop``; otherwise the ranks agree (``False``: skipped and counted).

        Raises:
            NonFiniteError: a bad step under ``stop``, or under ``skip`` beyond ``max_skipped_steps``;
                the message names the first bad step.
        """
        if not (sync or self.policy == "skip"):
            return True
        bad = self.agreed_first_bad_step()
        if bad is None:
            return True
        if self.policy == "skip" and self.skipped < self.max_skipped_steps:
            self.skipped += 1
            self._reset()
            return False
        raise NonFiniteError(self._message(bad, applied_through=step - 1))

    def check(self, step: int) -> None:
        """Raise :class:`NonFiniteError` if any rank recorded a bad step (a collective; ``step`` is the step
        reached). Call before saving."""
        bad = self.agreed_first_bad_step()
        if bad is not None:
            raise NonFiniteError(self._message(bad, applied_through=step))

    def _message(self, bad: int, applied_through: int) -> str:
        """The error text for first bad step ``bad`` when updates up to step ``applied_through`` went in."""
        loss, grad_norm = self._first_values.tolist() if int(self._first_step.item()) == bad else ("?", "?")
        what = f"step {bad}: loss {loss}, gradient norm {grad_norm}"
        steps = (f"the update of step {bad} was" if applied_through == bad else
                 f"the updates of steps {bad}-{applied_through} were")
        applied = ("the update was not applied" if applied_through < bad else
                   f"{steps} applied before this check (metrics.log_freq), nothing was saved from them")
        advice = "lower optimizer.lr or check the data, then resume"
        if self.policy == "skip":
            return (f"{what}, after {self.skipped} skipped steps (training.max_skipped_steps = "
                    f"{self.max_skipped_steps}); {applied} and the last checkpoint is intact: {advice}")
        return (f"{what}; {applied} and the last checkpoint is intact: {advice} "
                "(or set training.nonfinite_policy=skip)")
