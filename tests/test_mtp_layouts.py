"""Multi-token prediction through ``./run_train.sh`` (issue 34): the DeepSeek-V3 debug job with
``mtp_num_layers = 1`` (2 blocks, windows of 64) on 1 process, on 2 (FSDP,
``training.deterministic = "layout"``) and on 2 with expert parallelism: the same init fingerprint,
bitwise the same losses and MTP losses on the layout run, the ep2 losses within 1e-4 of one process,
and no warning line."""

from __future__ import annotations

import re

import pytest
from dist_helpers import run_train

pytestmark = pytest.mark.multiprocess

COMMON = [
    "--job.config_file=train_configs/deepseek_v3_debug.toml",
    "--model.overrides.mtp_num_layers=1",
    "--model.overrides.n_layers=2",
    "--training.seq_len=64",
    "--training.steps=3",
    "--lr_scheduler.warmup_steps=1",
    "--metrics.log_freq=1",
    "--validation.enable=false",
]
RUNS = {
    "1": (1, ["--training.deterministic=layout"]),
    "dp2": (2, ["--training.deterministic=layout"]),
    "ep2": (2, ["--parallelism.expert_parallel_degree=2"]),
}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, str]:
    """run name -> rank 0's output."""
    out = {}
    for name, (nproc, extra) in RUNS.items():
        folder = tmp_path_factory.mktemp(name)
        done = run_train([*COMMON, *extra, f"--job.dump_folder={folder}"], nproc=nproc, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        out[name] = done.stdout + done.stderr
    return out


def fingerprint(text: str) -> str:
    return re.search(r"\[rank0\]:init .* fingerprint ([0-9a-f]{16})", text).group(1)


def losses(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"\[rank0\]:step +\d+  loss +([0-9.]+)", text)]


def mtp_losses(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"\[rank0\]:step +\d+  .*mtp loss ([0-9.]+)", text)]


@pytest.mark.parametrize("name", ["dp2", "ep2"])
def test_the_init_fingerprint_equals_one_process(outputs, name):
    assert fingerprint(outputs[name]) == fingerprint(outputs["1"])


def test_two_processes_in_layout_mode_give_bitwise_the_losses_and_mtp_losses_of_one(outputs):
    assert (
        len(losses(outputs["1"])) == 3 and len(mtp_losses(outputs["1"])) == 1
    )  # the last step's summary
    assert losses(outputs["dp2"]) == losses(outputs["1"])
    assert mtp_losses(outputs["dp2"]) == mtp_losses(outputs["1"])


def test_expert_parallel_losses_are_within_1e_4_of_one_process(outputs):
    assert losses(outputs["ep2"]) == pytest.approx(losses(outputs["1"]), rel=1e-4)
    assert mtp_losses(outputs["ep2"]) == pytest.approx(mtp_losses(outputs["1"]), rel=1e-4)


@pytest.mark.parametrize("name", list(RUNS))
def test_no_run_prints_a_warning(outputs, name):
    assert [line for line in outputs[name].splitlines() if "warning" in line.lower()] == []
