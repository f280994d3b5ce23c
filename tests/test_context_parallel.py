"""Context parallelism in one process: the load-balanced split, attention of a chunk whose queries
sit at later positions than its first key (blockwise forward and backward, flex forward), the
degrees, the memory estimate, and the settings refused before launch (one config line each)."""

from __future__ import annotations

import pytest
import torch

from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.distributed.context_parallel import chunk_positions, split_sequence
from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.errors import LaunchError
from torchtitan_lite.models.common.blockwise import block_attention
from torchtitan_lite.models.common.flex import flex_attention_op
from torchtitan_lite.models.common.sink_attention import sink_attention
from torchtitan_lite.preflight.checks import load_run
from torchtitan_lite.preflight.memory import estimate_rank_memory

CP2 = "--parallelism.context_parallel_degree=2"


def test_rank_r_holds_chunks_r_and_2cp_minus_1_minus_r():
    assert chunk_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert chunk_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert chunk_positions(16, 4, 3).tolist() == [6, 7, 8, 9]
    every = torch.cat([chunk_positions(24, 3, r) for r in range(3)])
    assert sorted(every.tolist()) == list(range(24))
    t = torch.arange(32).view(2, 16)
    assert split_sequence(t, 2, 1).tolist() == [list(range(4, 12)), list(range(20, 28))]


def test_equal_causal_work_per_rank():
    """Keys visible to a rank's queries (causal): the same count on every rank."""
    work = [sum(p + 1 for p in chunk_positions(64, 4, r).tolist()) for r in range(4)]
    assert len(set(work)) == 1


def test_a_seq_len_that_does_not_split_is_refused():
    with pytest.raises(ValueError, match=r"seq_len 30 is not a multiple of 2 x cp = 4"):
        chunk_positions(30, 2, 0)


def _qkv(seqlen, n_heads=4, n_kv_heads=2, head_dim=8, bs=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(bs, seqlen, h, head_dim, generator=g).requires_grad_()
        for h in (n_heads, n_kv_heads, n_kv_heads)
    ]


@pytest.mark.parametrize(
    "window, documents, sinks",
    [(None, False, False), (5, False, True), (None, True, False), (40, True, True)],
)
def test_a_chunk_at_an_offset_equals_the_rows_of_the_whole_window(window, documents, sinks):
    seqlen, start = 48, 20
    q, k, v = _qkv(seqlen)
    sink = torch.randn(4).requires_grad_() if sinks else None
    ids = torch.tensor([[0] * 13 + [1] * 20 + [2] * 15, [0] * 30 + [1] * 18]) if documents else None
    inputs = [q, k, v] + ([sink] if sinks else [])
    kw = dict(sinks=sink, sliding_window=window, document_ids=ids, block_size=16)
    whole = block_attention(q, k, v, **kw)
    grads_whole = torch.autograd.grad(whole[:, start:].square().sum(), inputs)
    part = block_attention(q[:, start:], k, v, q_start=start, **kw)
    grads_part = torch.autograd.grad(part.square().sum(), inputs)
    torch.testing.assert_close(part, whole[:, start:], atol=1e-6, rtol=1e-6)
    for a, b in zip(
        grads_part, grads_whole, strict=True
    ):  # q (zero before start), k, v (and sinks)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)  # the tiles start at another row
    reference = sink_attention(q, k, v, sink, sliding_window=window, document_ids=ids)
    torch.testing.assert_close(part, reference[:, start:], atol=1e-5, rtol=1e-5)


def test_flex_with_an_offset_equals_the_reference_rows():
    q, k, v = (t.detach() for t in _qkv(40))  # flex has no CPU backward
    ids = torch.tensor([[0] * 17 + [1] * 23, [0] * 5 + [1] * 35])
    part = flex_attention_op(q[:, 24:], k, v, sliding_window=9, document_ids=ids, q_start=24)
    reference = sink_attention(q, k, v, None, sliding_window=9, document_ids=ids)
    torch.testing.assert_close(part, reference[:, 24:], atol=1e-5, rtol=1e-5)


