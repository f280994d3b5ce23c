"""Runs on several nodes (issue 35 items 1-3): two ``./run_train.sh`` launchers of 2 workers each on
127.0.0.1 are two nodes to every part of torch.distributed (each its own torchrun agent, rendezvous
and control folder).

The module's reference is one 2 x 2 run of the tiny model in layout mode (6 steps, a constant LR,
checkpoints at 2, 4 and 6) launched from ``NNODES``/``NODE_RANK``/``MASTER_ADDR``/``MASTER_PORT``:
it prints one process's fingerprint and has its loss and gradient-norm curves and final weights
bitwise (``compare_runs --assert-equal``, the gathered checkpoint); its step-2 checkpoint resumes on
1 node x 4 (the next checkpoint's shards bitwise) and on 2 nodes x 1; a 2 x 2 run stopped by SIGTERM
to node 1's launcher saves on both nodes, both exit 0, and resumes on 1 node x 2 to bitwise the
reference's curves and final weights. The other launches: HSDP 2 x 2 from Slurm's variables against
HSDP on 1 node x 4, a worker SIGKILLed on one node of a c10d rendezvous, nodes with another config
and code, and a node alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
from ckpt_helpers import text_file
from dist_helpers import REPO, launcher_copy
from fault_helpers import (
    CONSTANT_LR,
    FAST,
    HANG_S,
    Run,
    alive,
    descendants,
    last_line,
    run,
    shard_digests,
    worker_pid,
)
from layout_helpers import assert_equal_curves, final_state

pytestmark = pytest.mark.multiprocess

STEPS = 6
RUN = [
    *FAST,
    *CONSTANT_LR,
    "--training.local_batch_size=1",
    "--training.global_batch_size=4",
    f"--training.steps={STEPS}",
    "--checkpoint.interval=2",
    "--metrics.enable_tensorboard=true",
    "--training.compute_dtype=float32",
]
"""Four micro-batches of one window per step (one per rank on 4 ranks, two on 2), the loss curve in
TensorBoard."""
LAYOUT = ["--training.deterministic=layout"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def nodes(
    args: list[str],
    *,
    nproc: int = 2,
    nnodes: int = 2,
    how: str = "master",
    node1: list[str] = (),
    cwd1: Path = REPO,
) -> list[Run]:
    """``nnodes`` launchers of ``./run_train.sh args`` with ``nproc`` workers each, on one
    rendezvous on 127.0.0.1 given as ``how``: ``master`` (NNODES, NODE_RANK, MASTER_ADDR,
    MASTER_PORT), ``slurm`` (srun's SLURM_STEP_* and SLURM_NODEID, MASTER_ADDR) or ``c10d`` (NNODES,
    RDZV_ENDPOINT); node 1 gets ``node1`` appended and runs in ``cwd1``."""
    port = str(free_port())
    launched = []
    for node in range(nnodes):
        extra = {
            "master": {
                "NNODES": str(nnodes),
                "NODE_RANK": str(node),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            },
            "slurm": {
                "SLURM_STEP_NUM_NODES": str(nnodes),
                "SLURM_STEP_NUM_TASKS": str(nnodes),
                "SLURM_NODEID": str(node),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            },
            "c10d": {"NNODES": str(nnodes), "RDZV_ENDPOINT": f"127.0.0.1:{port}"},
        }[how]
        launched.append(
            Run(
                [*args, *(node1 if node == 1 else [])],
                nproc=nproc,
                extra_env=extra,
                cwd=cwd1 if node == 1 else REPO,
            )
        )
    return launched


def finished(launched: list[Run]) -> list[tuple[int, list[str]]]:
    """Each launcher's ``(exit status, output lines)``."""
    return [one.finish() for one in launched]


def assert_ok(results: list[tuple[int, list[str]]]) -> None:
    for code, lines in results:
        assert code == 0 and "Warning" not in "\n".join(lines), "\n".join(lines[-30:])


def fingerprint(lines: list[str]) -> str:
    return next(
        m.group(1)
        for line in lines
        if (m := re.search(r"^\[rank0\]:init .*fingerprint (\w+)$", line))
    )


def args(data: Path, dump: Path, *extra: str) -> list[str]:
    return [
        *RUN,
        f"--training.dataset_path={data / 'data.txt'}",
        f"--job.dump_folder={dump}",
        *extra,
    ]


