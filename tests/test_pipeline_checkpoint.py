"""DCP checkpoints across layouts with pipeline stages: pp2 x dp2 -> 1 process and 1 process -> pp2
x dp2, model and optimizer bitwise equal after load (each stage saves and loads its own FQNs), then
a step trained from them (the optimizer's hyperparameters came back for every parameter), and a pp2
run resumed bitwise."""

from __future__ import annotations

import shutil

import pytest
import torch
from ckpt_helpers import text_file, worker_result

pytestmark = pytest.mark.multiprocess

MODEL = [
    "--model.flavor=debug_untied",
    "--model.overrides.n_layers=2",
    "--model.overrides.dim=64",
    "--model.overrides.n_heads=2",
    "--model.overrides.n_kv_heads=1",
    "--model.overrides.head_dim=32",
    "--model.overrides.hidden_dim=128",
    "--model.overrides.max_seq_len=64",
]
"""A 2-block untied Qwen3 (pipeline stages need untied embeddings)."""
RUN = [
    "--training.seq_len=32",
    "--training.local_batch_size=2",
    "--training.global_batch_size=4",
    "--training.steps=2",
    "--lr_scheduler.warmup_steps=1",
    "--validation.enable=false",
    "--training.num_threads=1",
    "--metrics.enable_tensorboard=false",
    "--metrics.log_freq=1",
    "--checkpoint.enable=true",
    "--checkpoint.interval=2",
]
PP2_DP2 = [
    "--parallelism.pipeline_parallel_degree=2",
    "--parallelism.pipeline_parallel_schedule=GPipe",
]
# 25 model entries (2 blocks of 11, embedding, norm, output); AdamW step, exp_avg, exp_avg_sq of
# each
EQUAL = {"model_equal": True, "optim_equal": True, "n_model": 25, "n_optim": 75, "loaded_step": 2}


def saved_run(tmp_path, nproc: int, layout: list[str], steps: int = 2) -> dict:
    """Train ``steps`` steps (checkpoint at step 2) with ``layout``; the worker's result."""
    data = text_file(tmp_path)
    return worker_result(
        nproc,
        [
            "train",
            str(tmp_path / "a.pt"),
            *MODEL,
            *RUN,
            f"--training.dataset_path={data}",
            *layout,
            f"--training.steps={steps}",
            f"--job.dump_folder={tmp_path / 'a'}",
        ],
        timeout=600,
    )


@pytest.mark.parametrize(
    "saved_by, loaded_by",
    [((4, PP2_DP2), (1, [])), ((1, []), (4, PP2_DP2))],
    ids=["pp2_x_dp2_to_1", "1_to_pp2_x_dp2"],
)
def test_checkpoint_loads_bitwise_into_another_layout_and_trains_on(tmp_path, saved_by, loaded_by):
    (save_n, save_layout), (load_n, load_layout) = saved_by, loaded_by
    assert saved_run(tmp_path, save_n, save_layout)["steps"] == [2]
    step2 = tmp_path / "a" / "checkpoint" / "step-2"
    loaded = worker_result(
        load_n,
        [
            "resume",
            str(tmp_path / "a.pt"),
            *MODEL,
            *RUN,
            *load_layout,
            f"--training.dataset_path={tmp_path / 'data.txt'}",
            "--training.steps=3",
            f"--job.dump_folder={tmp_path / 'b'}",
            f"--checkpoint.load_path={step2}",
        ],
        timeout=600,
    )
    assert {key: loaded[key] for key in EQUAL} == EQUAL
    assert list(loaded["losses"]) == ["3"] and 0 < float.fromhex(loaded["losses"]["3"]) < 10


def test_pp2_run_resumed_from_its_step_2_equals_the_uninterrupted_run_bitwise(tmp_path):
    layout = [
        "--parallelism.pipeline_parallel_degree=2",
        "--parallelism.pipeline_parallel_schedule=GPipe",
    ]
    reference = saved_run(tmp_path, 2, layout, steps=4)
    (tmp_path / "b" / "checkpoint").mkdir(parents=True)
    shutil.copytree(
        tmp_path / "a" / "checkpoint" / "step-2", tmp_path / "b" / "checkpoint" / "step-2"
    )
    resumed = worker_result(
        2,
        [
            "train",
            str(tmp_path / "b.pt"),
            *MODEL,
            *RUN,
            *layout,
            "--training.steps=4",
            f"--training.dataset_path={tmp_path / 'data.txt'}",
            f"--job.dump_folder={tmp_path / 'b'}",
        ],
        timeout=600,
    )
    assert resumed["losses"] == {k: reference["losses"][k] for k in ("3", "4")}
    final_a, final_b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    for part in ("model", "optim"):
        assert final_a[part].keys() == final_b[part].keys()
        assert all(torch.equal(final_a[part][k], final_b[part][k]) for k in final_a[part]), part
