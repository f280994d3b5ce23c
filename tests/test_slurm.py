"""``sbatch scripts/multinode.slurm`` as written, on a real Slurm cluster of two nodes on 127.0.0.1
(:class:`slurm_helpers.SlurmCluster`: this module's own ``munged``, ``slurmctld`` and two
``slurmd``), one CPU rank per node (issue 48, item 1).

The reference is the same tiny run through ``NGPU=2 ./run_train.sh`` on one node (constant LR,
checkpoints at 2, 4 and 6). Through Slurm the run prints its fingerprint and trains to bitwise its
losses, gradient norms and final weights; ``scancel --signal=TERM`` saves on both nodes, the job
completes with exit code 0, and resubmitting the same command resumes to bitwise the reference's
curves and weights; a worker that raises on node 1 ends the job FAILED with the error named once in
the job's output; a job of ``sbatch --requeue`` whose node fails is run again by Slurm and resumes
to bitwise the reference's curves and weights.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
from ckpt_helpers import text_file
from dist_helpers import REPO, env, launcher_copy
from fault_helpers import CONSTANT_LR, FAST, run
from layout_helpers import assert_equal_curves, final_state
from slurm_helpers import SlurmCluster, free_port
from test_multinode import assert_equal_states, fingerprint

pytestmark = pytest.mark.multiprocess

STEPS = 6
RUN = [
    *FAST,
    *CONSTANT_LR,
    "--training.local_batch_size=1",
    "--training.global_batch_size=2",
    f"--training.steps={STEPS}",
    "--checkpoint.interval=2",
    "--metrics.enable_tensorboard=true",
]
"""Two micro-batches of one window per step (one per rank on 2 ranks), the curves in TensorBoard."""


def args(data: Path, dump: Path, *extra: str) -> list[str]:
    return [
        *RUN,
        f"--training.dataset_path={data / 'data.txt'}",
        f"--job.dump_folder={dump}",
        *extra,
    ]


@pytest.fixture(scope="module")
def cluster():
    started = SlurmCluster(nodes=2)
    yield started
    started.stop()


@pytest.fixture(autouse=True)
def report(request, cluster):
    """The test's wall seconds, and the daemons' pids and ``sinfo`` at its start, in the session's
    summary (``conftest.pytest_terminal_summary``)."""
    summary = cluster.summary()
    begin = time.monotonic()
    yield
    request.node.user_properties.append(
        ("log", f"{time.monotonic() - begin:.1f} s wall; cluster: {summary}")
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    text_file(folder, n_plays=1)
    return folder


@pytest.fixture(scope="module")
def reference(data) -> list[str]:
    """``NGPU=2 ./run_train.sh`` of :data:`RUN` into ``data / "ref"``; its output lines."""
    code, lines = run(args(data, data / "ref"), nproc=2)
    assert code == 0, "\n".join(lines[-30:])
    return lines


class Job:
    """``NGPU=1 sbatch --gpus-per-node=0 [options] scripts/multinode.slurm args`` from ``cwd`` (one
    CPU rank per node; the script's ``--gpus-per-node=8`` would be refused: no GPUs), its output
    in ``data / "slurm-<job id>.out"``."""

    def __init__(self, cluster, data, sbatch, run_args, cwd=REPO):
        self.cluster = cluster
        job_env = env(NGPU="1", MASTER_PORT=str(free_port()))
        self.id = cluster.sbatch(
            "--gpus-per-node=0",
            f"--output={data}/slurm-%j.out",
            *sbatch,
            "scripts/multinode.slurm",
            *run_args,
            cwd=cwd,
            env=job_env,
        )
        self.output = data / f"slurm-{self.id}.out"

    def text(self) -> str:
        return self.output.read_text() if self.output.exists() else ""

    def wait_for(self, pattern: str, timeout: float = 240) -> re.Match:
        """The first match of ``pattern`` (a line) in the job's output, polled."""
        deadline = time.monotonic() + timeout
        while not (match := re.search(pattern, self.text(), re.MULTILINE)):
            assert time.monotonic() < deadline, (
                f"no {pattern!r} in job {self.id}'s output:\n{self.text()[-3000:]}"
            )
            time.sleep(0.2)
        return match

    def ended(self) -> tuple[dict[str, str], str]:
        """``scontrol show job``'s fields once the job ended, and its output."""
        fields = self.cluster.wait_ended(self.id)
        return fields, self.text()


SLOW_STEPS = """

_train_step_once = Trainer.train_step


def _train_step_after_a_second(self, *args, **kwargs):
    time.sleep(1.0)
    return _train_step_once(self, *args, **kwargs)


Trainer.train_step = _train_step_after_a_second
"""
"""A second's sleep before each step (the same arithmetic): a run of :data:`STEPS` steps lasts long
enough for a signal or a node failure to come before its end on a fast machine."""
NODE1_ERROR = """

_build_dataloaders_once = build_dataloaders


def build_dataloaders(*args, **kwargs):
    if os.environ["SLURM_NODEID"] == "1":
        raise RuntimeError("injected failure on node 1")
    return _build_dataloaders_once(*args, **kwargs)
"""


def changed_copy(folder: Path, code: str) -> Path:
    """A copy of the repository's launcher, packages and ``scripts/multinode.slurm`` with ``code``
    added to the trainer's module (:func:`dist_helpers.launcher_copy`); its path."""
    work = launcher_copy(folder)
    (work / "scripts").mkdir()
    shutil.copy2(REPO / "scripts" / "multinode.slurm", work / "scripts" / "multinode.slurm")
    train_py = work / "torchtitan_lite" / "train.py"
    main_block = '\nif __name__ == "__main__":'
    train_py.write_text(train_py.read_text().replace(main_block, code + main_block))
    return work


@pytest.fixture(scope="module")
def slow(tmp_path_factory) -> Path:
    return changed_copy(tmp_path_factory.mktemp("slow"), SLOW_STEPS)


def keep_last_run(dump: Path, text: str) -> None:
    """Move the run folders of ``dump`` other than the last one named in the job's output ``text``
    (the resumed run's) out to ``dump``-earlier, for :func:`layout_helpers.assert_equal_curves`,
    which reads the one run folder of a dump folder."""
    last = Path(re.findall(r"run folder (\S+): config\.toml", text)[-1])
    for run_json in list(dump.glob("*/run.json")):
        if run_json.parent != last:
            run_json.parent.rename(dump.parent / f"{dump.name}-earlier-{run_json.parent.name}")


def assert_ended(cluster, job: Job, state: str) -> str:
    """The job's output, once it ended in ``state`` (exit code 0:0 for COMPLETED, else not 0:0), as
    ``scontrol show job`` and ``jobcomp.txt`` say."""
    fields, text = job.ended()
    completion = cluster.completions(job.id, count=int(fields["Restarts"]) + 1)[-1]
    for said in (fields, completion):
        assert said["JobState"] == state, (said, text[-3000:])
        assert (said["ExitCode"] == "0:0") == (state == "COMPLETED"), (said, text[-3000:])
    return text


def test_sbatch_trains_to_the_fingerprint_and_losses_of_run_train_sh(cluster, data, reference):
    job = Job(cluster, data, [], args(data, data / "slurm"))
    text = assert_ended(cluster, job, "COMPLETED")
    assert cluster.job(job.id)["NodeList"] == "node[0-1]"
    lines = text.splitlines()
    assert fingerprint(lines) == fingerprint(reference)
    assert sum("world size 2" in line for line in lines) == 2, text[:3000]  # both nodes' launchers
    assert_equal_curves(data / "ref", data / "slurm", STEPS)
    assert_equal_states(final_state(data / "ref", STEPS), final_state(data / "slurm", STEPS))


def test_scancel_signal_term_saves_on_both_nodes_exits_0_and_resubmitting_resumes_bitwise(
    cluster, data, reference, slow
):
    dump = data / "stopped"
    job = Job(cluster, data, [], args(data, dump), cwd=slow)
    job.wait_for(r"^\[rank0\]:step +1 ")
    cluster.command("scancel", "--signal=TERM", job.id)
    text = assert_ended(cluster, job, "COMPLETED")
    saved = re.findall(
        rf"^\[rank0\]:stopped by a signal after step (\d+); checkpoint saved: "
        rf"{dump / 'checkpoint'}/step-(\d+)$",
        text,
        re.MULTILINE,
    )
    assert len(saved) == 2 and len(set(saved)) == 1, text[-3000:]  # both nodes, the same step
    step = int(saved[0][0])
    assert step < STEPS, f"the stop came after step {step}: a slower run is needed"
    again = Job(cluster, data, [], args(data, dump), cwd=slow)
    text = assert_ended(cluster, again, "COMPLETED")
    assert text.count(f"resumed at step {step} from ") == 2, text[-3000:]
    keep_last_run(dump, text)
    assert_equal_curves(data / "ref", dump, STEPS, first=step + 1)
    assert_equal_states(final_state(data / "ref", STEPS), final_state(dump, STEPS))


def test_a_worker_raising_on_node_1_fails_the_job_naming_the_error_once(cluster, data, tmp_path):
    work = changed_copy(tmp_path, NODE1_ERROR)
    job = Job(cluster, data, [], args(data, tmp_path / "out"), cwd=work)
    text = assert_ended(cluster, job, "FAILED")
    assert text.count("RuntimeError: injected failure on node 1") == 1, text[-5000:]
    assert sorted(line for line in text.splitlines() if line.startswith("error: ")) == [
        "error: training failed (torchrun exit status 1): a worker on another node failed or was "
        "killed (rank 0 here lost its connection to it; that node's last line names it); the last "
        "complete checkpoint is kept",
        "error: training failed (torchrun exit status 1): rank 1 exited with status 1; see the "
        "output above",
    ], text[-5000:]  # each node's last line, in the order the nodes ended


def test_sbatch_requeue_after_a_node_failure_resumes_to_the_uninterrupted_weights(
    cluster, data, reference, slow
):
    dump = data / "requeued"
    job = Job(cluster, data, ["--requeue"], args(data, dump), cwd=slow)
    job.wait_for(rf"^\[rank0\]:checkpoint saved: {dump / 'checkpoint'}/step-2 ")
    cluster.command("scontrol", "update", "NodeName=node1", "State=DOWN", "Reason=test")
    text = assert_ended(cluster, job, "COMPLETED")
    assert [said["JobState"] for said in cluster.completions(job.id, count=2)] == [
        "NODE_FAIL",
        "COMPLETED",
    ]
    assert "srun: error: Node failure on node1" in text, text[-3000:]
    resumed = re.findall(r"resumed at step (\d+) from ", text)
    assert len(resumed) == 2 and len(set(resumed)) == 1 and int(resumed[0]) >= 2, text[-3000:]
    keep_last_run(dump, text)
    assert_equal_curves(data / "ref", dump, STEPS, first=int(resumed[0]) + 1)
    assert_equal_states(final_state(data / "ref", STEPS), final_state(dump, STEPS))
