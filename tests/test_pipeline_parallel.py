"""Pipeline parallelism on gloo (2 and 4 ranks of one thread) against one process, through the real
Trainer.

For each layout: every initial tensor, gathered, equals the 1-process init bitwise; the printed
fingerprint is the same; the step-1 loss is within 1e-5 (relative) and the first 10 losses within
1e-4 of one process; the gradients of step 1 within 1e-5 of the largest gradient of their tensor.
Each schedule runs once: 1F1B through ``run_train.sh`` (the fingerprint and the loss of every step
as every rank printed it) and on pp2 x tp2 (sequence and loss parallel: sequence-sharded hidden
states between stages), GPipe on pp2 x dp2 and Interleaved1F1B (4 stages on 2 ranks) through
``tests/dist_pipeline_worker.py``; and one MoE family (Qwen3-MoE, whose expert counters and biases
are plain tensors of each stage).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from dist_helpers import REPO, launch, run_train

pytestmark = pytest.mark.multiprocess

WORKER = REPO / "tests" / "dist_pipeline_worker.py"
STEPS = 10
RUN = [
    "--model.overrides.dim=64",
    "--model.overrides.n_heads=4",
    "--model.overrides.n_kv_heads=2",
    "--model.overrides.head_dim=16",
    "--model.overrides.max_seq_len=64",
    "--training.seq_len=32",
    "--training.local_batch_size=4",
    "--training.global_batch_size=8",
    f"--training.steps={STEPS}",
    "--lr_scheduler.warmup_steps=2",
    "--lr_scheduler.decay_ratio=0",
    "--validation.enable=true",
    f"--validation.freq={STEPS}",
    "--validation.steps=2",
    "--checkpoint.enable=false",
    "--metrics.log_freq=1",
    "--training.num_threads=1",
    "--metrics.enable_tensorboard=false",
]
"""A 4-layer Qwen3 of dim 64 (the debug vocabulary), 10 steps of 8 sequences of 32 tokens,
validation at the end."""
QWEN3 = [
    "--job.config_file=train_configs/qwen3_debug.toml",
    "--model.flavor=debug_untied",
    *RUN,
    "--model.overrides.hidden_dim=128",
]
MOE = [
    "--job.config_file=train_configs/qwen3_moe_debug.toml",
    *RUN,
    "--model.overrides.moe_inter_dim=64",
]
PP2 = ["--parallelism.pipeline_parallel_degree=2"]


def run_worker(tmp: Path, name: str, nproc: int, args: list[str]) -> list[dict]:
    """Every rank's state of one worker launch, its run in ``tmp / name``."""
    return launch(
        WORKER, [*args, f"--job.dump_folder={tmp / name}"], nproc=nproc, timeout=600
    ).results()


