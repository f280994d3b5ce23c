"""The console output of a rank in the run folder (logs/rank<N>.log), progress lines, no torchrun
leftovers."""

from __future__ import annotations

import re
import sys

import pytest
from ckpt_helpers import TINY_MODEL, text_file
from dist_helpers import run_train

from torchtitan_lite.data.progress import ProgressLines
from torchtitan_lite.lifecycle.console_log import ConsoleLog


def test_console_log_keeps_lines_until_opened_then_writes_through_and_restores_the_streams(
    tmp_path, capsys
):
    stdout, stderr = sys.stdout, sys.stderr
    log = ConsoleLog()
    print("config (0.1 s): before the run folder exists")
    print("warning: on stderr", file=sys.stderr)
    sys.stderr.write("\rtokenizing 40%|####      |")  # a terminal redraw: console only
    path = log.open(tmp_path / "logs" / "rank0.log")
    print("step   1  loss  7.6115")
    assert path.read_text() == (
        "config (0.1 s): before the run folder exists\nwarning: on stderr\nstep   1  loss  7.6115\n"
    )  # written through at once
    try:
        raise TypeError("injected bug")
    except TypeError:
        log.copy_exception()
    log.close()
    assert sys.stdout is stdout and sys.stderr is stderr
    print("after close")
    text = path.read_text()
    assert "Traceback (most recent call last)" in text and text.endswith(
        "TypeError: injected bug\n"
    )
    assert "after close" not in text
    out = capsys.readouterr()
    assert (
        out.out
        == "config (0.1 s): before the run folder exists\nstep   1  loss  7.6115\nafter close\n"
    )
    assert out.err == "warning: on stderr\n\rtokenizing 40%|####      |"


def test_a_log_that_is_never_opened_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = ConsoleLog()
    print("input error: dataset_path not found")
    log.close()
    assert list(tmp_path.iterdir()) == []


def test_progress_lines_every_ten_percent_once_the_phase_is_slow(capsys):
    clock = iter(
        [0.0, 1.0, 6.0, 6.5, 7.0, 9.0, 12.0, 12.1]
    )  # seconds at the start, each update and the end
    with ProgressLines(1000, "tokenizing", "document", clock=lambda: next(clock)) as bar:
        for done in (50, 250, 30, 20, 150, 500):  # 5%, 30%, 33%, 35%, 50%, 100%
            bar.update(done)
            if done == 150:
                bar.set_postfix_str("83 documents/s")
    assert capsys.readouterr().out.splitlines() == [
        "tokenizing: 30% (300 of 1,000 documents), 6.0 s",  # the first update after 5 s
        # 33% and 35% are within 10% of the last line
        "tokenizing: 50% (500 of 1,000 documents), 9.0 s",
        "tokenizing: 100% (1,000 of 1,000 documents), 12.0 s, 83 documents/s",
    ]
    with ProgressLines(10, "tokenizing", "document") as quick:  # done before 5 s: silent
        quick.update(10)
    assert capsys.readouterr().out == ""


def test_progress_lines_spell_the_plural_of_batch_batches(capsys):
    clock = iter([0.0, 6.0, 6.1])  # seconds at the start, the update and the end
    with ProgressLines(4, "evaluating", "batch", clock=lambda: next(clock)) as bar:
        bar.update(4)
    assert capsys.readouterr().out == "evaluating: 100% (4 of 4 batches), 6.0 s\n"


def _strip_rank(line: str) -> str:
    return re.sub(r"^\[rank0\]:", "", line)


@pytest.mark.multiprocess
def test_run_train_sh_writes_every_ranks_output_to_the_run_folder_and_leaves_no_torchrun_folder(
    tmp_path,
):
    text_file(tmp_path, n_plays=1)
    args = [
        *TINY_MODEL,
        "--training.seq_len=32",
        "--training.local_batch_size=2",
        "--training.global_batch_size=4",
        "--training.steps=3",
        "--lr_scheduler.warmup_steps=1",
        "--training.num_threads=1",
        "--validation.freq=2",
        "--checkpoint.enable=true",
        "--checkpoint.interval=2",
        f"--training.dataset_path={tmp_path / 'data.txt'}",
        f"--job.dump_folder={tmp_path / 'out'}",
    ]
    proc = run_train(args, nproc=2, timeout=400, TMPDIR=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "out").iterdir() if p.name.startswith("qwen3-debug-")]
    assert sorted(p.name for p in (run / "logs").iterdir()) == ["rank0.log", "rank1.log"]
    # lines end at "\n" only: a progress bar's "\r" updates (HF datasets) stay within their line on
    # both sides
    console = [
        _strip_rank(line)
        for line in (proc.stdout + proc.stderr).split("\n")
        if line.startswith("[rank0]:")
    ]
    with open(run / "logs" / "rank0.log", newline="") as handle:
        logged = handle.read().rstrip("\n").split("\n")
    # torchrun tails a worker's stdout and stderr separately: lines of the two may come in another
    # order there
    assert sorted(logged) == sorted(console) and len(logged) > 10
    steps = [[line for line in lines if line.startswith("step ")] for lines in (logged, console)]
    assert steps[0] == steps[1]
    rank1 = (run / "logs" / "rank1.log").read_text()
    assert "checkpoint saved: " in rank1 and "done: step 3 of 3" in rank1
    assert sorted(p.name for p in run.iterdir()) == ["config.toml", "logs", "run.json", "tb"]
    assert [
        p.name for p in tmp_path.iterdir() if p.name.startswith(("torchelastic_", "run_train."))
    ] == []
