"""A Slurm cluster of a test's own processes on 127.0.0.1: ``munged``, ``slurmctld`` and one
``slurmd`` per node (several ``slurmd -N <node>`` on one host, each on its own port), configured by
a ``slurm.conf`` written into a temporary folder and stopped by their pids (``docs/running.md``,
"Slurm").

Slurm itself is not installed here: ``.ci/run`` installs Debian's ``slurm-wlm`` and ``munge`` when
``slurmctld`` or ``munged`` is missing.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("sbatch", "scancel", "scontrol", "sinfo", "squeue", "srun")
START_S = 60
"""How long the daemons may take to start and report every node idle."""
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")
"""``JobState`` values of a job that ended (and will not be requeued by Slurm itself)."""

SLURM_CONF = """\
ClusterName=torchtitan-lite-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge.socket,cred_expire=10
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={folder}/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
KillWait=30
MinJobAge=3600
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
"""The cluster's ``slurm.conf``: no cgroups (``proctrack/linuxproc``, ``task/none``); no
accounting database, so no ``sacct`` (a job's state from ``scontrol show job``, kept an hour by
``MinJobAge``, and each ended attempt's line in ``jobcomp.txt``); a requeued job may start again
``cred_expire`` + 1 s after it ended (Slurm's default 120 s), and the scheduler looks at pending
jobs every 2 s (default 60 s)."""
NODE = "NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={cpus}"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def missing_commands() -> list[str]:
    """The daemons and commands of :data:`DAEMONS` and :data:`COMMANDS` not on ``PATH``."""
    return [name for name in (*DAEMONS, *COMMANDS) if shutil.which(name) is None]


class SlurmCluster:
    """``nodes`` Slurm nodes ``node0``, ``node1``, ... on this host, each with all of its CPUs, in
    one partition.

    Raises:
        RuntimeError: a daemon or command is missing (naming the packages to install), or the nodes
            were not idle within :data:`START_S` seconds (with the daemons' logs).
    """

    def __init__(self, nodes: int = 2):
        if missing := missing_commands():
            raise RuntimeError(
                f"Slurm is not installed ({', '.join(missing)} not on PATH): install Debian's "
                "slurm-wlm and munge (apt-get install -y slurm-wlm munge), as .ci/run does"
            )
        # A short folder: munged's socket path must fit a sockaddr_un (108 bytes).
        self.folder = Path(tempfile.mkdtemp(prefix="slurm-"))
        self.folder.chmod(0o755)  # munged's clients reach its socket through this folder
        self.names = [f"node{i}" for i in range(nodes)]
        self.procs: dict[str, subprocess.Popen] = {}
        for name in ("state", "spool", *(f"spool/{node}" for node in self.names)):
            (self.folder / name).mkdir(exist_ok=True)
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        node_lines = [
            NODE.format(name=name, port=free_port(), cpus=os.cpu_count()) for name in self.names
        ]
        self.conf = self.folder / "slurm.conf"
        self.conf.write_text(
            SLURM_CONF.format(
                folder=self.folder,
                user=getpass.getuser(),
                ctld_port=free_port(),
                nodes="\n".join(node_lines),
            )
        )
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _daemon(self, name: str, command: list[str]) -> None:
        log = open(self.folder / f"{name}.out", "wb")  # noqa: SIM115 (the daemon's, closed with it)
        self.procs[name] = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()

    def _start(self) -> None:
        f = self.folder
        self._daemon(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={f}/munge.socket",
                f"--key-file={f}/munge.key",
                f"--pid-file={f}/munged.pid",
                f"--log-file={f}/munged.log",
                f"--seed-file={f}/munged.seed",
            ],
        )
        self._wait(lambda: (f / "munge.socket").exists(), "munged's socket")
        self._daemon("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        for node in self.names:
            self._daemon(f"slurmd {node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
        self._wait(
            lambda: (
                self.command("sinfo", "-h", "-N", "-o", "%N %t", check=False).split()
                == [word for node in self.names for word in (node, "idle")]
            ),
            "every node idle in sinfo",
        )

    def _wait(self, done, what: str) -> None:
        deadline = time.monotonic() + START_S
        while not done():
            ended = {name: proc.returncode for name, proc in self.procs.items() if proc.poll()}
            if ended or time.monotonic() > deadline:
                raise RuntimeError(
                    f"no {what} within {START_S} s (ended daemons: {ended}):\n" + self.logs()
                )
            time.sleep(0.2)

    def command(self, *words: str, check: bool = True) -> str:
        """A Slurm command's output (stdout and stderr), run with this cluster's ``SLURM_CONF``.

        Raises:
            AssertionError: it exited non-zero and ``check``.
        """
        proc = subprocess.run(words, env=self.env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 or not check, (words, proc.stdout, proc.stderr)
        return proc.stdout + proc.stderr

    def summary(self) -> str:
        """The daemons' pids and ``sinfo``'s node list now."""
        pids = ", ".join(f"{name} pid {proc.pid}" for name, proc in self.procs.items())
        return f"{pids}\n{self.command('sinfo', '-N', '-l', check=False)}"

    def sbatch(self, *args: str, cwd: Path, env: dict[str, str]) -> str:
        """``sbatch args`` in ``cwd`` with ``env`` (the job's environment, ``SLURM_CONF`` added);
        the job id."""
        proc = subprocess.run(
            ["sbatch", "--parsable", *args],
            cwd=cwd,
            env={**env, "SLURM_CONF": str(self.conf)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (``JobState``, ``ExitCode``, ``Restarts``, ...)."""
        text = self.command("scontrol", "show", "job", "-o", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_ended(self, job_id: str, timeout: float = 240) -> dict[str, str]:
        """The job's fields once it ended (:data:`ENDED`)."""
        deadline = time.monotonic() + timeout
        while (fields := self.job(job_id))["JobState"] not in ENDED:
            assert time.monotonic() < deadline, f"job {job_id} still {fields['JobState']}"
            time.sleep(0.5)
        return fields

    def completions(self, job_id: str, count: int = 1) -> list[dict[str, str]]:
        """The job's lines in ``jobcomp.txt`` (``JobState``, ``ExitCode``, ...: one per attempt,
        written when it ended), once there are ``count``."""
        path, deadline = self.folder / "jobcomp.txt", time.monotonic() + 30
        while True:
            text = path.read_text() if path.exists() else ""
            lines = [line for line in text.splitlines() if f"JobId={job_id} " in line]
            if len(lines) >= count:
                return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in lines]
            assert time.monotonic() < deadline, (
                f"{len(lines)} of job {job_id}'s {count} lines in {path}"
            )
            time.sleep(0.2)

    def logs(self) -> str:
        """The daemons' own logs (the last 20 lines of each)."""
        parts = []
        for path in sorted(self.folder.glob("*.log")) + sorted(self.folder.glob("*.out")):
            lines = path.read_text(errors="replace").splitlines()[-20:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self) -> None:
        """Every job cancelled (and gone from ``squeue``, for up to :data:`START_S` seconds), then
        SIGTERM to each daemon by its pid (slurmd first, munged last), SIGKILL after 30 s; the
        folder removed."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            self.command("scancel", f"--user={getpass.getuser()}", check=False)
            deadline = time.monotonic() + START_S
            while self.command("squeue", "-h", check=False).strip():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
