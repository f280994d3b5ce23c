"""The launcher's pieces without a launch: torchrun's node arguments from the environment, and the
last line from a control folder (the workers' outcomes, the agent's record of torchrun's report)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from torchtitan_lite.config.load import CONFIG_FILE_FROM_ENV
from torchtitan_lite.launch import __main__ as launcher
from torchtitan_lite.launch.agent import failures_record
from torchtitan_lite.launch.ending import failure_line, worst_outcome
from torchtitan_lite.launch.nodes import NodesError, nodes_from_env
from torchtitan_lite.lifecycle.faults import ERROR_FILE_ENV, record_error
from torchtitan_lite.preflight.checks import WORLD_SIZE_ENV
from torchtitan_lite.preflight.resolved import RESOLVED_CONFIG_ENV
from torchtitan_lite.threads import entry_point, thread_env

KEPT = "the last complete checkpoint is kept"


def test_the_launcher_sets_the_variables_the_preflight_and_the_workers_read():
    assert (
        launcher.WORLD_SIZE_ENV,
        launcher.RESOLVED_CONFIG_ENV,
        launcher.CONFIG_FILE_FROM_ENV,
    ) == (WORLD_SIZE_ENV, RESOLVED_CONFIG_ENV, CONFIG_FILE_FROM_ENV)


def test_one_node_adds_nothing_and_two_nodes_get_a_static_or_c10d_rendezvous():
    assert nodes_from_env({}).torchrun_args == [] and nodes_from_env({}).nnodes == "1"
    static = nodes_from_env(
        {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "h0", "RDZV_TIMEOUT": "3"}
    )
    assert static.torchrun_args == [
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=h0",
        "--master-port=29500",
        "--rdzv-conf=timeout=3",
    ]
    assert static.where == "h0:29500 within RDZV_TIMEOUT=3 s"
    c10d = nodes_from_env(
        {"NNODES": "2", "RDZV_ENDPOINT": "h0:1234", "SLURM_JOB_ID": "77", "TORCHRUN_ARGS": "--x"}
    )
    assert c10d.torchrun_args == [
        "--nnodes=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=h0:1234",
        "--rdzv-id=77",
        "--rdzv-conf=join_timeout=600",
        "--x",
    ]


def test_srun_variables_give_the_defaults_and_torchrun_args_with_nnodes_replace_them():
    slurm = nodes_from_env({"SLURM_STEP_NUM_NODES": "4", "SLURM_NODEID": "3", "MASTER_ADDR": "h0"})
    assert slurm.torchrun_args[:2] == ["--nnodes=4", "--node-rank=3"] and slurm.nnodes == "4"
    own = nodes_from_env({"NNODES": "x", "TORCHRUN_ARGS": "--nnodes 1:3 --rdzv-backend=c10d"})
    assert own.torchrun_args == ["--nnodes", "1:3", "--rdzv-backend=c10d"] and own.nnodes == "1:3"


@pytest.mark.parametrize(
    "variables, message",
    [
        ({"NNODES": "two"}, "NNODES=two is not a whole number; set it to one"),
        (
            {"NNODES": "2", "NODE_RANK": "2"},
            "NODE_RANK=2 with NNODES=2: give each of the NNODES nodes (NNODES >= 1) its own "
            "NODE_RANK, 0..1",
        ),
        (
            {"SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "16"},
            "srun started 16 tasks on 2 nodes, but run_train.sh runs once per node (it starts NGPU "
            "workers): use srun --ntasks-per-node=1",
        ),
    ],
)
def test_node_variables_that_cannot_start_a_run_are_refused_naming_the_value(variables, message):
    with pytest.raises(NodesError) as err:
        nodes_from_env(variables)
    assert str(err.value) == message


def test_the_worst_outcome_wins_and_the_shown_ranks_line_on_a_tie(tmp_path):
    assert worst_outcome(str(tmp_path), "0") == (0, "")
    (tmp_path / "outcome.0").write_text("0\nstopped\n")
    (tmp_path / "outcome.1").write_text("2\ninput error: one\n")
    (tmp_path / "outcome.2").write_text("2\ninput error: two\n")
    assert worst_outcome(str(tmp_path), "0") == (2, "input error: one")
    assert worst_outcome(str(tmp_path), "2") == (2, "input error: two")


def _line(tmp_path, record) -> tuple[int, str] | None:
    (tmp_path / "failures.json").write_text(json.dumps(record))
    return failure_line(str(tmp_path), 1, "2", "h0:29500 within RDZV_TIMEOUT=3 s")


def _failed(rank: int, exitcode: int, lost_peer: bool = False) -> dict:
    return {"rank": rank, "exitcode": exitcode, "lost_peer": lost_peer}


def test_a_killed_worker_is_named_even_when_a_peer_that_lost_it_failed_first(tmp_path):
    assert failure_line(str(tmp_path), 1, "1", "") is None
    failed = "error: training failed (torchrun exit status 1):"
    killed = {"failures": [_failed(0, 1), _failed(1, -9)]}
    assert _line(tmp_path, killed) == (1, f"{failed} rank 1 was killed by SIGKILL; {KEPT}")
    lost = {"failures": [_failed(2, 1, lost_peer=True)]}
    assert _line(tmp_path, lost) == (
        1,
        f"{failed} a worker on another node failed or was killed "
        f"(rank 2 here lost its connection to it; that node's last line names it); {KEPT}",
    )
    bug = {"failures": [_failed(0, 1)]}
    assert _line(tmp_path, bug) == (
        1,
        f"{failed} rank 0 exited with status 1; see the output above",
    )


def test_a_rendezvous_that_timed_out_is_an_input_error_naming_where_and_who_joined(tmp_path):
    code, line = _line(tmp_path, {"rendezvous": "1/2 nodes joined"})
    assert code == 2 and line.startswith(
        "input error: not all 2 nodes joined the rendezvous at "
        "h0:29500 within RDZV_TIMEOUT=3 s (1/2 nodes joined): start ./run_train.sh on every node"
    )


def test_the_agent_reads_a_lost_peer_from_the_error_file_a_worker_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv(ERROR_FILE_ENV, str(tmp_path / "error.json"))
    record_error("lost a peer: rank 0's run ended: a worker on host h1 failed or was killed")
    lost = ProcessFailure(local_rank=0, pid=11, exitcode=1, error_file=str(tmp_path / "error.json"))
    killed = ProcessFailure(local_rank=1, pid=12, exitcode=-9, error_file=str(tmp_path / "no.json"))
    killed.timestamp = lost.timestamp + 1  # observed after the lost peer's end
    err = ChildFailedError("torchtitan_lite.train", {3: killed, 2: lost})
    expected = [_failed(2, 1, lost_peer=True), _failed(3, -9)]
    assert failures_record(err) == {"failures": expected}


PROBE = """import atexit, os, sys

def _report():
    loaded = "torch" in sys.modules
    import torch
    print("threads", torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"),
          os.environ.get("OMP_WAIT_POLICY"), loaded)

atexit.register(_report)
"""
"""A ``sitecustomize`` that prints, as the process exits, its torch threads, OpenMP variables and
whether the tool had loaded torch."""


@pytest.mark.parametrize(
    "module", ["torchtitan_lite.tools.inspect_init", "torchtitan_lite.data.prepare"]
)
def test_a_tool_runs_with_the_openmp_settings_of_a_worker(module, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(PROBE)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        env={**environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    worker: dict[str, str] = {}
    thread_env(worker, "1")  # the launcher's, for a run of one rank
    line = proc.stdout.strip().splitlines()[-1]
    expected = f"threads {worker['OMP_NUM_THREADS']} {worker['OMP_NUM_THREADS']} PASSIVE True"
    assert (proc.returncode, line) == (0, expected), proc.stderr[-2000:]
    assert entry_point(["python", "-u", "-m", module, "--x"]) == module
    assert entry_point(["python", "-m", "torchtitan_lite.launch"]) is None
