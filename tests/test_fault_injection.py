"""Fault injection through ``./run_train.sh`` (issue 16's acceptance): every case ends with its
documented exit status and one last line, no traceback, and the checkpoint that was there before
loads and resumes bitwise.

"Bitwise" is checked on the saved state itself: the DCP data files of the resumed run's next
checkpoint (model, optimizer, scheduler, data position, RNG states, counters) have the checksums of
an uninterrupted run's. Runs use the tiny 1-block model; the long ones (signals, kill -9) a constant
LR, so that a run stopped at step K and resumed with ``--training.steps=K+1`` must equal an
uninterrupted run of K+1 steps. Cases refused before anything is written assert that the checkpoint
folder is byte for byte unchanged.
"""

from __future__ import annotations

import os
import pty
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest
from ckpt_helpers import text_file, tree_digest
from dist_helpers import REPO, env, launcher_copy
from fault_helpers import (
    ALONE_S,
    CONSTANT_LR,
    FAST,
    HANG_S,
    Run,
    alive,
    descendants,
    last_line,
    run,
    shard_digests,
    worker_pid,
)

pytestmark = pytest.mark.multiprocess

LONG = [*CONSTANT_LR, "--training.steps=100000", "--checkpoint.interval=2"]
"""A run that goes on until it is stopped, saving every 2 steps."""


def args(data, dump, *extra: str) -> list[str]:
    return [
        *FAST,
        f"--training.dataset_path={data / 'data.txt'}",
        f"--job.dump_folder={dump}",
        "--checkpoint.interval=2",
        *extra,
    ]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    text_file(folder, n_plays=1)
    return folder


@pytest.fixture(scope="module")
def four_steps(data):
    """The tiny 4-step run (1 rank, checkpoints at steps 2 and 4): its checkpoint folder."""
    code, lines = run(args(data, data / "four"))
    assert code == 0, "\n".join(lines[-30:])
    return data / "four" / "checkpoint"


def with_step2(four_steps, dump):
    """``dump`` holding a copy of the 4-step run's step-2 checkpoint; its checkpoint folder."""
    folder = dump / "checkpoint"
    folder.mkdir(parents=True)
    shutil.copytree(four_steps / "step-2", folder / "step-2")
    return folder


def assert_resumes_to_step4_bitwise(
    data, four_steps, dump, *extra: str, resumed_from: int = 2
) -> list[str]:
    code, lines = run(args(data, dump, *extra))
    assert code == 0, "\n".join(lines[-30:])
    assert any(
        f"resumed at step {resumed_from} from {dump / 'checkpoint' / f'step-{resumed_from}'} ("
        in line
        for line in lines
    ), "\n".join(lines)
    assert shard_digests(dump / "checkpoint" / "step-4") == shard_digests(four_steps / "step-4")
    return lines


def assert_resumes_one_step_bitwise(data, dump, step: int) -> None:
    """Resume ``dump``'s step-``step`` for one more step on 2 ranks: step ``step + 1`` equals that
    of an uninterrupted run of ``step + 1`` steps (a constant LR does not depend on
    ``training.steps``)."""
    code, lines = run(args(data, dump, *CONSTANT_LR, f"--training.steps={step + 1}"), nproc=2)
    assert code == 0, "\n".join(lines[-30:])
    assert any(f"resumed at step {step} from " in line for line in lines), "\n".join(lines)
    reference = dump.parent / "reference"
    code, lines = run(
        args(
            data,
            reference,
            *CONSTANT_LR,
            f"--training.steps={step + 1}",
            "--checkpoint.interval=100000",
        ),
        nproc=2,
    )
    assert code == 0, "\n".join(lines[-30:])
    assert shard_digests(dump / "checkpoint" / f"step-{step + 1}") == shard_digests(
        reference / "checkpoint" / f"step-{step + 1}"
    )


