"""Faults during a run: stop requests (SIGTERM/SIGINT), a launcher that dies, non-finite losses or
gradient norms.

Notes in docs/design.md: "on stopping", "on orphans", "on failing workers", "on non-finite steps
without a sync per step".
"""

from __future__ import annotations

import ctypes
import datetime
import json
import math
import os
import signal
import socket
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

from torchtitan_lite.errors import UserError
from torchtitan_lite.lifecycle.control import (
    BUDGET_FILE,
    CONTROL_ENV,
    LAUNCHER_PID_ENV,
    LOST_PEER,
    OUTCOME_PREFIX,
    STOP_FILE,
)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Signals that ask the run to save and stop."""
NONFINITE_POLICIES = ("stop", "skip")
"""Values of ``training.nonfinite_policy``."""


class NonFiniteError(UserError, RuntimeError):
    """A non-finite loss or gradient norm that the policy does not (or no longer) allow to skip."""


ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
"""Environment variable with the path of a worker's error file (set by torchrun)."""
SAVE_BYTES_PER_S = 50 * 2**20
"""Write speed assumed for a save before the first one is timed (a slow network file system)."""


class Stopped(Exception):
    """A stop request agreed before the first step: nothing to save (``main`` prints the message and
    exits 0)."""


class StopRequest:
    """Records SIGTERM/SIGINT instead of dying (handlers of :data:`STOP_SIGNALS` replaced in this
    process, main thread only, until :meth:`restore`) and sees the launcher's ``stop`` file;
    :meth:`agreed` tells every rank whether any got either. Repeated signals are harmless.

    Args:
        control: the control folder (default: :data:`CONTROL_ENV`, unset = no launcher to listen
            to).
    """

    def __init__(self, control: str | None = None):
        self.signal_name: str | None = None
        self.control = control if control is not None else os.environ.get(CONTROL_ENV)
        self._budget_s = 0
        self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}

    def _handle(self, signum: int, frame) -> None:
        self.signal_name = signal.Signals(signum).name

    def requested(self) -> bool:
        """Whether this process got a stop signal or the launcher asked for a stop (no
        collective)."""
        if self.signal_name is None and self.control is not None:
            try:
                with open(os.path.join(self.control, STOP_FILE), encoding="utf-8") as handle:
                    self.signal_name = handle.read().strip() or "SIGTERM"
            except FileNotFoundError:
                pass
        return self.signal_name is not None

    def agreed(self, group: dist.ProcessGroup | None = None) -> bool:
        """Whether any rank received a stop request (a collective on ``group``, a gloo group such as
        ``DistInfo.cpu_group``; ``None`` = the default group, then gloo)."""
        flag = torch.tensor([1 if self.requested() else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag.item())

    def check(self, phase: str, group: dist.ProcessGroup | None = None) -> None:
        """Between start-up phases: raise :class:`Stopped` (on every rank) if a stop was requested.

        ``phase``: what was just done, for the message (``"the model build"``).
        """
        if self.agreed(group):
            raise Stopped(
                f"stopped by a signal ({self.signal_name or 'on another rank'}) after {phase}, "
                "before the first step; nothing to save"
            )

    def publish_budget(self, step_s: float, save_s: float | None, save_bytes: int) -> None:
        """Write the seconds the launcher waits after a stop request, ``2 * (step_s + save) + 60``,
        to the control folder (local rank 0's call on each node; when it grows by 10% or more).
        ``step_s``: the longest step so far (with validation); ``save_s``: the longest save, or
        ``None`` before the first (then ``save_bytes`` at :data:`SAVE_BYTES_PER_S`)."""
        save = save_s if save_s is not None else save_bytes / SAVE_BYTES_PER_S
        budget = math.ceil(2 * (step_s + save) + 60)
        if self.control is None or budget < 1.1 * self._budget_s:
            return
        self._budget_s = budget
        path = os.path.join(self.control, BUDGET_FILE)
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(f"{budget}\n")
        os.replace(path + ".tmp", path)

    def restore(self) -> None:
        """Reinstall the signal handlers that were there before."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def report_outcome(code: int, line: str | None) -> int:
    """The exit status for torchrun, ``code`` itself: under the launcher (:data:`CONTROL_ENV` set)
    ``code`` and ``line`` are first written to ``outcome.<LOCAL_RANK>`` in the control folder, where
    the launcher finds the line to repeat and its peers (:func:`peer_failed`) learn that this worker
    failed. A non-zero status makes torchrun stop the other workers at once (its fail-fast)."""
    control = os.environ.get(CONTROL_ENV)
    if control is not None:
        path = os.path.join(control, f"{OUTCOME_PREFIX}{os.environ.get('LOCAL_RANK', '0')}")
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(f"{code}\n{line or ''}\n")
        os.replace(path + ".tmp", path)
    return code


def peer_failed(control: str | None = None) -> bool:
    """Whether another worker of this node reported a non-zero outcome (:func:`report_outcome`) in
    the control folder (default: :data:`CONTROL_ENV`; ``False`` without one)."""
    control = control if control is not None else os.environ.get(CONTROL_ENV)
    if control is None:
        return False
    own = f"{OUTCOME_PREFIX}{os.environ.get('LOCAL_RANK', '0')}"
    try:
        names = [
            name
            for name in os.listdir(control)
            if name.startswith(OUTCOME_PREFIX) and name != own and not name.endswith(".tmp")
        ]
    except FileNotFoundError:
        return False
    for name in names:
        try:
            with open(os.path.join(control, name), encoding="utf-8") as handle:
                if handle.readline().strip() not in ("", "0"):
                    return True
        except FileNotFoundError:
            continue
    return False


def record_error(message: str) -> None:
    """Write ``message`` (and the traceback being handled, if any) to this worker's error file,
    where torchrun's agent reads it into its report of the failure (``TORCHELASTIC_ERROR_FILE``, set
    by torchrun; the layout of torch's ``ErrorHandler.record_exception``); nothing without one."""
    path = os.environ.get(ERROR_FILE_ENV)
    if path:
        extra = {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}
        data = {"message": {"message": message, "extraInfo": extra}}
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(data, handle)


_LOST_PEER = ("Connection closed by peer", "Connection reset by peer")
"""What gloo's TCP transport raises in a collective whose peer process is gone."""


def lost_peer(err: BaseException) -> bool:
    """Whether ``err`` is a collective failing because another rank's process is gone (gloo's
    connection closed or reset by the peer), not a fault of this rank."""
    return isinstance(err, RuntimeError) and any(text in str(err) for text in _LOST_PEER)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _sibling_workers(pid: int) -> dict[int, str]:
    """The worker processes among the children of ``pid`` (Linux ``/proc/<pid>/task/*/children``):
    each child's PID and its ``LOCAL_RANK`` (from ``/proc/<child>/environ``; children without one,
    not workers, are left out; empty where ``/proc`` does not exist)."""
    found: dict[int, str] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as handle:
                children = [int(child) for child in handle.read().split()]
        except OSError:
            continue
        for child in children:
            try:
                with open(f"/proc/{child}/environ", "rb") as handle:
                    variables = dict(
                        item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item
                    )
            except OSError:
                continue
            if b"LOCAL_RANK" in variables:
                found[child] = variables[b"LOCAL_RANK"].decode()
    return found


def _killed(local_rank: str, control: str | None) -> bool:
    """Whether the ended worker ``local_rank`` of this node left no outcome in the control folder:
    it was killed or crashed (a worker that ends by itself writes one, :func:`report_outcome`);
    ``True`` without a folder."""
    outcome = f"{OUTCOME_PREFIX}{local_rank}"
    return control is None or not os.path.exists(os.path.join(control, outcome))


FAILED_KEY = "torchtitan_lite/failed"
"""Key of torchrun's store that a failing worker sets (:func:`announce_failure`): the workers of
every node watch it (:func:`exit_with_launcher`)."""


def _run_store() -> dist.TCPStore | None:
    """A client of torchrun's store (``MASTER_ADDR``/``MASTER_PORT`` of the worker's environment),
    or ``None`` without one or when it does not answer within 10 s."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not host or not port.isdigit() or "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    try:
        return dist.TCPStore(
            host,
            int(port),
            is_master=False,
            timeout=datetime.timedelta(seconds=10),
            wait_for_workers=False,
        )
    except (RuntimeError, ValueError):
        return None


def announce_failure(what: str) -> None:
    """Tell the workers of every node that this run failed (``what``: who and how, for their line),
    through torchrun's store; nothing without one. A worker of another node blocked in a collective
    may otherwise wait for gloo's timeout (300 s): its own peers are alive, only waiting for the
    failed one."""
    store = _run_store()
    if store is not None:
        try:
            store.set(FAILED_KEY, what)
        except RuntimeError:
            pass


def exit_with_launcher(poll_s: float = 1.0, peer_grace_s: float = 5.0) -> None:
    """Let this worker not outlive torchrun, the launcher or a failed peer (docs/design.md, "on
    orphans"): ``PR_SET_PDEATHSIG`` = SIGKILL where the platform has ``prctl``, and a daemon thread
    that every ``poll_s`` seconds checks the parent PID and the process of :data:`LAUNCHER_PID_ENV`
    (gone: prints one line and ends the process, status 1), and the control folder: when another
    worker of this node failed (:func:`peer_failed`), or one of this worker's siblings (torchrun's
    other workers) ended without an outcome while this one runs (a worker killed, which reports
    nothing), and this one has not ended ``peer_grace_s`` seconds later (waiting in a collective for
    the failed rank, or for a rank on another node waiting for it), it ends silently with status 1
    (the failed worker's line is the run's; a sibling's end is also announced to the other nodes,
    :func:`announce_failure`). Without this, torchrun's SIGTERM to such a worker only records a stop
    request, and torchrun kills it 30 s later. When a worker of any node announced a failure in
    torchrun's store, this one ends ``peer_grace_s`` seconds later with the line
    ``lost a peer: rank R's run ended: <what>``, status 1."""
    parent = os.getppid()
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    launcher_pid = int(launcher) if launcher and launcher.isdigit() else None
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1  # <linux/prctl.h>
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)

    def watch() -> None:
        peer_failed_at, siblings, store, announced = None, {}, _run_store(), None
        control = os.environ.get(CONTROL_ENV)
        while True:
            siblings.update(
                (pid, rank) for pid, rank in _sibling_workers(parent).items() if pid != os.getpid()
            )
            if announced is None and store is not None:
                try:
                    announced = (
                        store.get(FAILED_KEY).decode() if store.check([FAILED_KEY]) else None
                    )
                except RuntimeError:  # node 0's torchrun, which holds the store, is gone
                    announced = "node 0's torchrun is gone"
                if announced is not None and peer_failed_at is None:
                    peer_failed_at = time.monotonic()
            gone = (
                "torchrun"
                if os.getppid() != parent
                else "the launcher"
                if launcher_pid is not None and not _alive(launcher_pid)
                else None
            )
            if gone:
                print(
                    f"error: {gone} is gone; this worker exits (the last complete checkpoint is "
                    "kept)",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(1)
            if peer_failed_at is None and (
                peer_failed()
                or any(not _alive(pid) and _killed(rank, control) for pid, rank in siblings.items())
            ):
                peer_failed_at = time.monotonic()
                announce_failure(f"a worker on host {socket.gethostname()} failed or was killed")
            if peer_failed_at is not None and time.monotonic() - peer_failed_at >= peer_grace_s:
                if announced is not None:
                    line = f"{LOST_PEER}rank {os.environ.get('RANK', '0')}'s run ended: {announced}"
                    print(line, file=sys.stderr, flush=True)
                    record_error(line)
                os._exit(1)
            time.sleep(poll_s)

    threading.Thread(target=watch, name="exit-with-launcher", daemon=True).start()


class NonFiniteGuard:
    """Applies ``training.nonfinite_policy`` to each step's loss and gradient norm (docs/design.md,
    "Note: on non-finite steps without a sync per step").

    Args:
        policy: ``"stop"`` or ``"skip"``.
        max_skipped_steps: steps ``skip`` may drop in the whole run (a resumed run continues the
            count).
        skipped: steps already skipped (from the checkpoint's train state).
        device: where the per-step evidence lives (the training device).

    Raises:
        ValueError: an unknown policy or a negative ``max_skipped_steps``.
    """

    _NONE = torch.iinfo(torch.int64).max  # "no bad step yet" (reduced with MIN over ranks)

    def __init__(
        self,
        policy: str,
        max_skipped_steps: int,
        skipped: int = 0,
        device: torch.device | str = "cpu",
    ):
        if policy not in NONFINITE_POLICIES:
            raise ValueError(
                f"training.nonfinite_policy must be one of {NONFINITE_POLICIES}, got {policy!r}"
            )
        if max_skipped_steps < 0:
            raise ValueError(f"training.max_skipped_steps must be >= 0, got {max_skipped_steps}")
        self.policy, self.max_skipped_steps, self.skipped = policy, max_skipped_steps, skipped
        self._device = torch.device(device)
        self._reset()

    def _reset(self) -> None:
        self._first_step = torch.full((), self._NONE, dtype=torch.int64, device=self._device)
        self._first_values = torch.zeros(2, dtype=torch.float32, device=self._device)

    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Note 1-based step ``step`` if this rank's ``loss`` or ``grad_norm`` (0-dim tensors on the
        device, any float dtype) is not finite: tensor ops only, no sync."""
        values = torch.stack([loss.detach().float(), grad_norm.detach().float()])  # (2,)
        first = ~torch.isfinite(values).all() & (self._first_step == self._NONE)
        self._first_step = torch.where(first, step, self._first_step)
        self._first_values = torch.where(first, values, self._first_values)

    def agreed_first_bad_step(self) -> int | None:
        """The first recorded bad step over all ranks, or ``None`` (a collective, and a host
        sync)."""
        first = self._first_step.clone()
        dist.all_reduce(first, op=dist.ReduceOp.MIN)
        step = int(first.item())
        return None if step == self._NONE else step

    def apply_update(self, step: int, *, sync: bool) -> bool:
        """Whether step ``step``'s update may be applied (after :meth:`record`, on every rank): at
        once ``True`` without ``sync`` under ``stop``; otherwise the ranks agree (``False``: skipped
        and counted).

        Raises:
            NonFiniteError: a bad step under ``stop``, or under ``skip`` beyond
                ``max_skipped_steps``; the message names the first bad step.
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
        """Raise :class:`NonFiniteError` if any rank recorded a bad step (a collective; ``step`` is
        the step reached). Call before saving."""
        bad = self.agreed_first_bad_step()
        if bad is not None:
            raise NonFiniteError(self._message(bad, applied_through=step))

    def _message(self, bad: int, applied_through: int) -> str:
        """The error text for first bad step ``bad`` when updates up to step ``applied_through``
        went in."""
        loss, grad_norm = (
            self._first_values.tolist() if int(self._first_step.item()) == bad else ("?", "?")
        )
        what = f"step {bad}: loss {loss}, gradient norm {grad_norm}"
        steps = (
            f"the update of step {bad} was"
            if applied_through == bad
            else f"the updates of steps {bad}-{applied_through} were"
        )
        applied = (
            "the update was not applied"
            if applied_through < bad
            else (
                f"{steps} applied before this check (metrics.log_freq), nothing was saved from them"
            )
        )
        advice = "lower optimizer.lr or check the data, then resume"
        if self.policy == "skip":
            return (
                f"{what}, after {self.skipped} skipped steps (training.max_skipped_steps = "
                f"{self.max_skipped_steps}); {applied} and the last checkpoint is intact: {advice}"
            )
        return (
            f"{what}; {applied} and the last checkpoint is intact: {advice} "
            "(or set training.nonfinite_policy=skip)"
        )
