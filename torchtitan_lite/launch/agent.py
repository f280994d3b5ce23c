"""torchrun's agent, run by the launcher: ``python -m torchtitan_lite.launch.agent <torchrun args>``

Runs ``torch.distributed.run`` in this process and, when the run fails, writes torch's report of it
as data to the control folder's :data:`~torchtitan_lite.lifecycle.control.FAILURES_FILE`: each
failed worker's global rank, exit code (negative: the signal that killed it) and whether its error
file (``TORCHELASTIC_ERROR_FILE``, ``faults.record_error``) says it lost a peer; or how the
rendezvous failed. torchrun's own output goes to
:data:`~torchtitan_lite.lifecycle.control.AGENT_LOG`, not the console. Exit status 0, or 1 on a
failure.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys

from torch.distributed import DistError, DistNetworkError
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous import RendezvousError
from torch.distributed.run import parse_args, run

from torchtitan_lite.lifecycle.control import AGENT_LOG, CONTROL_ENV, FAILURES_FILE, LOST_PEER


def _message(failure: ProcessFailure) -> str:
    """The message of a worker's error file (torch's layout: a string, or a dict holding one)."""
    message = failure.message
    return message.get("message", "") if isinstance(message, dict) else message


def failures_record(err: ChildFailedError) -> dict:
    """``err`` as ``{"failures": [{"rank", "exitcode", "lost_peer"}, ...]}``: torchrun's first
    observed failure first, then the others by rank."""
    first, _ = err.get_first_failure()
    ranks = [first, *sorted(rank for rank in err.failures if rank != first)]
    return {
        "failures": [
            {
                "rank": rank,
                "exitcode": err.failures[rank].exitcode,
                "lost_peer": _message(err.failures[rank]).startswith(LOST_PEER),
            }
            for rank in ranks
        ]
    }


def rendezvous_record(err: Exception) -> dict:
    """A failed rendezvous as ``{"rendezvous": what}``: ``"1/2 nodes joined"`` (node 0's store
    counted the nodes that joined), ``"node 0 was not reachable"``, or the exception's type."""
    joined = re.search(r"(\d+/\d+) clients joined", str(err))
    if joined:
        return {"rendezvous": f"{joined.group(1)} nodes joined"}
    if isinstance(err, DistNetworkError):
        return {"rendezvous": "node 0 was not reachable"}
    return {"rendezvous": f"torchrun's {type(err).__name__}"}


def _keep_own_output_off_the_console(log_path: str) -> None:
    """Send this process's own output to ``log_path``: torch's loggers, Python warnings and what
    writes to file descriptors 1 and 2 (C++ logs). ``sys.stdout`` and ``sys.stderr``, where torchrun
    tees the workers' lines (and where a traceback of this process goes), become the console's
    stdout: every worker line there, the launcher's last line on stderr."""
    sys.stdout.flush()
    sys.stderr.flush()
    console = [
        open(os.dup(1), "w", buffering=1, encoding=sys.stdout.encoding, errors=sys.stdout.errors)
        for _ in range(2)
    ]  # one writer per tee thread
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)
    sys.stdout, sys.stderr = console
    handler = logging.FileHandler(log_path)
    for name in ("torch.distributed", "py.warnings"):
        logger = logging.getLogger(name)
        logger.handlers, logger.propagate = [handler], False
    logging.captureWarnings(True)


def main(argv: list[str]) -> int:
    """Run torchrun with ``argv``; on a failure write its record to the control folder, return 1."""
    control = os.environ[CONTROL_ENV]
    _keep_own_output_off_the_console(os.path.join(control, AGENT_LOG))
    try:
        run(parse_args(argv))
        return 0
    except ChildFailedError as err:
        record = failures_record(err)
    except (RendezvousError, DistError) as err:
        record = rendezvous_record(err)
    with open(os.path.join(control, FAILURES_FILE), "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