def test_the_cp_degree_counts_in_the_world_size_and_lends_ranks_to_experts():
    dims = ParallelDims(tp=2, cp=2, world_size=8)
    assert (dims.dp_shard, dims.cp, dims.dp_degree, dims.loss_degree) == (2, 2, 2, 4)
    assert ParallelDims(dp_shard=1, cp=4, ep=4, world_size=4).ep == 4  # from dp_shard x cp x tp
    message = (
        r"data_parallel_shard_degree 2 \* context_parallel_degree 2 \* "
        r"tensor_parallel_degree 1 \* pipeline_parallel_degree 1 = 4, not the world size 6"
    )
    with pytest.raises(LaunchError, match=message):
        ParallelDims(dp_shard=2, cp=2, world_size=6)
    with pytest.raises(ValueError, match=r"context_parallel_degree must be >= 1, got 0"):
        ParallelDims(cp=0, world_size=2)


KEY = r"parallelism.context_parallel_degree \(command line\): "


@pytest.mark.parametrize(
    "cli, world_size, message",
    [
        (
            [CP2, "--training.seq_len=30"],
            None,
            KEY
            + r"training.seq_len 30 is not a multiple of 2 x 2 \(each window is cut into 4 equal "
            r"chunks\); pick a seq_len that is$",
        ),
        (
            [
                CP2,
                "--parallelism.tensor_parallel_degree=4",
                "--training.seq_len=20",
                "--model.overrides.n_kv_heads=4",
            ],
            None,
            KEY + r"each rank's 10 positions \(training.seq_len 20 / 2\) are not a multiple of "
            r"tensor_parallel_degree 4 \(sequence parallelism splits them\); pick a seq_len that "
            r"is a multiple of 8$",
        ),
        (
            [CP2, "--parallelism.pipeline_parallel_degree=2"],
            None,
            KEY + r"2 is not implemented with pipeline_parallel_degree 2 ",
        ),
        (
            [
                CP2,
                "--job.config_file=train_configs/deepseek_v3_debug.toml",
                "--model.overrides.mtp_num_layers=1",
            ],
            None,
            KEY + r"2 is not implemented with multi-token prediction",
        ),
        (
            [CP2, "--parallelism.data_parallel_shard_degree=2"],
            2,
            r"\[parallelism\] for world size 2 \(NGPU x nodes\): .*data_parallel_shard_degree 2 \* "
            r"context_parallel_degree 2 \* .* = 4, not the world size 2",
        ),
        (
            [CP2, "--training.deterministic=layout"],
            2,
            r"training.deterministic = \"layout\" covers data parallelism only, but "
            r"parallelism.context_parallel_degree = 2",
        ),
    ],
)
def test_settings_context_parallelism_cannot_run_are_one_config_line(
    tmp_path, cli, world_size, message
):
    with pytest.raises(ConfigError, match=f"^{message}") as err:
        load_run(["--training.device=cpu", f"--job.dump_folder={tmp_path}", *cli], world_size)
    assert "\n" not in str(err.value)


def test_the_memory_estimate_divides_the_positions_and_adds_the_gathered_keys_and_values():
    class Args:
        dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size = 1024, 4, 8, 2, 128, 1000

    kw = dict(world_size=4, seq_len=512, local_batch_size=2, compute_bytes=2, ac_mode="none")
    est = estimate_rank_memory(10**9, Args, cp=2, **kw)
    block = 256 * 2 * 1024 * 34  # s / cp positions
    kv = 512 * 2 * (2 * 2 * 128) * 2  # the whole window's keys and values
    logits = 2 * 256 * 2 * 1000 * 4
    assert est.states == 4 * 10**9 and est.activations == int(4 * (block + kv) + logits)
    full = estimate_rank_memory(10**9, Args, cp=2, **{**kw, "ac_mode": "full"})
    assert full.activations == int(4 * 256 * 2 * 1024 * 2 + block + kv + logits)
