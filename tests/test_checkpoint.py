"""Checkpoint folders: atomic saves (SIGKILL mid-save), keep_latest_k, async saves, discovery, and
one test per bad input (exit 2 before torchrun, one line naming the culprit, nothing on disk
modified)."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess

import pytest
import torch
from ckpt_helpers import WORKER, text_file, tiny_job, tree_digest, worker_result
from dist_helpers import launch, run_train
from model_helpers import train_to_the_end
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from torchtitan_lite.components.checkpoint import checkpointer, storage
from torchtitan_lite.preflight.checks import load_run_or_exit, parse_run
from torchtitan_lite.train import Trainer


def argv(tmp, dump: str = "out", *extra: str) -> list[str]:
    return tiny_job(tmp, "--checkpoint.interval=2", *extra, dump=dump)


def train_in_process(tmp, *args: str) -> Trainer:
    """Run the Trainer of ``argv(tmp, *args)`` to the end in this process (1 rank)."""
    if not (tmp / "data.txt").exists():
        text_file(tmp, n_plays=1)
    return train_to_the_end(parse_run(argv(tmp, *args)))


def test_sigkill_before_rename_leaves_the_previous_checkpoint_and_the_next_run_resumes_from_it(
    tmp_path,
):
    text_file(tmp_path, n_plays=1)
    killed = launch(
        WORKER, ["kill_before_rename", str(tmp_path / "x.pt"), *argv(tmp_path)]
    )  # one plain process
    assert killed.proc.returncode == -9 and killed.written == {}
    folder = tmp_path / "out" / "checkpoint"
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "step-2", "step-4.tmp"]
    assert (folder / "step-4.tmp" / ".metadata").is_file() and not (
        folder / "step-4.tmp" / "meta.json"
    ).exists()
    assert storage.complete_steps(str(folder)) == [2]
    resumed = worker_result(None, ["train", str(tmp_path / "y.pt"), *argv(tmp_path)])
    assert sorted(resumed["losses"]) == ["3", "4"] and resumed["steps"] == [2, 4]
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "step-2", "step-4"]


def test_discovery_accepts_only_complete_step_folders(tmp_path):
    for name in ("step-3", "step-10", "step-12.tmp", "step-x", "step-11"):
        (tmp_path / name).mkdir()
    for name in ("step-3", "step-10", "step-12.tmp", "step-x"):
        (tmp_path / name / storage.META_FILE).write_text("{}")
    assert storage.complete_steps(str(tmp_path)) == [3, 10]
    assert storage.find_checkpoint(str(tmp_path)) == str(tmp_path / "step-10")
    assert storage.find_checkpoint(str(tmp_path / "none")) is None
    with pytest.raises(
        storage.CheckpointError, match=r"no complete checkpoint step-11 .*complete: step-3, step-10"
    ):
        storage.find_checkpoint(str(tmp_path), load_step=11)


def test_keep_latest_k_keeps_the_newest_complete_checkpoints(tmp_path):
    trainer = train_in_process(
        tmp_path, "out", "--checkpoint.interval=1", "--checkpoint.keep_latest_k=2"
    )
    assert storage.complete_steps(str(tmp_path / "out" / "checkpoint")) == [3, 4]
    assert trainer.train_state == checkpointer.TrainState(
        step=4, tokens_seen=4 * 2 * 32, skipped_steps=0
    )


def test_async_saves_equal_sync_saves_bitwise(tmp_path):
    train_in_process(tmp_path, "sync", "--checkpoint.keep_latest_k=0")
    train_in_process(
        tmp_path, "async", "--checkpoint.keep_latest_k=0", "--checkpoint.async_mode=async"
    )
    for step in (2, 4):
        states = []
        for mode in ("sync", "async"):
            dcp_to_torch_save(
                tmp_path / mode / "checkpoint" / f"step-{step}", tmp_path / f"{mode}{step}.pt"
            )
            states.append(torch.load(tmp_path / f"{mode}{step}.pt", weights_only=False))
        sync, asynchronous = states
        for part in ("model", "optimizer"):
            flat_sync = dict(_tensors(sync[part]))
            assert flat_sync and flat_sync.keys() == dict(_tensors(asynchronous[part])).keys()
            assert all(
                torch.equal(v, dict(_tensors(asynchronous[part]))[k]) for k, v in flat_sync.items()
            )
        assert (
            sync["train_state"]
            == asynchronous["train_state"]
            == {"step": step, "tokens_seen": step * 64, "skipped_steps": 0}
        )


def _tensors(tree, prefix: str = ""):
    """``(dotted key, tensor)`` of every tensor in a nested dict/list."""
    items = (
        tree.items()
        if isinstance(tree, dict)
        else enumerate(tree)
        if isinstance(tree, list)
        else ()
    )
    for key, value in items:
        if isinstance(value, torch.Tensor):
            yield f"{prefix}{key}", value
        else:
            yield from _tensors(value, f"{prefix}{key}.")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A folder with a 2-step run: ``out/checkpoint/step-2``."""
    tmp = tmp_path_factory.mktemp("saved")
    train_in_process(tmp, "out", "--training.steps=2", "--lr_scheduler.warmup_steps=1")
    return tmp


