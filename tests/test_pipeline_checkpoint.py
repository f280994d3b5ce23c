"""DCP checkpoints across layouts with pipeline stages: pp2 x dp2 -> 1 process and 1 process -> pp2 x dp2, model
and optimizer bitwise equal after load (each stage saves and loads its own FQNs)."""

from __future__ import annotations

import pytest
from ckpt_helpers import result, text_file, torchrun

pytestmark = pytest.mark.multiprocess

MODEL = ["--model.flavor=debug_untied", "--model.overrides.n_layers=2", "--model.overrides.dim=64",
         "--model.overrides.n_heads=2", "--model.overrides.n_kv_heads=1", "--model.overrides.head_dim=32",
         "--model.overrides.hidden_dim=128", "--model.overrides.max_seq_len=64"]
"""A 2-block untied Qwen3 (pipeline stages need untied embeddings)."""
RUN = ["--training.seq_len=32", "--training.local_batch_size=2", "--training.global_batch_size=4", "--training.steps=2",
       "--lr_scheduler.warmup_steps=1", "--validation.enable=false", "--training.num_threads=1",
       "--metrics.enable_tensorboard=false", "--metrics.log_freq=1", "--checkpoint.enable=true",
       "--checkpoint.interval=2"]
PP2_DP2 = ["--parallelism.pipeline_parallel_degree=2", "--parallelism.pipeline_parallel_schedule=GPipe"]
# 25 model entries (2 blocks of 11, embedding, norm, output); AdamW step, exp_avg, exp_avg_sq of each
EQUAL = {"model_equal": True, "optim_equal": True, "n_model": 25, "n_optim": 75, "loaded_step": 2}


@pytest.mark.parametrize("saved_by, loaded_by", [((4, PP2_DP2), (1, [])), ((1, []), (4, PP2_DP2))],
                         ids=["pp2_x_dp2_to_1", "1_to_pp2_x_dp2"])
def test_checkpoint_loads_bitwise_into_another_layout(tmp_path, saved_by, loaded_by):
    data = text_file(tmp_path)
    common = [*MODEL, *RUN, f"--training.dataset_path={data}"]
    (save_n, save_layout), (load_n, load_layout) = saved_by, loaded_by
    saved = result(torchrun(save_n, ["train", str(tmp_path / "a.pt"), *common, *save_layout,
                                     f"--job.dump_folder={tmp_path / 'a'}"], timeout=600))
    assert saved["steps"] == [2]
    step2 = tmp_path / "a" / "checkpoint" / "step-2"
    loaded = result(torchrun(load_n, ["gather", str(tmp_path / "a.pt"), *common, *load_layout,
                                      f"--job.dump_folder={tmp_path / 'b'}", f"--checkpoint.load_path={step2}"],
                             timeout=600))
    assert loaded == EQUAL
