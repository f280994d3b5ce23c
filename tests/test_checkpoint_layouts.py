"""Checkpoints across parallel layouts (issue 13 item 6, issue 14 item 5): a DCP checkpoint saved
with one layout resumes with another, model, optimizer and buffers (MoE expert biases and loads)
bitwise equal after the load, at the exact data position.

A chain of runs in one checkpoint folder, 2 steps each: 4-way FSDP (steps 1-2) -> FSDP 2 x TP 2
(3-4) -> HSDP, replicate 2 x shard 2 (5-6) -> one process (7-8). Each run gathers the state it
loaded and compares it bitwise with the state the previous run ended with; the RNG states are left
out (another layout); the losses of all 8 steps equal those of one uninterrupted process up to the
reduction order (1e-5 relative): the same windows were read. The same for a 2-block DeepSeek-V3 (a
dense and an MoE block, expert biases moving) under expert parallelism: ep2 on 2 ranks (steps 1-2)
-> ep4 on 4 ranks (3-4) -> one process (5-6).
"""

from __future__ import annotations

import pytest
from ckpt_helpers import TINY_RUN, text_file, worker_result

pytestmark = pytest.mark.multiprocess

MODEL = [
    "--model.overrides.n_layers=1",
    "--model.overrides.dim=64",
    "--model.overrides.n_heads=4",
    "--model.overrides.n_kv_heads=2",
    "--model.overrides.head_dim=16",
    "--model.overrides.hidden_dim=128",
    "--model.overrides.max_seq_len=64",
]
"""A 1-block Qwen3 whose heads, key/value heads and vocabulary (2048) split in two."""
CHAIN = [  # (processes, layout, last step)
    (4, [], 2),
    (4, ["--parallelism.tensor_parallel_degree=2"], 4),
    (4, ["--parallelism.data_parallel_replicate_degree=2"], 6),
    (1, [], 8),
]
EP_MODEL = [
    "--job.config_file",
    "train_configs/deepseek_v3_debug.toml",
    "--model.overrides.n_layers=2",
    "--training.compute_dtype=float32",
]
EP_CHAIN = [
    (2, ["--parallelism.expert_parallel_degree=2"], 2),
    (4, ["--parallelism.expert_parallel_degree=4"], 4),
    (1, [], 6),
]


@pytest.mark.parametrize(
    ("model", "chain"), [(MODEL, CHAIN), (EP_MODEL, EP_CHAIN)], ids=["fsdp_tp_hsdp", "ep"]
)
def test_a_checkpoint_resumes_bitwise_across_layouts_at_the_same_data_position(
    tmp_path, model, chain
):
    text_file(tmp_path)
    total = chain[-1][2]
    common = [
        *model,
        *TINY_RUN,
        "--training.global_batch_size=8",
        f"--training.dataset_path={tmp_path / 'data.txt'}",
        "--checkpoint.interval=2",
        "--checkpoint.keep_latest_k=0",
        "--lr_scheduler.decay_ratio=0",
    ]  # the same
    # learning rates whatever training.steps is
    reference = worker_result(
        1,
        [
            "train",
            str(tmp_path / "ref.pt"),
            *common,
            f"--training.steps={total}",
            f"--job.dump_folder={tmp_path / 'ref'}",
        ],
    )
    state, losses = str(tmp_path / "state.pt"), {}
    for i, (nproc, layout, steps) in enumerate(chain):
        args = [
            state,
            *common,
            *layout,
            f"--training.steps={steps}",
            f"--job.dump_folder={tmp_path / 'chain'}",
        ]
        res = worker_result(nproc, ["resume" if i else "train", *args], timeout=600)
        if i:
            assert (res["model_equal"], res["optim_equal"], res["loaded_step"]) == (
                True,
                True,
                steps - 2,
            ), (i, res)
            assert res["load_lines"][0].endswith("not loaded: rng"), res["load_lines"]
        assert res["steps"] == list(range(2, steps + 1, 2))
        losses.update(res["losses"])
    assert sorted(losses, key=int) == [str(step) for step in range(1, total + 1)]
    for step, loss in losses.items():
        assert float.fromhex(loss) == pytest.approx(
            float.fromhex(reference["losses"][step]), rel=1e-5
        ), step