def copy_step(source: Path, dump: Path, step: int) -> None:
    """``dump``'s checkpoint folder holding a copy of ``source``'s ``step-<step>``."""
    (dump / "checkpoint").mkdir(parents=True)
    shutil.copytree(source / "checkpoint" / f"step-{step}", dump / "checkpoint" / f"step-{step}")


def assert_equal_states(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[key], b[key]) for key in a), [
        key for key in a if not torch.equal(a[key], b[key])
    ]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    text_file(folder, n_plays=1)
    return folder


@pytest.fixture(scope="module")
def two_by_two(data) -> tuple[Path, list[str]]:
    """The reference: 2 nodes x 2 in layout mode; its dump folder and node 0's lines."""
    dump = data / "2x2"
    results = finished(nodes(args(data, dump, *LAYOUT)))
    assert_ok(results)
    return dump, results[0][1]


def test_2x2_prints_the_1_process_fingerprint_and_trains_bitwise_as_1_process(data, two_by_two):
    dump, lines = two_by_two
    code, one = run(args(data, data / "one", *LAYOUT))
    assert code == 0, "\n".join(one[-30:])
    assert fingerprint(lines) == fingerprint(one)
    assert_equal_curves(data / "one", dump, STEPS)
    assert_equal_states(final_state(data / "one", STEPS), final_state(dump, STEPS))


def test_hsdp_over_2_slurm_nodes_trains_bitwise_as_hsdp_on_1x4(data, two_by_two):
    hsdp = ["--parallelism.data_parallel_replicate_degree=2", "--training.deterministic=run"]
    results = finished(nodes(args(data, data / "hsdp2x2", *hsdp), how="slurm"))
    assert_ok(results)
    code, single = run(args(data, data / "hsdp1x4", *hsdp), nproc=4)
    assert code == 0, "\n".join(single[-30:])
    assert fingerprint(results[0][1]) == fingerprint(single) == fingerprint(two_by_two[1])
    assert any("layout dp_replicate 2 x dp_shard 2" in line for line in results[0][1]), results[0][
        1
    ][:5]
    assert_equal_curves(data / "hsdp1x4", data / "hsdp2x2", STEPS)


def test_the_2x2_checkpoint_is_committed_once_and_resumes_bitwise_on_1x4_and_2x1(data, two_by_two):
    dump, _ = two_by_two
    folder = dump / "checkpoint"
    assert sorted(path.name for path in folder.iterdir()) == [".lock", "step-2", "step-4", "step-6"]
    meta = json.loads((folder / "step-2" / "meta.json").read_text())
    assert meta["world_size"] == 4
    assert sorted(name for name in meta["files"] if name.endswith(".distcp")) == [
        f"__{r}_0.distcp" for r in range(4)
    ]
    copy_step(dump, data / "1x4", 2)
    code, lines = run(args(data, data / "1x4", *LAYOUT), nproc=4)
    assert code == 0, "\n".join(lines[-30:])
    assert any("resumed at step 2 from " in line for line in lines), "\n".join(lines)
    assert shard_digests(data / "1x4" / "checkpoint" / f"step-{STEPS}") == shard_digests(
        folder / f"step-{STEPS}"
    )
    assert_equal_curves(dump, data / "1x4", STEPS, first=3)
    copy_step(dump, data / "2x1", 2)
    assert_ok(finished(nodes(args(data, data / "2x1", *LAYOUT), nproc=1)))
    assert_equal_curves(dump, data / "2x1", STEPS, first=3)
    assert_equal_states(final_state(dump, STEPS), final_state(data / "2x1", STEPS))


def test_sigterm_to_node_1_saves_on_both_nodes_both_exit_0_and_1x2_resumes_to_the_uninterrupted_run(
    data, two_by_two
):
    dump = data / "stopped"
    launched = nodes(args(data, dump, *LAYOUT, "--training.steps=100000"))
    launched[0].wait_for(r"^\[rank0\]:step +1 ")
    launched[1].signal(signal.SIGTERM)
    results = finished(launched)
    saved = [
        re.fullmatch(
            rf"\[rank0\]:stopped by a signal after step (\d+); checkpoint saved: "
            rf"{dump / 'checkpoint'}/step-(\d+)",
            last_line(lines),
        )
        for _, lines in results
    ]
    assert [code for code, _ in results] == [0, 0] and all(saved), [
        lines[-5:] for _, lines in results
    ]
    step = int(saved[0].group(1))
    assert saved[1].group(1) == saved[0].group(2) == saved[1].group(2) == str(step)
    assert step < STEPS, (
        f"the stop came after step {step}: a slower run is needed to resume before step {STEPS}"
    )
    assert (
        json.loads((dump / "checkpoint" / f"step-{step}" / "meta.json").read_text())["world_size"]
        == 4
    )
    copy_step(dump, data / "1x2", step)
    code, lines = run(args(data, data / "1x2", *LAYOUT), nproc=2)
    assert code == 0, "\n".join(lines[-30:])
    assert any(f"resumed at step {step} from " in line for line in lines), "\n".join(lines)
    assert_equal_curves(two_by_two[0], data / "1x2", STEPS, first=step + 1)
    assert_equal_states(final_state(two_by_two[0], STEPS), final_state(data / "1x2", STEPS))


