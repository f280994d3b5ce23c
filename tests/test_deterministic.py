"""training.deterministic (issue 25): the canonical pairwise tree, the aligned micro-batch blocks,
the refusals, and the acceptance runs through ``./run_train.sh``.

Acceptance (``layout``): for the qwen3 and qwen3_moe debug configs (1 block, seq_len 32,
micro-batches of 1 window, global batch 4, 20 steps, fp32, one thread per rank), 1 process, dp_shard
2, dp_shard 4 and dp_replicate 2 x dp_shard 2 give bitwise the same loss and gradient norm at every
step (``compare_runs --assert-equal``: max |diff| 0), bitwise the same validation losses (steps 10
and 20, 2 global batches each) and bitwise the same final parameters and AdamW moments. ``run``: two
runs of dp_shard 2 are bitwise equal.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from ckpt_helpers import text_file
from dist_helpers import run_train
from layout_helpers import LAYOUTS, assert_equal_curves, final_state, run_folder, train

from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.data.streams import rank_chunk
from torchtitan_lite.distributed.checks import check_world_size
from torchtitan_lite.distributed.deterministic import PairwiseSum
from torchtitan_lite.preflight.checks import parse_args

STEPS = 20
RUN = [
    "--model.overrides.n_layers=1",
    "--training.seq_len=32",
    "--training.local_batch_size=1",
    "--training.global_batch_size=4",
    f"--training.steps={STEPS}",
    "--lr_scheduler.warmup_steps=2",
    "--validation.enable=false",
    "--training.num_threads=1",
    "--metrics.log_freq=1",
    "--training.compute_dtype=float32",
    "--checkpoint.enable=true",
    "--checkpoint.interval=1000",
]
"""Four micro-batches of one 32-token window per step: 4 per rank on 1 process, 2 on dp_shard 2, 1
on 4 ranks."""


def test_pairwise_sum_of_aligned_blocks_is_the_sum_of_their_items_bitwise():
    items = [
        torch.randn(5, generator=torch.Generator().manual_seed(i)) * 10.0 ** (i % 7)
        for i in range(8)
    ]
    one = PairwiseSum()
    for item in items:
        one.push(item)
    expected = ((items[0] + items[1]) + (items[2] + items[3])) + (
        (items[4] + items[5]) + (items[6] + items[7])
    )
    total = one.finish()
    assert torch.equal(total, expected)
    assert not torch.equal(total, sum(items[1:], items[0]))  # a left fold rounds otherwise
    for block in (2, 4, 8):
        blocks = PairwiseSum()
        for start in range(0, 8, block):
            inner = PairwiseSum()
            for item in items[start : start + block]:
                inner.push(item)
            blocks.push(inner.finish(), level=block.bit_length() - 1)
        assert torch.equal(blocks.finish(), expected)


def test_pairwise_sum_refuses_a_block_that_is_not_aligned():
    total = PairwiseSum()
    total.push(torch.ones(1))
    with pytest.raises(ValueError, match="2\\*\\*1 items"):
        total.push(torch.ones(1), level=1)


def test_ranks_take_aligned_blocks_of_consecutive_micro_batches():
    taken = {rank: [rank_chunk(c, rank, 2, rank_block=2) for c in range(4)] for rank in range(2)}
    assert taken == {0: [0, 1, 4, 5], 1: [2, 3, 6, 7]}
    assert [rank_chunk(c, 1, 3) for c in range(3)] == [
        1,
        4,
        7,
    ]  # rank_block 1: interleaved, as before


def test_sharded_foreach_adamw_updates_each_element_as_unsharded():
    """Why layout mode runs AdamW foreach: each element's update must not depend on where its shard
    ends."""
    generator = torch.Generator().manual_seed(0)
    weights, grads = torch.randn(1037, generator=generator), torch.randn(1037, generator=generator)

    def trained(sizes: list[int]) -> torch.Tensor:
        params = [torch.nn.Parameter(w.clone()) for w in weights.split(sizes)]
        optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=True)
        for step in range(1, 4):
            for param, grad in zip(params, (grads * step).split(sizes), strict=True):
                param.grad = grad.clone()
            optimizer.step()
        return torch.cat([p.detach() for p in params])

    whole = trained([1037])
    assert torch.equal(trained([519, 518]), whole)
    assert torch.equal(trained([260, 260, 260, 257]), whole)


def _train(tmp_path: Path, name: str, config: str, nproc: int, options: list[str]) -> Path:
    return train(tmp_path, name, config, nproc, [*RUN, *options])


def test_layout_mode_refuses_tensor_parallelism_with_one_config_error_line_and_exit_2(tmp_path):
    proc = run_train(
        [
            *RUN,
            "--training.deterministic=layout",
            f"--job.dump_folder={tmp_path}",
            "--parallelism.tensor_parallel_degree=2",
        ],
        nproc=2,
        timeout=120,
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("config error:")]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert (
        "covers data parallelism only, but parallelism.tensor_parallel_degree = 2; set it to 1"
        in errors[0]
    )


@pytest.mark.parametrize(
    ("options", "world_size", "message"),
    [
        (["--training.global_batch_size=6"], 2, "3 micro-batches per data-parallel rank"),
        (
            ["--training.streaming=true", "--training.dataset=hf", "--training.hf_dataset_name=x"],
            1,
            "training.streaming = true reads per rank",
        ),
        (["--optimizer.implementation=fused"], 1, 'optimizer.implementation = "fused"'),
        (
            [
                "--parallelism.data_parallel_replicate_degree=2",
                "--parallelism.data_parallel_shard_degree=1",
            ],
            2,
            "pure replication",
        ),
    ],
)
def test_layout_mode_refuses_what_it_cannot_hold(options, world_size, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_world_size(
            parse_args([*RUN, "--training.deterministic=layout", *options]), world_size
        )


@pytest.mark.multiprocess
@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])
def test_layout_mode_trains_bitwise_the_same_on_every_data_parallel_layout(tmp_path, family):
    text_file(tmp_path)
    config = f"train_configs/{family}_debug.toml"
    # the default thread count of layout mode (1) instead of RUN's; validation of 2 global batches
    # at steps 10, 20
    run = [option for option in RUN if option != "--training.num_threads=1"] + [
        "--validation.enable=true",
        "--validation.freq=10",
        "--validation.steps=2",
    ]
    dumps = {
        name: train(
            tmp_path, name, config, nproc, [*run, *options, "--training.deterministic=layout"]
        )
        for name, (nproc, options) in LAYOUTS.items()
    }
    reference = final_state(dumps["1"], STEPS)
    assert any(key.startswith("model.layers.0.moe") for key in reference) == (family == "qwen3_moe")
    for name in list(LAYOUTS)[1:]:
        assert_equal_curves(dumps["1"], dumps[name], STEPS)
        assert_equal_curves(dumps["1"], dumps[name], STEPS, tags=("loss/validation",), at=(10, 20))
        final = final_state(dumps[name], STEPS)
        assert final.keys() == reference.keys()
        assert [key for key in reference if not torch.equal(final[key], reference[key])] == [], name


@pytest.mark.multiprocess
def test_run_mode_trains_bitwise_the_same_twice_on_one_layout(tmp_path):
    text_file(tmp_path)
    first, second = (
        _train(
            tmp_path, name, "train_configs/qwen3_debug.toml", 2, ["--training.deterministic=run"]
        )
        for name in ("first", "second")
    )
    assert_equal_curves(first, second, STEPS)
    reference = final_state(first, STEPS)
    assert [
        key
        for key, value in final_state(second, STEPS).items()
        if not torch.equal(value, reference[key])
    ] == []


VALIDATION_LINE = re.compile(r"^step +(\d+) +validation loss +([\d.]+) +\(([\d,]+) tokens\)$", re.M)


@pytest.mark.multiprocess
def test_off_mode_validation_scores_the_same_windows_on_1_and_2_processes_within_rounding(tmp_path):
    """The default mode (``off``): validation reads the same global batches on every layout, so 1
    process and dp_shard 2 score the same tokens and their losses differ only by the rounding of two
    training steps."""
    text_file(tmp_path)
    run = [
        option
        for option in RUN
        if not option.startswith(
            ("--training.steps", "--lr_scheduler", "--validation", "--checkpoint")
        )
    ] + [
        "--training.steps=2",
        "--validation.enable=true",
        "--validation.freq=1",
        "--validation.steps=2",
    ]
    lines = {}
    for name, nproc in (("1", 1), ("dp_shard2", 2)):
        log = (
            Path(run_folder(train(tmp_path, name, "train_configs/qwen3_debug.toml", nproc, run)))
            / "logs/rank0.log"
        )
        lines[name] = [
            (int(step), float(loss), tokens)
            for step, loss, tokens in VALIDATION_LINE.findall(log.read_text())
        ]
    assert [(step, tokens) for step, _, tokens in lines["1"]] == [
        (1, "256"),
        (2, "256"),
    ]  # 2 batches x 4 x 32
    assert [(step, tokens) for step, _, tokens in lines["dp_shard2"]] == [(1, "256"), (2, "256")]
    assert all(
        abs(one - two) < 1e-4
        for (_, one, _), (_, two, _) in zip(lines["1"], lines["dp_shard2"], strict=False)
    ), lines
