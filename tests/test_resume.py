"""Exact resume and resharding on 2-process gloo (the Acceptance of issue 6).

One 2-rank run of 4 steps (checkpoints at steps 2 and 4, odd vocab 2051 so every Shard(0) split is
uneven) is the reference; a second 2-rank run starts from a copy of its step-2 checkpoint, and so
does a 1-rank run (same global batch, same data position); 1- and 3-rank runs load its step-4
checkpoint. A streaming 2-rank checkpoint is refused on 1 rank.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from ckpt_helpers import TINY_MODEL, TINY_RUN, text_file, worker_result
from dist_helpers import run_train

pytestmark = pytest.mark.multiprocess


def run_args(tmp, dump: str, out: str, *extra: str) -> list[str]:
    return [
        out,
        *TINY_MODEL,
        *TINY_RUN,
        "--model.overrides.vocab_size=2051",
        f"--training.dataset_path={tmp / 'data.txt'}",
        f"--job.dump_folder={tmp / dump}",
        "--checkpoint.interval=2",
        "--checkpoint.keep_latest_k=0",
        *extra,
    ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The 2-rank, 4-step reference run: its folder and the worker's result."""
    tmp = tmp_path_factory.mktemp("resume")
    text_file(tmp)
    res = worker_result(2, ["train", *run_args(tmp, "a", str(tmp / "a.pt"))])
    return tmp, res


def test_two_plus_two_steps_equal_four_steps_bitwise(reference):
    tmp, ref = reference
    assert ref["steps"] == [2, 4]
    (tmp / "b" / "checkpoint").mkdir(parents=True)
    shutil.copytree(tmp / "a" / "checkpoint" / "step-2", tmp / "b" / "checkpoint" / "step-2")
    resumed = worker_result(2, ["train", *run_args(tmp, "b", str(tmp / "b.pt"))])
    assert sorted(resumed["losses"]) == ["3", "4"]
    assert resumed["losses"] == {k: ref["losses"][k] for k in ("3", "4")}
    final_a, final_b = torch.load(tmp / "a.pt"), torch.load(tmp / "b.pt")
    for part in ("model", "optim"):
        assert final_a[part].keys() == final_b[part].keys()
        assert all(torch.equal(final_a[part][k], final_b[part][k]) for k in final_a[part])


@pytest.mark.parametrize("nproc", [1, 3])
def test_reshard_from_two_ranks_gathers_bitwise_equal(reference, nproc):
    tmp, _ = reference
    step4 = tmp / "a" / "checkpoint" / "step-4"
    res = worker_result(
        nproc,
        [
            "gather",
            *run_args(
                tmp,
                f"r{nproc}",
                str(tmp / "a.pt"),
                f"--checkpoint.load_path={step4}",
                "--checkpoint.exclude_from_loading=dataloader",
            ),
        ],
    )
    # 14 model entries (13 tensors, the tied output listed twice); AdamW step, exp_avg, exp_avg_sq
    # of each tensor
    assert res == {
        "model_equal": True,
        "optim_equal": True,
        "n_model": 14,
        "n_optim": 39,
        "loaded_step": 4,
    }


def test_other_world_size_resumes_at_the_same_data_position(reference):
    # 1 rank from the 2-rank step-2 checkpoint, same global batch (2 micro-batches of 2): steps 3
    # and 4 train
    # on the reference's windows, so the losses match up to the reduction order (1 rank vs 2 FSDP
    # ranks).
    tmp, ref = reference
    (tmp / "c" / "checkpoint").mkdir(parents=True)
    shutil.copytree(tmp / "a" / "checkpoint" / "step-2", tmp / "c" / "checkpoint" / "step-2")
    resumed = worker_result(
        1, ["train", *run_args(tmp, "c", str(tmp / "c.pt"), "--training.global_batch_size=4")]
    )
    assert sorted(resumed["losses"]) == ["3", "4"]
    for step in ("3", "4"):
        assert float.fromhex(resumed["losses"][step]) == pytest.approx(
            float.fromhex(ref["losses"][step]), abs=1e-4
        )


def test_other_world_size_with_streaming_dataloader_state_is_refused_before_launch(reference):
    tmp, _ = reference
    data = tmp / "data.jsonl"
    paragraphs = (
        (tmp / "data.txt").read_text(encoding="utf-8").split("\n\n")
    )  # documents: each rank reads every 2nd
    data.write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs), encoding="utf-8")
    streaming = [
        f"--training.dataset_path={data}",
        "--training.streaming=true",
        "--training.steps=2",
    ]
    worker_result(2, ["train", *run_args(tmp, "s", str(tmp / "s.pt"), *streaming)])
    step2 = tmp / "s" / "checkpoint" / "step-2"
    args = run_args(tmp, "w", "unused", f"--checkpoint.load_path={step2}", *streaming)[1:]
    proc = run_train(args)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("config error: checkpoint ")
        and "saved by 2 data-parallel ranks and this run has 1" in last
    )
    assert (
        "streaming dataset is per data-parallel rank" in last
        and "--checkpoint.exclude_from_loading=dataloader" in last
    )
    assert not (tmp / "w").exists()
