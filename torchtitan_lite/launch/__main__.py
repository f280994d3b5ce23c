"""The launcher behind ``run_train.sh``: check the config in one plain process, then run torchrun.

Notes in docs/design.md: "on stopping", "on the last line".
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from torchtitan_lite.config.paths import DEFAULT_CONFIG
from torchtitan_lite.launch.ending import (
    KEPT,
    agent_log_tail,
    failure_line,
    last_error_line,
    worst_outcome,
)
from torchtitan_lite.launch.nodes import NodesError, nodes_from_env
from torchtitan_lite.lifecycle.control import (
    BUDGET_FILE,
    CONTROL_ENV,
    LAUNCHER_PID_ENV,
    STOP_FILE,
    TORCHRUN_LOG_DIR,
)
from torchtitan_lite.threads import thread_env

# Read by the preflight (preflight/checks.py, preflight/resolved.py) and config/load.py; torch-free
# copies of their names (tests/test_launch.py checks they agree).
WORLD_SIZE_ENV = "TORCHTITAN_LITE_WORLD_SIZE"
RESOLVED_CONFIG_ENV = "TORCHTITAN_LITE_RESOLVED_CONFIG"
CONFIG_FILE_FROM_ENV = "TORCHTITAN_LITE_CONFIG_FILE_FROM"


def _ignore_stop_signals() -> None:
    """In a child before it runs: ignore SIGTERM and SIGINT (Ctrl-C reaches the group)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Supervisor:
    """Relays SIGTERM/SIGINT to the workers through the control folder; runs one child at a time."""

    def __init__(self, control: str):
        self.control = control
        self.proc: subprocess.Popen | None = None
        self.signalled: str | None = None
        self.killed: str | None = None
        self.stop_time = 0.0
        self.deadline: float | None = None
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signalled is not None:
            self.killed = f"a second {name}"
            self._kill()
            return
        self.signalled, self.stop_time = name, time.monotonic()
        path = os.path.join(self.control, STOP_FILE)
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(f"{name}\n")
        os.replace(path + ".tmp", path)
        try:
            with open(os.path.join(self.control, BUDGET_FILE), encoding="utf-8") as handle:
                self.deadline = self.stop_time + int(handle.read())
        except FileNotFoundError:  # before the first step: no deadline
            pass

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def run(
        self, cmd: list[str], env: dict[str, str], *, stop_at_once: bool = False, **kwargs
    ) -> int:
        """Run ``cmd`` to its end: its exit status. After a stop request it is killed at the
        deadline (at once with ``stop_at_once``)."""
        self.proc = subprocess.Popen(cmd, env=env, preexec_fn=_ignore_stop_signals, **kwargs)
        while True:
            try:
                return self.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            overdue = self.deadline is not None and time.monotonic() >= self.deadline
            if self.signalled is not None and self.killed is None and (stop_at_once or overdue):
                self.killed = f"no stop within {round(time.monotonic() - self.stop_time)} s"
                self._kill()


def launch(argv: list[str], env: dict[str, str], control: str) -> tuple[int, str | None]:
    """``run_train.sh argv`` under ``env``: the exit status and last line (``None``: none)."""
    supervisor = Supervisor(control)
    ngpu = env.get("NGPU") or "1"
    config_file = env.get("CONFIG_FILE") or DEFAULT_CONFIG
    log_rank = env.get("LOG_RANK") or "0"
    try:
        nodes = nodes_from_env(env)
    except NodesError as err:
        return 2, f"config error: {err}"
    thread_env(env, ngpu)
    digits = ngpu.isdigit() and nodes.nnodes.isdigit()
    world_size = str(int(ngpu) * int(nodes.nnodes)) if digits else ""
    resolved = os.path.join(control, "config.json")
    train_args = ["--job.config_file", config_file, *argv]

    # A valid config prints nothing on stdout: anything there is --help or --job.print_config.
    from_ = "CONFIG_FILE" if env.get("CONFIG_FILE") else "CONFIG_FILE default of run_train.sh"
    check_env = {
        **env,
        WORLD_SIZE_ENV: world_size,
        RESOLVED_CONFIG_ENV: resolved,
        CONFIG_FILE_FROM_ENV: from_,
    }
    check = [sys.executable, "-m", "torchtitan_lite.preflight", *train_args]
    with open(os.path.join(control, "printed"), "w+", encoding="utf-8") as printed:
        status = supervisor.run(check, check_env, stop_at_once=True, stdout=printed)
        if supervisor.signalled is not None:
            return 0, (
                f"stopped by a signal ({supervisor.signalled}) before the first step; "
                "nothing to save"
            )
        if status != 0:
            return status, None
        printed.seek(0)
        if text := printed.read():
            print(text, end="", flush=True)
            return 0, None

    agent_env = {
        **env,
        CONTROL_ENV: control,
        LAUNCHER_PID_ENV: str(os.getpid()),
        RESOLVED_CONFIG_ENV: resolved,
    }
    agent = [
        sys.executable,
        "-m",
        "torchtitan_lite.launch.agent",
        f"--nproc_per_node={ngpu}",
        "--local-ranks-filter",
        log_rank,
        "--role",
        "rank",
        "--tee",
        "3",
        "--log-dir",
        os.path.join(control, TORCHRUN_LOG_DIR),
        "--signals-to-handle=SIGHUP,SIGQUIT",
        *nodes.torchrun_args,
        "-m",
        "torchtitan_lite.train",
        *train_args,
    ]
    status = supervisor.run(agent, agent_env)
    if status < 0:  # as a shell reports a process killed by a signal
        status = 128 - status
    if supervisor.killed is not None:
        return 1, (
            f"error: the workers did not stop after {supervisor.signalled} and were killed "
            f"({supervisor.killed}); {KEPT}"
        )
    code, line = worst_outcome(control, log_rank)
    if code != 0:
        return code, line
    if status == 0:
        return 0, None
    line = last_error_line(control, log_rank)
    if line is not None:
        return 1, line
    ended = failure_line(control, status, nodes.nnodes, nodes.where)
    if ended is not None:
        return ended
    print(agent_log_tail(control), end="", file=sys.stderr)
    return 1, f"error: training failed (torchrun exit status {status}); see the output above"


def main(argv: list[str]) -> int:
    """``run_train.sh``'s work (its usage comment says what): the exit status. The last line goes to
    stdout with status 0, else to stderr."""
    control = tempfile.mkdtemp(prefix="run_train.")
    try:
        code, line = launch(argv, dict(os.environ), control)
    finally:
        shutil.rmtree(control, ignore_errors=True)
    if line is not None:
        print(line, file=sys.stdout if code == 0 else sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
