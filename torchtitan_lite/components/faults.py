"""Faults during training: stop requests (SIGTERM/SIGINT) and non-finite losses or gradient norms.

Note: on preemption. A scheduler (or Ctrl-C) sends SIGTERM/SIGINT to ``run_train.sh``; it forwards the
signal to torchrun, which forwards it to every worker and SIGKILLs them after its shutdown timeout
(``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, 30 s by default). :class:`StopRequest` turns the signal into a flag;
after each step the ranks agree on it (one all-reduce of one number on a CPU process group, since the
signal may reach them during different steps; no device sync), save a checkpoint at the step reached and
return normally, so the workers exit 0. Finishing a step and saving must fit in the shutdown timeout.

Note: on non-finite steps without a sync per step. Reading a loss on the host waits for the device, so
:class:`NonFiniteGuard` keeps its evidence on the device: each step it records, with tensor ops only,
the first step whose local loss or global gradient norm was not finite. The ranks agree on it (one
all-reduce, then one host read) only when the trainer syncs anyway: at log steps (``metrics.log_freq``),
before every checkpoint save, and every step under ``skip`` (which must decide before the update).
``stop`` then raises :class:`NonFiniteError` naming the first bad step. When that step is a sync step
(every step with ``log_freq = 1``, the default) the bad update never reaches the optimizer; otherwise
the updates up to the next sync step were applied, and the error says so. Either way no checkpoint is
written from a non-finite state, because saving checks first, so the last good one stays as it is.
``skip`` drops the update (weights and optimizer moments unchanged; the data and the LR schedule move
on) up to ``max_skipped_steps`` times in the whole run, then stops as ``stop`` does; it costs one host
sync per step (measured by ``benchmarks/bench_train.py``).
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

    def agreed(self, group: dist.ProcessGroup | None = None) -> bool:
        """Whether any rank received a stop signal (a collective: call on every rank at the same point).

        Args:
            group: a process group that reduces CPU tensors (gloo): ``DistInfo.cpu_group``; ``None`` =
                the default group, which must then be gloo. A CPU group keeps the device out of it.
        """
        flag = torch.tensor([1 if self.signal_name else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag.item())

    def restore(self) -> None:
        """Reinstall the signal handlers that were there before."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class NonFiniteGuard:
    """Applies ``training.nonfinite_policy`` to each step's loss and gradient norm; see "Note: on
    non-finite steps without a sync per step" in this module.

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
        """Note step ``step`` if ``loss`` (this rank's) or ``grad_norm`` is not finite: tensor ops only, no sync.

        Args:
            step: 1-based step.
            loss: 0-dim tensor on the device (any float dtype): this rank's loss of the step.
            grad_norm: 0-dim tensor on the device.
        """
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
        """Whether step ``step``'s update may be applied (call after :meth:`record`, on every rank).

        Without ``sync`` under ``stop`` it returns ``True`` at once (no device sync; see the module note).
        Otherwise the ranks agree: ``True`` = apply, ``False`` = skip it (``skip``, counted).

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
        """Raise :class:`NonFiniteError` if any rank recorded a bad step (a collective): call before saving.

        ``step`` is the step reached, named in the message when it differs from the first bad one.
        """
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