def test_sigkill_of_a_worker_on_one_node_ends_every_node_before_a_timeout_leaving_none(data):
    launched = nodes(args(data, data / "killed", "--training.steps=100000"), how="c10d")
    launched[0].wait_for(r"^\[rank0\]:step +2 ")
    tree = descendants(launched[0].proc.pid) | descendants(launched[1].proc.pid)
    begin = time.monotonic()
    os.kill(worker_pid(launched[1].proc.pid, 1), signal.SIGKILL)
    results = finished(launched)
    took = time.monotonic() - begin
    print(
        f"both nodes ended {took:.1f} s after the SIGKILL: "
        f"{[(code, lines[-1]) for code, lines in results]}"
    )
    assert took < HANG_S  # the kill stopped the other node, not the collective's timeout
    assert all(code == 1 for code, _ in results), [lines[-5:] for _, lines in results]
    assert re.fullmatch(
        r"error: training failed \(torchrun exit status 1\): rank \d was killed by SIGKILL; the "
        r"last complete checkpoint is kept",
        results[1][1][-1],
    ), results[1][1][-5:]
    assert re.fullmatch(
        r"error: training failed \(torchrun exit status 1\): a worker on another node failed or "
        r"was "
        r"killed \(rank \d here lost its connection to it; that node's last line names it\); the "
        r"last complete checkpoint is kept",
        results[0][1][-1],
    ), results[0][1][-5:]
    assert not alive(tree)


def test_a_node_with_another_config_and_code_is_refused_before_training_naming_both(data, tmp_path):
    work = launcher_copy(tmp_path)
    changed = work / "torchtitan_lite" / "components" / "loss.py"
    changed.write_text(changed.read_text() + "\n# another version\n")
    results = finished(nodes(args(data, tmp_path / "out"), node1=["--training.seed=7"], cwd1=work))
    expected = (
        "config error: the nodes do not run the same config and code: ranks 2-3 (host "
        f"{socket.gethostname()}) differ from rank 0 (host {socket.gethostname()}) in "
        "training.seed 7 "
        "(rank 0: 42); code files torchtitan_lite/components/loss.py; start every node with the "
        "same CONFIG_FILE, overrides and code version"
    )
    assert [(code, last_line(lines)) for code, lines in results] == [(2, expected), (2, expected)]
    assert not (tmp_path / "out" / "checkpoint").exists()


def test_a_node_alone_ends_after_rdzv_timeout_in_one_line_and_bad_node_variables_before_anything():
    begin = time.monotonic()
    launched = Run(
        ["--training.steps=1"],
        nproc=1,
        extra_env={
            "NNODES": "2",
            "NODE_RANK": "0",
            "MASTER_PORT": str(free_port()),
            "RDZV_TIMEOUT": "3",
        },
    )
    code, lines = launched.finish()
    took = time.monotonic() - begin
    assert 3 <= took < 240  # waited RDZV_TIMEOUT=3 s, not torchrun's own 600 s
    assert code == 2 and len(lines) == 1, lines
    assert re.fullmatch(
        r"input error: not all 2 nodes joined the rendezvous at 127\.0\.0\.1:\d+ within "
        r"RDZV_TIMEOUT=3 s \(1/2 nodes joined\): start \./run_train\.sh on every node with the "
        r"same "
        r"NNODES and MASTER_ADDR/MASTER_PORT \(or RDZV_ENDPOINT\) and a NODE_RANK each, or raise "
        r"RDZV_TIMEOUT",
        lines[0],
    )
    code, lines = run([], extra_env={"NNODES": "2", "NODE_RANK": "2"})
    assert (code, lines) == (
        2,
        [
            "config error: NODE_RANK=2 with NNODES=2: give each of the NNODES nodes (NNODES >= "
            "1) its own NODE_RANK, 0..1"
        ],
    )