def merged(ranks: list[dict], key: str) -> dict[str, torch.Tensor]:
    """The tensors of all ranks by name (ranks of one stage hold the same, gathered)."""
    return {name: value for rank in ranks for name, value in rank[key].items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process: Qwen3 and Qwen3-MoE."""
    tmp = tmp_path_factory.mktemp("pp_ref")
    return {
        "qwen3": run_worker(tmp, "qwen3", 1, QWEN3)[0],
        "moe": run_worker(tmp, "moe", 1, MOE)[0],
    }


def assert_matches_one_process(ranks: list[dict], ref: dict) -> None:
    weights, grads = merged(ranks, "weights"), merged(ranks, "grads")
    assert weights.keys() == ref["weights"].keys() and grads.keys() == ref["grads"].keys()
    for name, value in ref["weights"].items():
        assert torch.equal(weights[name], value), f"{name}: init differs from one process"
    for name, value in ref["grads"].items():
        err = (grads[name] - value).abs().max().item()
        assert err <= 1e-5 * value.abs().max().item(), f"{name}: step-1 gradient off by {err}"
    assert {rank["fingerprint"] for rank in ranks} == {ref["fingerprint"]}
    for rank in ranks:  # every rank holds the loss of the last stage
        assert abs(rank["validation"] / ref["validation"] - 1) < 1e-4
        assert rank["losses"].keys() == ref["losses"].keys()
        assert abs(rank["losses"][1] / ref["losses"][1] - 1) < 1e-5
        for step, loss in ref["losses"].items():
            assert abs(rank["losses"][step] / loss - 1) < 1e-4, (
                f"step {step}: {rank['losses'][step]} vs {loss}"
            )


def test_gpipe_on_pp2_x_dp2_equals_one_process(reference, tmp_path):
    ranks = run_worker(
        tmp_path,
        "gpipe",
        4,
        [
            *QWEN3,
            *PP2,
            "--parallelism.pipeline_parallel_schedule=GPipe",
            "--training.local_batch_size=2",
        ],
    )
    assert [rank["has_last"] for rank in ranks] == [False, False, True, True]
    assert_matches_one_process(ranks, reference["qwen3"])


def test_1f1b_on_pp2_x_tp2_with_sequence_and_loss_parallelism_equals_one_process(
    reference, tmp_path
):
    ranks = run_worker(
        tmp_path, "pp_tp", 4, [*QWEN3, *PP2, "--parallelism.tensor_parallel_degree=2"]
    )
    assert [rank["has_last"] for rank in ranks] == [False, False, True, True]
    assert_matches_one_process(ranks, reference["qwen3"])


def test_interleaved_1f1b_with_two_stages_per_rank_equals_one_process(reference, tmp_path):
    ranks = run_worker(
        tmp_path,
        "interleaved",
        2,
        [*QWEN3, *PP2, "--parallelism.pipeline_parallel_schedule=Interleaved1F1B"],
    )
    assert [rank["has_last"] for rank in ranks] == [False, True]  # stages 0, 2 and 1, 3
    assert_matches_one_process(ranks, reference["qwen3"])


def test_moe_stages_with_their_plain_buffers_equal_one_process(reference, tmp_path):
    """One pipeline micro-batch per local batch: the auxiliary loss sees the batch one process
    sees."""
    ranks = run_worker(
        tmp_path,
        "moe",
        2,
        [
            *MOE,
            *PP2,
            "--parallelism.pipeline_parallel_schedule=GPipe",
            "--parallelism.pipeline_parallel_microbatch_size=4",
        ],
    )
    assert any(name.endswith("tokens_per_expert") for name in ranks[1]["weights"])
    assert_matches_one_process(ranks, reference["moe"])


def test_a_nan_loss_on_the_last_stage_stops_every_rank_before_its_update(tmp_path, monkeypatch):
    monkeypatch.setenv("POISON_STEP", "3")
    ranks = run_worker(
        tmp_path, "nan", 2, [*QWEN3, *PP2, "--parallelism.pipeline_parallel_schedule=GPipe"]
    )
    for rank in ranks:
        assert rank["error"].startswith(
            "step 3: loss nan, gradient norm nan; the update was not applied"
        ), rank["error"]
        assert sorted(rank["losses"]) == [1, 2]


def test_run_train_sh_1f1b_prints_the_one_process_fingerprint_and_losses_on_every_rank(
    reference, tmp_path
):
    proc = run_train(
        [*QWEN3[1:], *PP2, f"--job.dump_folder={tmp_path}"],
        nproc=2,
        timeout=600,
        CONFIG_FILE="train_configs/qwen3_debug.toml",
        LOG_RANK="0,1",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ref = reference["qwen3"]
    for rank in (0, 1):
        lines = [line for line in proc.stdout.splitlines() if line.startswith(f"[rank{rank}]:")]
        assert any(f"fingerprint {ref['fingerprint']}" in line for line in lines), rank
        assert any("pipeline 1F1B: stage " + str(rank) in line for line in lines), rank
        printed = {
            int(s): float(v)
            for s, v in (
                re.search(r"step +(\d+) +loss +(\S+)", line).groups()
                for line in lines
                if re.search(r"step +\d+ +loss ", line)
            )
        }
        assert sorted(printed) == list(range(1, STEPS + 1))
        (validation,) = [
            float(re.search(r"validation loss +(\S+)", line).group(1))
            for line in lines
            if "validation loss" in line
        ]
        assert abs(validation - ref["validation"]) <= 5e-5 + 1e-4 * validation
        for step, loss in printed.items():  # printed with 4 decimals
            assert abs(loss - ref["losses"][step]) <= 5e-5 + 1e-4 * loss, (rank, step, loss)
