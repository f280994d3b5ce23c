"""Run safety, unit by unit: checksums, the folder lock, leftovers and atomic renames, a full disk,
stop requests, outcomes for the launcher, the memory estimate, the LR schedule on resume and the
line of changed settings."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
import xxhash
from ckpt_helpers import text_file, tiny_job
from dist_helpers import REPO, env
from fault_helpers import ALONE_S, alive
from model_helpers import train_to_the_end
from torch.distributed.checkpoint.api import CheckpointException

from torchtitan_lite import train as train_module
from torchtitan_lite.components.checkpoint import integrity, storage
from torchtitan_lite.components.checkpoint.lock import FolderLock, check_unlocked
from torchtitan_lite.components.checkpoint.resume import (
    config_values,
    resume_line,
    schedule_settings,
)
from torchtitan_lite.components.lr_schedule import (
    build_lr_scheduler,
    follow_schedule,
    wsd_lr_factor,
)
from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.lifecycle.faults import (
    CONTROL_ENV,
    Stopped,
    StopRequest,
    peer_failed,
    report_outcome,
)
from torchtitan_lite.preflight.checks import parse_args, parse_run
from torchtitan_lite.preflight.memory import (
    GIB,
    MemoryEstimate,
    check_memory,
    estimate_rank_memory,
    fit_problem,
)
from torchtitan_lite.train import Trainer


def _step_folder(tmp_path, name="step-2"):
    """A fake step folder with two data files, ``.metadata`` and a sealed ``meta.json``."""
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(bytes(range(256)) * 64)
    (folder / "__1_0.distcp").write_bytes(b"rank one" * 100)
    (folder / ".metadata").write_bytes(b"metadata")
    files = integrity.describe_files(str(folder), ["__0_0.distcp", "__1_0.distcp", ".metadata"])
    meta = integrity.seal({"format": integrity.FORMAT_VERSION, "step": 2, "files": files})
    (folder / storage.META_FILE).write_text(json.dumps(meta))
    return folder


def test_file_digest_is_xxh3_128_of_the_bytes_read_in_chunks(tmp_path, monkeypatch):
    data = os.urandom(3 * 1000 + 7)
    (tmp_path / "f").write_bytes(data)
    monkeypatch.setattr(integrity, "_CHUNK", 1000)
    assert integrity.file_digest(str(tmp_path / "f")) == xxhash.xxh3_128_hexdigest(data)


def test_read_meta_refuses_an_edited_meta_json_and_a_changed_metadata_naming_the_file(tmp_path):
    folder = _step_folder(tmp_path)
    assert integrity.read_meta(str(folder))["step"] == 2
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "step": 3}))
    with pytest.raises(
        storage.CheckpointError,
        match=r"meta.json is corrupt \(its content does not match the checksum",
    ):
        integrity.read_meta(str(folder))
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / ".metadata").write_bytes(b"METADATA")
    with pytest.raises(
        storage.CheckpointError,
        match=rf"^checkpoint file {folder}/.metadata does not match the xxh3_128 "
        r"checksum recorded when it was saved .*: the file is corrupt; "
        r"delete this folder to start fresh",
    ):
        integrity.read_meta(str(folder))


def test_verify_files_finds_one_flipped_byte_and_names_the_older_checkpoint_to_load(
    tmp_path, one_rank_group
):
    _step_folder(tmp_path, "step-1")
    folder = _step_folder(tmp_path)
    data = bytearray((folder / "__1_0.distcp").read_bytes())
    data[100] ^= 1
    (folder / "__1_0.distcp").write_bytes(bytes(data))
    meta = integrity.read_meta(
        str(folder)
    )  # sizes and .metadata are fine: only the full check sees it
    with pytest.raises(
        storage.CheckpointError,
        match=rf"^checkpoint file {folder}/__1_0.distcp does not match .*"
        r"load another step with --checkpoint.load_step=1 \(complete: "
        r"step-1\) or delete this folder$",
    ):
        integrity.verify_files(str(folder), meta, rank=0, world_size=1)


def test_publish_replaces_an_existing_step_whole_and_remove_step_leaves_nothing(tmp_path):
    (tmp_path / "step-4").mkdir()
    (tmp_path / "step-4" / "old").write_text("old run")
    (tmp_path / "step-4.tmp").mkdir()
    (tmp_path / "step-4.tmp" / "new").write_text("this run")
    storage.publish(str(tmp_path / "step-4.tmp"), str(tmp_path / "step-4"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-4"]
    assert [p.name for p in (tmp_path / "step-4").iterdir()] == ["new"]
    storage.remove_step(str(tmp_path), 4)
    assert list(tmp_path.iterdir()) == []


def test_leftovers_a_bad_step_n_is_refused_and_only_tmp_names_are_removed(tmp_path):
    (tmp_path / "step-2").mkdir()
    (tmp_path / "step-2" / storage.META_FILE).write_text("{}")
    for name in ("step-3.tmp", "step-4.replaced.tmp", "step-5.deleting.tmp"):
        (tmp_path / name).mkdir()
    (tmp_path / "step-6.tmp").write_text("a file")
    (tmp_path / "notes.tmp").write_text("not ours")
    storage.check_leftovers(str(tmp_path))
    assert storage.remove_leftovers(str(tmp_path)) == [
        "step-3.tmp",
        "step-4.replaced.tmp",
        "step-5.deleting.tmp",
        "step-6.tmp",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.tmp", "step-2"]
    (tmp_path / "step-7").symlink_to(tmp_path / "step-2")
    with pytest.raises(
        storage.CheckpointError, match=r": step-7 is a link, not a checkpoint folder; move it out"
    ):
        storage.check_leftovers(str(tmp_path))


def test_no_space_is_found_in_dcps_per_rank_failures_or_from_the_free_space():
    enospc = OSError(errno.ENOSPC, "No space left on device")
    gathered = CheckpointException("write", {1: (enospc, None)})
    assert storage.is_no_space(gathered, free_now=10**9, needed=10)
    wrapped = RuntimeError("unexpected pos 704 vs 598")
    assert storage.is_no_space(wrapped, free_now=100, needed=1000)
    assert not storage.is_no_space(wrapped, free_now=1000, needed=1000)
    assert not storage.is_no_space(
        CheckpointException("write", {0: (ValueError("bug"), None)}), 10**9, 10
    )


def test_a_second_lock_names_the_holder_the_probe_sees_it_and_release_frees_it(tmp_path):
    lock = FolderLock(str(tmp_path / "checkpoint"))
    lock.acquire()
    holder = rf"\(host {re.escape(socket.gethostname())}, PID {os.getpid()}, since [\d: -]+\)"
    busy = (
        rf"^checkpoint folder {tmp_path / 'checkpoint'} is in use by another run {holder}; wait "
        r"for it to end"
    )
    with pytest.raises(storage.CheckpointError, match=busy):
        FolderLock(str(tmp_path / "checkpoint")).acquire()
    with pytest.raises(storage.CheckpointError, match=holder):
        check_unlocked(str(tmp_path / "checkpoint"))
    lock.release()
    check_unlocked(str(tmp_path / "checkpoint"))
    again = FolderLock(str(tmp_path / "checkpoint"))
    again.acquire()
    again.release()


def test_the_kernel_drops_the_lock_of_a_process_killed_with_sigkill(tmp_path):
    code = (
        "import sys, time; from torchtitan_lite.components.checkpoint.lock import FolderLock; "
        "lock = FolderLock(sys.argv[1]); lock.acquire(); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=REPO,
        env=env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(storage.CheckpointError, match=f"PID {holder.pid}"):
            check_unlocked(str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    FolderLock(str(tmp_path)).acquire()


def test_stop_request_reads_the_launchers_stop_file_and_publishes_a_growing_budget(tmp_path):
    stop = StopRequest(control=str(tmp_path))
    try:
        assert not stop.requested()
        stop.publish_budget(step_s=1.0, save_s=None, save_bytes=50 * 2**20)  # 2 * (1 + 1) + 60
        assert (tmp_path / "stop_within_s").read_text() == "64\n"
        stop.publish_budget(step_s=1.5, save_s=1.0, save_bytes=0)  # 65 < 1.1 * 64: unchanged
        assert (tmp_path / "stop_within_s").read_text() == "64\n"
        stop.publish_budget(step_s=5.0, save_s=2.0, save_bytes=0)
        assert (tmp_path / "stop_within_s").read_text() == "74\n"
        (tmp_path / "stop").write_text("SIGINT\n")
        assert stop.requested() and stop.signal_name == "SIGINT"
    finally:
        stop.restore()


def test_report_outcome_writes_the_status_for_the_launcher_and_its_peers_and_returns_it(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(CONTROL_ENV, raising=False)
    assert report_outcome(2, "input error: x") == 2
    monkeypatch.setenv(CONTROL_ENV, str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not peer_failed()
    assert report_outcome(2, "input error: x") == 2
    assert (tmp_path / "outcome.1").read_text() == "2\ninput error: x\n"
    assert not peer_failed()  # its own outcome
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert peer_failed()
    (tmp_path / "outcome.1").write_text("0\nstopped by a signal\n")
    assert not peer_failed()


def test_main_under_the_launcher_reports_bad_data_as_outcome_2_and_exits_2(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "data.txt").write_text("")
    monkeypatch.setenv(CONTROL_ENV, str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "0")
    args = tiny_job(tmp_path)
    assert train_module.main(args) == 2
    code, line = (tmp_path / "outcome.0").read_text().splitlines()
    assert (
        code == "2"
        and line.startswith("input error: dataset_path ")
        and "holds no documents" in line
    )
    assert capsys.readouterr().err.strip().splitlines()[-1] == line


def test_a_stop_before_the_first_step_raises_stopped_saying_nothing_is_saved(tmp_path):
    text_file(tmp_path, n_plays=1)
    run = parse_run(tiny_job(tmp_path))
    stop = StopRequest(control=str(tmp_path))
    (tmp_path / "stop").write_text("SIGTERM\n")
    try:
        with pytest.raises(
            Stopped,
            match=r"^stopped by a signal \(SIGTERM\) after the process group start, before the "
            r"first step; nothing to save$",
        ):
            Trainer(run, stop)
    finally:
        stop.restore()
        dist.destroy_process_group()
    assert not (tmp_path / "out").exists()


def test_follow_schedule_continues_a_schedule_exactly_from_the_step_reached():
    kwargs = dict(warmup_steps=2, steps=10, decay_ratio=0.4, decay_type="linear", min_lr_factor=0.1)
    param = torch.nn.Parameter(torch.zeros(1))
    expected = [1e-3 * wsd_lr_factor(step, **kwargs) for step in range(1, 11)]
    optimizer = torch.optim.SGD(
        [param], lr=7.0
    )  # another peak LR, as in a checkpoint of another setting
    scheduler = build_lr_scheduler(optimizer, **{**kwargs, "steps": 20})
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    follow_schedule(scheduler, lr=1e-3, **kwargs)
    seen = []
    for _ in range(6):
        seen.append(scheduler.get_last_lr()[0])
        assert optimizer.param_groups[0]["lr"] == seen[-1]
        optimizer.step()
        scheduler.step()
    assert seen == expected[4:]


def test_resume_line_lists_changes_and_says_which_lr_schedule_applies():
    saved = config_values(JobConfig())
    schedule = schedule_settings(saved)
    assert resume_line(saved, dict(saved), schedule, reset=False, step=7) is None
    assert resume_line(
        saved,
        {**saved, "training.local_batch_size": 4, "job.dump_folder": "elsewhere"},
        schedule,
        reset=False,
        step=7,
    ) == (
        "resumed with settings changed since the checkpoint: "
        "training.local_batch_size 8 -> 4; this run's values apply"
    )
    now = {**saved, "optimizer.lr": 1e-3, "training.steps": 400}
    assert resume_line(saved, now, schedule, reset=False, step=7) == (
        "warning: resumed with settings changed since the checkpoint: optimizer.lr 0.003 -> 0.001, "
        "training.steps 200 "
        "-> 400; this run's values apply except the LR schedule, which continues as saved "
        "(optimizer.lr 0.003, "
        "training.steps 200): pass --checkpoint.reset_lr_schedule to follow this run's from step 7"
    )
    assert resume_line(saved, now, schedule, reset=True, step=7) == (
        "resumed with settings changed since the checkpoint: optimizer.lr 0.003 -> 0.001, "
        "training.steps 200 -> 400; "
        "this run's values apply, the LR schedule too (checkpoint.reset_lr_schedule: from step 7)"
    )


def _resume(tmp_path, *extra):
    trainer = Trainer(parse_run(tiny_job(tmp_path, *extra)))
    try:
        return (
            trainer.load_lines,
            trainer.scheduler.get_last_lr()[0],
            trainer.checkpointer.meta["lr_schedule"],
        )
    finally:
        trainer.lock.release()
        dist.destroy_process_group()


def test_resuming_with_another_lr_keeps_the_saved_schedule_unless_reset_is_asked(tmp_path):
    text_file(tmp_path, n_plays=1)
    run = parse_run(tiny_job(tmp_path, "--training.steps=2"))
    train_to_the_end(run)
    saved = schedule_settings(config_values(run.config))
    shape = {k: v for k, v in saved.items() if k != "lr"}
    lines, lr, schedule = _resume(tmp_path, "--optimizer.lr=0.001")
    changed = [line for line in lines if "settings changed" in line]
    assert changed == [
        "warning: resumed with settings changed since the checkpoint: optimizer.lr 0.003 -> 0.001, "
        "training.steps 2 -> 4; this run's values apply except the LR schedule, which continues as "
        "saved (optimizer.lr 0.003, training.steps 2): pass --checkpoint.reset_lr_schedule to "
        "follow this run's from step 2"
    ]
    assert lr == 0.003 * wsd_lr_factor(3, **shape) and schedule == saved
    lines, lr, schedule = _resume(
        tmp_path, "--optimizer.lr=0.001", "--checkpoint.reset_lr_schedule"
    )
    assert [line for line in lines if "settings changed" in line][0].endswith(
        "this run's values apply, the LR schedule too (checkpoint.reset_lr_schedule: from step 2)"
    )
    assert lr == 0.001 * wsd_lr_factor(3, **{**shape, "steps": 4}) and schedule == {
        **saved,
        "lr": 0.001,
        "steps": 4,
    }


def test_a_trainer_on_a_folder_locked_by_another_run_stops_before_reading_or_writing(tmp_path):
    text_file(tmp_path, n_plays=1)
    step = tmp_path / "out" / "checkpoint" / "step-2"
    step.mkdir(parents=True)
    (step / storage.META_FILE).write_text(
        "{not json"
    )  # read before the lock, this would be the error
    lock = FolderLock(str(tmp_path / "out" / "checkpoint"))
    lock.acquire()
    run = parse_run(tiny_job(tmp_path))
    try:
        with pytest.raises(
            storage.CheckpointError, match=rf"is in use by another run \(host .*, PID {os.getpid()}"
        ):
            Trainer(run)
    finally:
        lock.release()
        dist.destroy_process_group()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint"]  # no run folder


def test_memory_estimate_counts_16_bytes_per_parameter_over_ranks_and_korthikantis_activations():
    class Args:
        dim, n_layers, n_heads, vocab_size = 1024, 4, 8, 1000

    est = estimate_rank_memory(
        10**9, Args, world_size=4, seq_len=512, local_batch_size=2, compute_bytes=2, ac_mode="none"
    )
    block = 512 * 2 * 1024 * (34 + 5 * 8 * 512 / 1024)
    assert est.states == 4 * 10**9 and est.activations == int(4 * block + 2 * 512 * 2 * 1000 * 4)
    full = estimate_rank_memory(
        10**9, Args, world_size=4, seq_len=512, local_batch_size=2, compute_bytes=2, ac_mode="full"
    )
    assert full.activations == int(4 * 512 * 2 * 1024 * 2 + block + 2 * 512 * 2 * 1000 * 4)


def test_fit_problem_errors_when_clearly_impossible_and_warns_when_tight():
    kw = dict(total=10 * GIB, available=8 * GIB, name="host memory", world_size=1)
    assert fit_problem(MemoryEstimate(2 * GIB, 1 * GIB), ranks_sharing=2, **kw) is None
    assert fit_problem(MemoryEstimate(3 * GIB, 1 * GIB), ranks_sharing=2, **kw)[0] == "warning"
    assert fit_problem(MemoryEstimate(11 * GIB, 0), ranks_sharing=1, **kw)[0] == "error"
    level, text = fit_problem(MemoryEstimate(1 * GIB, 20 * GIB), ranks_sharing=1, **kw)
    assert level == "error" and text.startswith(
        "the run needs about 21.0 GiB (1.0 GiB parameters, gradients and AdamW moments over 1 "
        "rank(s) + 20.0 GiB activations) of 10.0 GiB host memory"
    )


def test_fit_problem_names_only_changes_that_would_help():
    kw = dict(total=10 * GIB, available=8 * GIB, name="host memory", world_size=1)
    activations = MemoryEstimate(1 * GIB, 20 * GIB)
    _, text = fit_problem(activations, ranks_sharing=1, ac_mode="none", local_batch_size=2, **kw)
    assert text.endswith(
        "use a smaller model, more ranks, a smaller training.local_batch_size, a smaller "
        'training.seq_len, or activation_checkpoint.mode = "full"'
    )
    _, text = fit_problem(activations, ranks_sharing=1, ac_mode="full", local_batch_size=1, **kw)
    assert text.endswith("use a smaller model, more ranks, or a smaller training.seq_len")
    _, text = fit_problem(MemoryEstimate(11 * GIB, 0), ranks_sharing=1, ac_mode="none", **kw)
    assert text.endswith("use a smaller model, or more ranks")


def test_check_memory_refuses_a_model_that_cannot_fit_and_passes_the_debug_model():
    assert check_memory(parse_run([]), world_size=1) is None
    huge = parse_run(["--model.overrides.dim=65536", "--model.overrides.hidden_dim=262144"])
    with pytest.raises(
        ConfigError, match=r"^memory: the model has [\d,]+ parameters and the run needs about"
    ):
        check_memory(huge, world_size=1)


@pytest.mark.parametrize(
    "text, key",
    [
        ("[optimizer]\nlr = inf\n", "optimizer.lr"),
        ("[lr_scheduler]\nmin_lr_factor = nan\n", "lr_scheduler.min_lr_factor"),
        ("[model.overrides]\nrope_theta = inf\n", "model.overrides.rope_theta"),
    ],
)
def test_a_non_finite_float_in_the_file_is_a_config_error_naming_the_line(tmp_path, text, key):
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(
        ConfigError,
        match=rf"^{re.escape(key)} \({tmp_path / 'c.toml'} line 2\): must be a finite "
        r"number, got (inf|nan)$",
    ):
        parse_args([f"--job.config_file={tmp_path / 'c.toml'}"])


@pytest.mark.multiprocess
def test_a_worker_exits_within_seconds_when_its_parent_or_the_launcher_dies(tmp_path):
    child = (
        "import sys, time; from torchtitan_lite.lifecycle.faults import exit_with_launcher; "
        "exit_with_launcher(poll_s=0.2); print('armed', flush=True); time.sleep(600)"
    )
    parent = (
        f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
        "print(p.pid, flush=True); time.sleep(600)"
    )
    launcher = subprocess.Popen(["sleep", "600"])
    middle = subprocess.Popen(
        [sys.executable, "-c", parent],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env=env(TORCHTITAN_LITE_LAUNCHER_PID=str(launcher.pid)),
    )
    worker = int(middle.stdout.readline())
    try:
        assert middle.stdout.readline() == "armed\n"
        middle.kill()  # the parent (torchrun's place) dies: PR_SET_PDEATHSIG
        middle.wait()
        deadline = time.monotonic() + ALONE_S  # alone, it would sleep for 600 s
        while alive({worker}) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive({worker})
        lone = subprocess.Popen(
            [sys.executable, "-c", child],
            cwd=REPO,
            stderr=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env(TORCHTITAN_LITE_LAUNCHER_PID=str(launcher.pid)),
        )
        assert lone.stdout.readline() == "armed\n"
        launcher.send_signal(signal.SIGKILL)  # the launcher dies: the watchdog
        launcher.wait()
        assert lone.wait(timeout=ALONE_S) == 1
        assert lone.stderr.read() == (
            "error: the launcher is gone; this worker exits (the last complete checkpoint "
            "is kept)\n"
        )
    finally:
        for proc in (launcher, middle):
            proc.kill()
            proc.wait()


def test_a_tool_reads_a_checkpoint_of_a_running_job_and_refuses_a_damaged_one_in_one_line(
    tmp_path, capsys
):
    from torchtitan_lite import generate

    text_file(tmp_path, n_plays=1)
    job = tiny_job(tmp_path, "--training.steps=2")
    train_to_the_end(parse_run(job))
    step2 = tmp_path / "out" / "checkpoint" / "step-2"
    running = FolderLock(str(step2.parent))  # a training run holds the folder: reading it is fine
    running.acquire()
    tool = ["--prompt", "ROMEO:", "--max_new_tokens", "2", *job, f"--checkpoint.load_path={step2}"]
    try:
        assert generate.main(tool) == 0
        shard = step2 / "__0_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x10
        shard.write_bytes(bytes(data))
        capsys.readouterr()
        assert generate.main(tool) == 2
    finally:
        running.release()
    assert re.fullmatch(
        rf"input error: checkpoint file {shard} does not match the xxh3_128 checksum recorded when "
        r"it was saved .*: the file is corrupt; delete this folder to start fresh .*",
        capsys.readouterr().err.strip().splitlines()[-1],
    )
