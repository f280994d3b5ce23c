"""The nodes of a run: torchrun's rendezvous arguments from the environment (``docs/running.md``).

``NNODES``, ``NODE_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` (static rendezvous) or
``RDZV_ENDPOINT``/``RDZV_ID`` (c10d), ``RDZV_TIMEOUT``; under ``srun`` Slurm's
``SLURM_STEP_NUM_NODES``, ``SLURM_NODEID`` and ``SLURM_STEP_NODELIST`` give the defaults.
``TORCHRUN_ARGS`` holding ``--nnodes`` replaces them all.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass


class NodesError(ValueError):
    """Node variables that cannot start a run (the launcher: ``config error: ...``, exit 2)."""


@dataclass(frozen=True)
class Nodes:
    """The node part of torchrun's command line and what the launcher says about it."""

    torchrun_args: list[str]
    """``TORCHRUN_ARGS``'s words after the rendezvous arguments made from the variables."""
    nnodes: str
    """``--nnodes`` of :attr:`torchrun_args` (``"1"`` without one; maybe an elastic ``MIN:MAX``)."""
    where: str
    """The rendezvous for a message: ``host:port within RDZV_TIMEOUT=600 s``."""


def _first_slurm_host(nodelist: str) -> str | None:
    """The first host of a Slurm node list (``scontrol show hostnames``), or ``None``."""
    if shutil.which("scontrol") is None:
        return None
    hosts = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True
    ).stdout.split()
    return hosts[0] if hosts else None


def nodes_from_env(env: Mapping[str, str]) -> Nodes:
    """The rendezvous of this run from ``env`` (an empty variable counts as unset).

    Raises:
        NodesError: srun started more than one task per node, a variable is not a whole number, or
            ``NODE_RANK`` is not in ``0..NNODES-1``.
    """
    var = {name: value for name, value in env.items() if value}
    words = var.get("TORCHRUN_ARGS", "").split()
    if "SLURM_STEP_NUM_NODES" in var:
        nodes = var["SLURM_STEP_NUM_NODES"]
        if var.get("SLURM_STEP_NUM_TASKS", nodes) != nodes:
            tasks = var["SLURM_STEP_NUM_TASKS"]
            raise NodesError(
                f"srun started {tasks} tasks on {nodes} nodes, but run_train.sh runs "
                "once per node (it starts NGPU workers): use srun --ntasks-per-node=1"
            )
        var.setdefault("NNODES", nodes)
        var.setdefault("NODE_RANK", var.get("SLURM_NODEID", "0"))
        if "MASTER_ADDR" not in var and "RDZV_ENDPOINT" not in var:
            host = _first_slurm_host(var.get("SLURM_STEP_NODELIST", ""))
            if host:
                var["MASTER_ADDR"] = host
    timeout = var.get("RDZV_TIMEOUT", "600")
    where = "of TORCHRUN_ARGS in time"
    if not any(word.startswith("--nnodes") for word in words):
        for name in ("NNODES", "NODE_RANK", "MASTER_PORT", "RDZV_TIMEOUT"):
            if name in var and not var[name].isdigit():
                raise NodesError(f"{name}={var[name]} is not a whole number; set it to one")
        nnodes, node_rank = int(var.get("NNODES", "1")), int(var.get("NODE_RANK", "0"))
        if nnodes < 1 or node_rank >= nnodes:
            raise NodesError(
                f"NODE_RANK={node_rank} with NNODES={nnodes}: give each of the NNODES "
                f"nodes (NNODES >= 1) its own NODE_RANK, 0..{max(nnodes - 1, 0)}"
            )
        if nnodes > 1:
            if "RDZV_ENDPOINT" in var:
                endpoint = var["RDZV_ENDPOINT"]
                run_id = var.get("RDZV_ID", var.get("SLURM_JOB_ID", "torchtitan_lite"))
                rdzv = [
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={endpoint}",
                    f"--rdzv-id={run_id}",
                    f"--rdzv-conf=join_timeout={timeout}",
                ]
            else:
                addr, port = var.get("MASTER_ADDR", "127.0.0.1"), var.get("MASTER_PORT", "29500")
                endpoint = f"{addr}:{port}"
                rdzv = [
                    f"--node-rank={node_rank}",
                    f"--master-addr={addr}",
                    f"--master-port={port}",
                    f"--rdzv-conf=timeout={timeout}",
                ]
            words = [f"--nnodes={nnodes}", *rdzv, *words]
            where = f"{endpoint} within RDZV_TIMEOUT={timeout} s"
    nnodes_arg = "1"
    for i, word in enumerate(words):
        if word.startswith("--nnodes="):
            nnodes_arg = word.removeprefix("--nnodes=")
        elif word == "--nnodes":
            nnodes_arg = words[i + 1] if i + 1 < len(words) else "1"
    return Nodes(words, nnodes_arg, where)