def zero_block(shard):
    with open(shard, "r+b") as handle:
        handle.seek(shard.stat().st_size // 2)
        handle.write(bytes(8192))


def flip_bytes(shard):
    with open(shard, "r+b") as handle:
        handle.seek(shard.stat().st_size // 3)
        block = handle.read(4096)
        handle.seek(-len(block), os.SEEK_CUR)
        handle.write(bytes(b ^ 0xFF for b in block))


@pytest.mark.parametrize("corrupt", [zero_block, flip_bytes])
def test_a_damaged_shard_exits_2_naming_it_and_load_step_resumes_the_older_one_bitwise(
    data, four_steps, tmp_path, corrupt
):
    shutil.copytree(four_steps, tmp_path / "out" / "checkpoint")
    shard = tmp_path / "out" / "checkpoint" / "step-4" / "__0_0.distcp"
    corrupt(shard)
    before = tree_digest(tmp_path)
    code, lines = run(args(data, tmp_path / "out"))
    assert code == 2
    assert re.fullmatch(
        rf"input error: checkpoint file {shard} does not match the xxh3_128 checksum recorded when "
        r"it was saved \(\w+\.\.\., now \w+\.\.\.\): the file is corrupt; load another step with "
        r"--checkpoint.load_step=2 \(complete: step-2\) or delete this folder",
        last_line(lines),
    )
    assert tree_digest(tmp_path) == before
    assert_resumes_to_step4_bitwise(data, four_steps, tmp_path / "out", "--checkpoint.load_step=2")


def test_a_truncated_metadata_exits_2_before_torchrun_and_load_step_resumes_bitwise(
    data, four_steps, tmp_path
):
    shutil.copytree(four_steps, tmp_path / "out" / "checkpoint")
    metadata = tmp_path / "out" / "checkpoint" / "step-4" / ".metadata"
    size = metadata.stat().st_size
    metadata.write_bytes(metadata.read_bytes()[: size // 2])
    before = tree_digest(tmp_path)
    code, lines = run(args(data, tmp_path / "out"))
    assert code == 2
    assert last_line(lines) == (
        f"config error: checkpoint file {metadata} is {size // 2} bytes, expected {size} "
        "(truncated or overwritten); load another step with --checkpoint.load_step=2 "
        "(complete: step-2) or delete this folder"
    )
    assert not any(line.startswith("[rank") for line in lines)  # refused before torchrun
    assert tree_digest(tmp_path) == before
    assert_resumes_to_step4_bitwise(data, four_steps, tmp_path / "out", "--checkpoint.load_step=2")


def test_stale_tmp_file_and_folder_are_removed_before_training_and_the_run_resumes_bitwise(
    data, four_steps, tmp_path
):
    folder = with_step2(four_steps, tmp_path / "out")
    (folder / "step-3.tmp").mkdir()
    (folder / "step-3.tmp" / "__0_0.distcp").write_bytes(b"half a save")
    (folder / "step-4.tmp").write_text("a file where a save goes")
    lines = assert_resumes_to_step4_bitwise(data, four_steps, tmp_path / "out")
    removed = [line.split(":", 1)[1] for line in lines if "removed step-" in line]
    assert removed == [
        f"removed step-3.tmp from {folder}: left by an interrupted save or deletion",
        f"removed step-4.tmp from {folder}: left by an interrupted save or deletion",
    ]
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "step-2", "step-4"]


@pytest.mark.parametrize("kind", ["file", "folder without meta.json"])
def test_a_step_n_that_is_no_checkpoint_exits_2_before_training_and_changes_nothing(
    data, four_steps, tmp_path, kind
):
    folder = with_step2(four_steps, tmp_path / "out")
    if kind == "file":
        (folder / "step-4").write_text("not a checkpoint")
        why = "is a file, not a checkpoint folder"
    else:
        (folder / "step-4").mkdir()
        why = "has no meta.json, so it is not a complete checkpoint of this trainer"
    before = tree_digest(tmp_path)
    code, lines = run(args(data, tmp_path / "out"))
    assert code == 2
    assert last_line(lines) == (
        f"config error: checkpoint folder {folder}: step-4 {why}; move it out of the "
        "checkpoint folder or delete it, then run again"
    )
    assert tree_digest(tmp_path) == before
    (folder / "step-4").unlink() if kind == "file" else (folder / "step-4").rmdir()
    assert_resumes_to_step4_bitwise(data, four_steps, tmp_path / "out")


def test_a_folder_in_use_exits_2_naming_the_holder_and_sigterm_mid_step_saves_and_resumes_bitwise(
    data, tmp_path
):
    first = Run(args(data, tmp_path / "out", *LONG), nproc=2)
    first.wait_for(r"^\[rank0\]:step +3 ")
    code, lines = run(args(data, tmp_path / "out", *LONG), nproc=2)
    assert code == 2
    holder = re.fullmatch(
        rf"config error: checkpoint folder {tmp_path / 'out' / 'checkpoint'} is in use by another "
        rf"run \(host {re.escape(socket.gethostname())}, PID (\d+), since [\d: -]+\); wait for it "
        r"to end, or give this run another checkpoint.folder or job.dump_folder",
        last_line(lines),
    )
    assert holder and int(holder.group(1)) in descendants(first.proc.pid)  # the first run's rank 0
    first.signal(signal.SIGTERM)
    code, lines = first.finish()
    saved = re.fullmatch(
        rf"\[rank0\]:stopped by a signal after step (\d+); checkpoint saved: "
        rf"{tmp_path / 'out' / 'checkpoint'}/step-(\d+)",
        last_line(lines),
    )
    assert code == 0 and saved and saved.group(1) == saved.group(2)
    assert_resumes_one_step_bitwise(data, tmp_path / "out", int(saved.group(1)))


SLOW_PUBLISH = """

import time as _time

_publish = publish


def publish(tmp, final):
    print(f"INJECTED: publishing {final}", flush=True)
    _time.sleep(3)
    _publish(tmp, final)
"""

SLOW_DATA = """

import time as _time

_build_dataloaders = build_dataloaders


def build_dataloaders(*args, **kwargs):
    print("INJECTED: loading data", flush=True)
    _time.sleep(3)
    return _build_dataloaders(*args, **kwargs)
"""


def test_sigterm_mid_save_finishes_that_save_stops_without_another_step_and_resumes_bitwise(
    data, tmp_path
):
    work = launcher_copy(tmp_path)
    with open(work / "torchtitan_lite" / "components" / "checkpoint" / "storage.py", "a") as handle:
        handle.write(SLOW_PUBLISH)
    launched = Run(args(data, tmp_path / "out", *LONG), nproc=2, cwd=work)
    launched.wait_for(r"INJECTED: publishing .*step-2$")
    launched.signal(signal.SIGTERM)
    code, lines = launched.finish()
    assert code == 0
    assert last_line(lines) == (
        f"[rank0]:stopped by a signal after step 2; checkpoint saved: "
        f"{tmp_path / 'out' / 'checkpoint' / 'step-2'}"
    )
    assert not any(re.match(r"\[rank0\]:step +3 ", line) for line in lines)
    assert_resumes_one_step_bitwise(data, tmp_path / "out", 2)


def test_sigterm_at_1s_in_the_config_check_exits_0_with_nothing_saved(data, four_steps, tmp_path):
    with_step2(four_steps, tmp_path / "out")
    before = tree_digest(tmp_path)
    launched = Run(args(data, tmp_path / "out"))
    time.sleep(1)
    launched.signal(signal.SIGTERM)
    code, lines = launched.finish()
    assert code == 0
    assert (
        last_line(lines) == "stopped by a signal (SIGTERM) before the first step; nothing to save"
    )
    assert tree_digest(tmp_path) == before


def test_sigterm_while_the_workers_load_data_exits_0_with_nothing_saved(data, four_steps, tmp_path):
    # about 5 s after the start on an idle machine: the workers are past the config check, building
    # the run
    work = launcher_copy(tmp_path)
    train_py = work / "torchtitan_lite" / "train.py"
    main_block = '\nif __name__ == "__main__":'
    train_py.write_text(train_py.read_text().replace(main_block, SLOW_DATA + main_block))
    with_step2(four_steps, tmp_path / "out")
    before = tree_digest(tmp_path / "out")
    launched = Run(args(data, tmp_path / "out"), nproc=2, cwd=work)
    launched.wait_for(r"^\[rank0\]:INJECTED: loading data")
    launched.signal(signal.SIGTERM)
    code, lines = launched.finish()
    assert code == 0
    assert last_line(lines) == (
        "[rank0]:stopped by a signal (SIGTERM) after loading the data, before the first "
        "step; nothing to save"
    )
    assert tree_digest(tmp_path / "out") == before


def test_kill_9_of_the_process_group_leaves_no_worker_and_the_latest_checkpoint_resumes_bitwise(
    data, tmp_path
):
    launched = Run(args(data, tmp_path / "out", *LONG), nproc=2)
    launched.wait_for(r"^\[rank0\]:step +5 ")
    tree = descendants(launched.proc.pid)
    workers = {worker_pid(launched.proc.pid, rank) for rank in (0, 1)}
    assert workers < tree  # and torchrun's agent
    os.killpg(launched.proc.pid, signal.SIGKILL)
    launched.proc.wait(timeout=60)
    deadline = time.monotonic() + ALONE_S
    while alive(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(tree)
    steps = sorted(
        int(p.name.removeprefix("step-"))
        for p in (tmp_path / "out" / "checkpoint").glob("step-*[0-9]")
    )
    assert steps and steps[-1] >= 4
    assert_resumes_one_step_bitwise(data, tmp_path / "out", steps[-1])


def test_ctrl_c_in_a_terminal_saves_shows_the_saved_line_last_exits_0_and_resumes_bitwise(
    data, tmp_path
):
    """Under a pseudo-terminal Ctrl-C sends SIGINT to the whole foreground process group (the
    launcher, torchrun, tee), as a terminal does."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session with the pty as its controlling terminal
        os.chdir(REPO)
        os.execvpe(
            "./run_train.sh",
            ["./run_train.sh", *args(data, tmp_path / "out", *LONG)],
            env(NGPU="2"),
        )
    output, sent = b"", False
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
        if not sent and re.search(rb"\[rank0\]:step +3 ", output):
            os.write(fd, b"\x03")
            sent = True
    else:  # the run did not end: stop it rather than wait for its 100,000 steps
        os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    lines = output.decode(errors="replace").replace("\r\n", "\n").strip().splitlines()
    assert sent and os.waitstatus_to_exitcode(status) == 0, "\n".join(lines[-30:])
    saved = re.fullmatch(
        rf"\[rank0\]:stopped by a signal after step (\d+); checkpoint saved: "
        rf"{tmp_path / 'out' / 'checkpoint'}/step-(\d+)",
        last_line(lines).removeprefix("^C"),
    )
    assert saved and saved.group(1) == saved.group(2)
    assert_resumes_one_step_bitwise(data, tmp_path / "out", int(saved.group(1)))


@pytest.fixture
def small_disk(tmp_path):
    """A 3.5 MiB tmpfs (room for one checkpoint of the tiny model, not two), or a skip."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3584k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_during_a_save_says_so_keeps_the_last_checkpoint_and_it_resumes_bitwise(
    data, four_steps, tmp_path, small_disk
):
    code, lines = run(args(data, small_disk / "out"))
    folder = small_disk / "out" / "checkpoint"
    assert code == 1
    assert any(
        re.search(
            rf"warning: [\d,]+ bytes free in {folder} but a checkpoint takes about [\d,]+ "
            r"\(parameters and AdamW moments\): fewer than two fit",
            line,
        )
        for line in lines
    )
    assert re.fullmatch(
        rf"error: no space left on device writing {folder}/step-4.tmp: [\d,]+ bytes needed, [\d,]+ "
        r"free; the last complete checkpoint step-2 is intact; free space or set checkpoint.folder "
        r"to a larger disk, then run again to resume",
        last_line(lines),
    )
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "step-2"]
    shutil.copytree(small_disk / "out", tmp_path / "out")
    assert_resumes_to_step4_bitwise(data, four_steps, tmp_path / "out")


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--optimizer.lr=inf"],
            "config error: optimizer.lr (command line): must be a finite number, got inf",
        ),
        (
            ["--training.max_norm=nan"],
            "config error: training.max_norm (command line): must be a finite number, got nan",
        ),
        (
            ["--training.steps=10000000000000"],
            "config error: training.steps (command line): must be <= 1000000000000, got "
            "10000000000000",
        ),
        (
            ["--training.seq_len=128"],
            "config error: training.seq_len (command line): 128 exceeds the model's max_seq_len "
            "64; lower it or set --model.overrides.max_seq_len=128",
        ),
        (
            [
                "--model.overrides.dim=65536",
                "--model.overrides.hidden_dim=262144",
                "--model.overrides.head_dim=32768",
            ],
            r"config error: memory: the model has [\d,]+ parameters and the run needs about "
            r"[\d,.]+ GiB \([\d,.]+ GiB "
            r"parameters, gradients and AdamW moments over 1 rank\(s\) \+ [\d,.]+ GiB "
            r"activations\) of [\d,.]+ GiB host memory; use a smaller model, .*",
        ),
    ],
)
def test_values_that_cannot_train_exit_2_before_torchrun(data, tmp_path, extra, message):
    code, lines = run([*args(data, tmp_path / "out"), *extra])
    assert code == 2 and re.fullmatch(
        message if "memory" in message else re.escape(message), last_line(lines)
    )
    assert len(lines) == 1 and not (tmp_path / "out").exists()


