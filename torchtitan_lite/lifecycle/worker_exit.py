"""How a trainer worker ends: one line and its exit status (:func:`say`), and the process exit
(:func:`exit_after`).

Statuses (``docs/checkpoints.md``, "How a run ends"): 0 done or stopped; 2 a user error found before
training; 1 a user error during training, and a bug. A non-zero status makes torchrun stop the other
workers (see the note on failing workers in ``faults.py``).
"""

from __future__ import annotations

import os
import sys
import traceback

from torchtitan_lite.lifecycle.control import LOST_PEER, OUTCOME_PREFIX
from torchtitan_lite.lifecycle.faults import (
    CONTROL_ENV,
    lost_peer,
    record_error,
    report_outcome,
)


def say(code: int, line: str, *, to_stdout: bool = False) -> int:
    """Print ``line`` (to stderr, or stdout) and return ``code``, the worker's exit status, after
    handing both to the launcher (:func:`~torchtitan_lite.lifecycle.faults.report_outcome`)."""
    print(line, file=sys.stdout if to_stdout else sys.stderr, flush=True)
    return report_outcome(code, line)


def exit_after(code: int) -> None:
    """Leave the worker with ``code``: after a success (every rank passed the final barrier, files
    are closed) with ``os._exit``, skipping the interpreter's teardown, where gloo can abort
    (``docs/design.md``, "Distributed: exiting together"); errors exit normally. A success without a
    line is first reported as status 0 (:func:`~torchtitan_lite.lifecycle.faults.report_outcome`):
    the worker's siblings then know it was not killed."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 0:
        control = os.environ.get(CONTROL_ENV)
        own = f"{OUTCOME_PREFIX}{os.environ.get('LOCAL_RANK', '0')}"
        if control is not None and not os.path.exists(os.path.join(control, own)):
            report_outcome(0, None)
        os._exit(0)
    sys.exit(code)


def exit_on_bug() -> None:
    """Leave the worker with status 1 after an exception that :func:`~torchtitan_lite.train.main`
    let through (a bug, or this worker losing a peer on another node): print its traceback as the
    interpreter would, then ``os._exit``. The interpreter's teardown after a peer died can block in
    gloo's threads until torchrun kills the worker after its 30 s shutdown timeout; meanwhile its
    open connections keep peers on other nodes waiting. A collective that failed because another
    rank's process is gone (:func:`lost_peer`) is no bug: one line ``lost a peer: rank R ...``
    instead of the traceback (the launcher then names the node that failed). Either also goes to the
    worker's error file (:func:`~torchtitan_lite.lifecycle.faults.record_error`)."""
    err = sys.exc_info()[1]
    if err is not None and lost_peer(err):
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        rank = os.environ.get("RANK", "0")
        line = (
            f"{LOST_PEER}rank {rank}'s collective failed because another rank's process is "
            f"gone ({detail}); the node of the worker that failed names it"
        )
        print(line, file=sys.stderr)
        record_error(line)
    else:
        traceback.print_exc()
        record_error(f"{type(err).__name__}: {err}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def without_config_file(argv: list[str]) -> list[str]:
    """The command line without ``--job.config_file X`` / ``--job.config_file=X`` (for the start-up
    line)."""
    kept, skip_next = [], False
    for arg in argv:
        if skip_next or arg.startswith("--job.config_file="):
            skip_next = False
            continue
        skip_next = arg == "--job.config_file"
        if not skip_next:
            kept.append(arg)
    return kept
