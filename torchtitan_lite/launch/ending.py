"""How a run ended, from its control folder: the launcher's exit status and last line
(``docs/checkpoints.md``, "How a run ends")."""

from __future__ import annotations

import glob
import json
import os
import signal

from torchtitan_lite.lifecycle.control import (
    AGENT_LOG,
    FAILURES_FILE,
    OUTCOME_PREFIX,
    TORCHRUN_LOG_DIR,
)

KEPT = "the last complete checkpoint is kept"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def worst_outcome(control: str, log_rank: str) -> tuple[int, str]:
    """The highest status a worker of this node reported and its line (``log_rank``'s on a tie);
    ``(0, "")`` without a failure."""
    code, line = 0, ""
    paths = [
        os.path.join(control, f"{OUTCOME_PREFIX}{log_rank}"),
        *sorted(glob.glob(os.path.join(control, f"{OUTCOME_PREFIX}*[0-9]"))),
    ]
    for path in paths:
        text = _read(path)
        if text and int(text.split("\n")[0]) > code:
            code, line = int(text.split("\n")[0]), text.split("\n")[1]
    return code, line


def last_error_line(control: str, log_rank: str) -> str | None:
    """The last ``error: ...`` line that local rank ``log_rank`` printed (else any rank), from
    torchrun's per-worker log files (stderr's before stdout's)."""
    pattern = os.path.join(control, TORCHRUN_LOG_DIR, "*", "attempt_*", "{}", "{}.log")
    for rank in (log_rank, "*"):
        for stream in ("stderr", "stdout"):
            for path in sorted(glob.glob(pattern.format(rank, stream))):
                lines = [
                    line.strip()
                    for line in (_read(path) or "").splitlines()
                    if line.lstrip().startswith("error: ")
                ]
                if lines:
                    return lines[-1]
    return None


def agent_log_tail(control: str, lines: int = 20) -> str:
    """The last ``lines`` of torchrun's own log (when nothing else says why a run failed)."""
    text = _read(os.path.join(control, AGENT_LOG)) or ""
    return "".join(text.splitlines(keepends=True)[-lines:])


def _signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"SIG{-exitcode}"


def failure_line(control: str, status: int, nnodes: str, where: str) -> tuple[int, str] | None:
    """The status and line for the agent's record of a failure
    (:mod:`~torchtitan_lite.launch.agent`), or ``None`` without one. ``status``: the agent's exit
    status; ``nnodes``, ``where``: the rendezvous (:class:`~torchtitan_lite.launch.nodes.Nodes`)."""
    text = _read(os.path.join(control, FAILURES_FILE))
    if text is None:
        return None
    record = json.loads(text)
    if "rendezvous" in record:
        return 2, (
            f"input error: not all {nnodes} nodes joined the rendezvous at {where} "
            f"({record['rendezvous']}): start ./run_train.sh on every node with the same "
            "NNODES and MASTER_ADDR/MASTER_PORT (or RDZV_ENDPOINT) and a NODE_RANK each, or "
            "raise RDZV_TIMEOUT"
        )
    failures = record["failures"]
    # A worker here killed by a signal is the cause, even when a peer that lost it ended first
    failed = next((f for f in failures if f["exitcode"] < 0), failures[0])
    rank, exitcode = failed["rank"], failed["exitcode"]
    failed_run = f"error: training failed (torchrun exit status {status}):"
    if exitcode > 0 and failed["lost_peer"]:
        return 1, (
            f"{failed_run} a worker on another node failed or was killed (rank {rank} here "
            f"lost its connection to it; that node's last line names it); {KEPT}"
        )
    if exitcode < 0:
        return 1, f"{failed_run} rank {rank} was killed by {_signal_name(exitcode)}; {KEPT}"
    return 1, f"{failed_run} rank {rank} exited with status {exitcode}; see the output above"