def preflight(*args: str) -> subprocess.CompletedProcess:
    """The exit status and output of ``python -m torchtitan_lite.preflight args`` (what run_train.sh
    runs before torchrun: :func:`load_run_or_exit`), run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            load_run_or_exit(list(args))
            code = 0
        except SystemExit as done:
            code = done.code
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def corrupt_truncate(step):
    shard = step / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    return (
        r"checkpoint file .*step-2/__0_0.distcp is 100 bytes, expected \d+ \(truncated or "
        r"overwritten\)"
    )


def corrupt_meta(step):
    (step / storage.META_FILE).write_text("{not json")
    return r"checkpoint .*step-2/meta.json is corrupt"


def corrupt_metadata(step):
    (step / ".metadata").unlink()
    return r"checkpoint file .*step-2/.metadata is missing \(deleted\)"


@pytest.mark.parametrize("corrupt", [corrupt_truncate, corrupt_meta, corrupt_metadata])
def test_corrupt_checkpoint_exits_2_naming_the_file_and_changes_nothing(saved, tmp_path, corrupt):
    shutil.copytree(saved / "out", tmp_path / "out")
    pattern = corrupt(tmp_path / "out" / "checkpoint" / "step-2")
    before = tree_digest(tmp_path)
    proc = preflight(*argv(saved, str(tmp_path / "out")))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert re.search(pattern, proc.stderr), proc.stderr
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize(
    "extra, pattern",
    [
        (
            ["--model.overrides.dim=32"],
            r"config error: checkpoint .*step-2/meta.json: dim = 64 but this run has 32; "
            r"run with the checkpoint's model settings",
        ),
        (
            ["--model.flavor=0.6b"],
            r"config error: checkpoint .*step-2/meta.json: flavor = 'debug' but this run has "
            r"'0.6b'",
        ),
        (
            ["--model.name=gpt_oss", "--model.overrides.n_layers=1"],
            r"config error: checkpoint .*meta.json: model = 'qwen3' but this run has 'gpt_oss'",
        ),
        (
            ["--checkpoint.load_step=3"],
            r"config error: checkpoint.load_step: no complete checkpoint step-3 in .*"
            r"\(complete: step-2\)",
        ),
        (
            ["--checkpoint.load_path=/nonexistent/step-9"],
            r"config error: checkpoint.load_path: no such file or folder",
        ),
    ],
)
def test_checkpoint_of_another_model_or_a_missing_one_exits_2(saved, tmp_path, extra, pattern):
    shutil.copytree(saved / "out", tmp_path / "out")
    before = tree_digest(tmp_path)
    args = argv(saved, str(tmp_path / "out"))
    if extra[0].startswith("--model.name") or extra[0].startswith("--model.flavor"):
        args = [a for a in args if not a.startswith("--model.overrides")]
    proc = preflight(*args, *extra)
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(pattern + r".*\n", proc.stderr), proc.stderr
    assert tree_digest(tmp_path) == before


def test_tokenizer_vocab_beyond_the_model_exits_2(saved):
    proc = preflight(*argv(saved, "fresh"), "--model.overrides.vocab_size=1000")
    assert proc.returncode == 2
    assert (
        proc.stderr.startswith("config error: model.tokenizer_path: tokenizer ")
        and "has vocab_size 2048 but the "
        "model has 1000 embedding rows; set --model.overrides.vocab_size=2048"
        in proc.stderr
    )
    assert not (saved / "fresh").exists()


def test_dump_folder_under_a_file_exits_2(tmp_path):
    (tmp_path / "file").write_text("x")
    text_file(tmp_path, n_plays=1)
    proc = preflight(*argv(tmp_path, "file/out"))
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        f"config error: job.dump_folder: cannot create '{tmp_path / 'file/out'}': "
        f"{tmp_path / 'file'} is not a writable folder"
    )
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize("text", ["", "to be"])
def test_empty_or_short_dataset_exits_2_from_run_train_sh_and_writes_nothing(tmp_path, text):
    (tmp_path / "data.txt").write_text(text)
    proc = run_train(argv(tmp_path))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("input error: dataset_path ") and str(tmp_path / "data.txt") in last
    assert ("holds no documents" if not text else "fewer than one window") in last
    assert not (tmp_path / "out").exists()
