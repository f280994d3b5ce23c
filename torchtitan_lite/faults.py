"""Faults during training: stop requests (SIGTERM/SIGINT) and non-finite losses or gradient norms.

Note: on preemption. A scheduler (or Ctrl-C) sends SIGTERM/SIGINT to ``run_train.sh``; it forwards the
signal to torchrun, which forwards it to every worker and SIGKILLs them after its shutdown timeout
(``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, 30 s by default). :class:`StopRequest` turns the signal into a flag;
after each step the ranks agree on it (one all-reduce of one number, since the signal may reach them
during different steps), save a checkpoint at the step reached and return normally, so the workers
exit 0. Finishing a step and saving must therefore fit in the shutdown timeout.

Note: on non-finite steps. The loss and the gradient norm are global values (equal on every rank), so
every rank takes the same decision before the optimizer step: ``stop`` raises :class:`NonFiniteError`
naming the step (the optimizer never sees the bad gradient, so no checkpoint is ever written from a
non-finite state and the last good one stays as it is); ``skip`` drops the update (weights and
optimizer moments unchanged; the data and the LR schedule move on) up to ``max_skipped_steps`` times
in the whole run, then stops as ``stop`` does.
"""

from __future__ import annotations

import math
import signal

import torch
import torch.distributed as dist

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Signals that ask the run to save and stop."""
NONFINITE_POLICIES = ("stop", "skip")
"""Values of ``training.nonfinite_policy``."""


class NonFiniteError(RuntimeError):
    """A non-finite loss or gradient norm that the policy does not (or no longer) allow to skip."""


class StopRequest:
    """Records SIGTERM/SIGINT instead of dying; :meth:`agreed` tells every rank whether any got one.

    Installing replaces the handlers of :data:`STOP_SIGNALS` in this process (main thread only);
    :meth:`restore` puts the previous ones back. Repeated signals are harmless (torchrun forwards a
    Ctrl-C that the workers also received from the terminal).
    """

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}

    def _handle(self, signum: int, frame) -> None:
        self.signal_name = signal.Signals(signum).name

    def agreed(self, device: torch.device) -> bool:
        """Whether any rank received a stop signal (a collective: call on every rank at the same point)."""
        flag = torch.tensor([1.0 if self.signal_name else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def restore(self) -> None:
        """Reinstall the signal handlers that were there before."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class NonFiniteGuard:
    """Applies ``training.nonfinite_policy`` to each step's global loss and gradient norm.

    Args:
        policy: ``"stop"`` or ``"skip"``.
        max_skipped_steps: steps ``skip`` may drop in the whole run (a resumed run continues the count).
        skipped: steps already skipped (from the checkpoint's train state).

    Raises:
        ValueError: an unknown policy or a negative ``max_skipped_steps``.
    """

    def __init__(self, policy: str, max_skipped_steps: int, skipped: int = 0):
        if policy not in NONFINITE_POLICIES:
            raise ValueError(f"training.nonfinite_policy must be one of {NONFINITE_POLICIES}, got {policy!r}")
        if max_skipped_steps < 0:
            raise ValueError(f"training.max_skipped_steps must be >= 0, got {max_skipped_steps}")
        self.policy, self.max_skipped_steps, self.skipped = policy, max_skipped_steps, skipped

    def should_apply(self, step: int, loss: float, grad_norm: float) -> bool:
        """``True``: apply the update; ``False``: skip it (counted).

        Raises:
            NonFiniteError: non-finite values under ``stop``, or under ``skip`` beyond the limit.
        """
        if math.isfinite(loss) and math.isfinite(grad_norm):
            return True
        what = f"step {step}: loss {loss}, gradient norm {grad_norm}"
        if self.policy == "skip" and self.skipped < self.max_skipped_steps:
            self.skipped += 1
            return False
        if self.policy == "skip":
            raise NonFiniteError(f"{what}, after {self.skipped} skipped steps (training.max_skipped_steps = "
                                 f"{self.max_skipped_steps}); the update was not applied and the last checkpoint "
                                 "is intact: lower optimizer.lr or check the data, then resume")
        raise NonFiniteError(f"{what}; the update was not applied and the last checkpoint is intact: lower "
                             "optimizer.lr or check the data, then resume (or set training.nonfinite_policy=skip)")