def test_an_empty_dump_folder_and_an_empty_config_file_exit_2_before_torchrun(data, tmp_path):
    code, lines = run([*args(data, tmp_path / "out"), "--job.dump_folder="])
    assert code == 2 and lines == [
        "config error: job.dump_folder (command line): is empty, which would write into "
        "the current folder (or the folder above); name a folder, e.g. the default"
    ]
    (tmp_path / "empty.toml").write_text("# nothing here\n")
    empty = tmp_path / "empty.toml"
    code, lines = run(
        [f"--job.dump_folder={tmp_path / 'out'}"], extra_env={"CONFIG_FILE": str(empty)}
    )
    assert code == 2 and lines == [
        f"config error: job.config_file: empty config file {empty}; remove CONFIG_FILE to "
        "train the defaults (train_configs/qwen3_debug.toml), or give the file some [section] keys"
    ]
    assert not (tmp_path / "out").exists()


RANK1_ERROR = """

from torchtitan_lite.errors import InputError as _InputError

_build_dataloaders_once = build_dataloaders


def build_dataloaders(*args, **kwargs):
    if os.environ["RANK"] == "1":
        raise _InputError("injected on rank 1 only")
    return _build_dataloaders_once(*args, **kwargs)
"""


def test_a_user_error_on_rank_1_only_ends_the_run_before_a_timeout_with_exit_2(data, tmp_path):
    work = launcher_copy(tmp_path)
    train_py = work / "torchtitan_lite" / "train.py"
    main_block = '\nif __name__ == "__main__":'
    train_py.write_text(train_py.read_text().replace(main_block, RANK1_ERROR + main_block))
    launched = Run(args(data, tmp_path / "out"), nproc=2, cwd=work)
    launched.wait_for(
        r"^\[rank0\]:data "
    )  # the workers are up: rank 1 fails now, rank 0 waits in a collective
    begin = time.monotonic()
    code, lines = launched.finish(timeout=HANG_S)
    assert time.monotonic() - begin < HANG_S  # rank 1's exit stopped rank 0, not the timeout
    assert code == 2
    assert last_line(lines) == "input error: injected on rank 1 only"
    assert [line for line in lines if "error:" in line] == [lines[-1]]


def test_kill_9_of_one_worker_ends_the_run_with_exit_1_naming_it_and_leaves_no_worker(
    data, tmp_path
):
    launched = Run(args(data, tmp_path / "out", *LONG), nproc=2)
    launched.wait_for(r"^\[rank0\]:step +3 ")
    tree = descendants(launched.proc.pid)
    os.kill(worker_pid(launched.proc.pid, 1), signal.SIGKILL)
    begin = time.monotonic()
    code, lines = launched.finish(timeout=HANG_S)
    assert time.monotonic() - begin < HANG_S  # the kill stopped rank 0, not the timeout
    assert code == 1
    assert lines[-1] == (
        "error: training failed (torchrun exit status 1): rank 1 was killed by SIGKILL; the last "
        "complete checkpoint is kept"
    )
    assert not alive(tree)
