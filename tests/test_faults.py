"""Faults: the non-finite policy (stop naming the step / skip up to K times) and SIGTERM -> save ->
exit 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest
import torch
import torch.distributed as dist
from ckpt_helpers import text_file, tiny_job
from dist_helpers import REPO, env, run_train

import torchtitan_lite.components.loss as loss_module
from torchtitan_lite.components.checkpoint import storage
from torchtitan_lite.lifecycle.faults import NonFiniteError, NonFiniteGuard, StopRequest
from torchtitan_lite.preflight.checks import parse_run
from torchtitan_lite.train import Trainer


def _record(guard, step, loss, grad_norm):
    guard.record(step, torch.tensor(loss), torch.tensor(grad_norm))


def test_guard_stop_names_the_step_and_skip_allows_k_then_stops(
    one_rank_group,
):  # its agreement: an all-reduce
    guard = NonFiniteGuard("stop", 0)
    _record(guard, 1, 2.5, 0.7)
    assert guard.apply_update(1, sync=True)
    guard = NonFiniteGuard("stop", 3)
    _record(guard, 7, float("nan"), 1.0)
    with pytest.raises(
        NonFiniteError, match=r"^step 7: loss nan, gradient norm 1.0; the update was not applied"
    ):
        guard.apply_update(7, sync=True)
    guard = NonFiniteGuard("skip", 2, skipped=1)
    _record(guard, 4, 1.0, float("inf"))
    assert guard.apply_update(4, sync=False) is False and guard.skipped == 2
    _record(guard, 5, float("inf"), 1.0)
    with pytest.raises(
        NonFiniteError, match=r"^step 5: loss inf, gradient norm 1.0, after 2 skipped steps"
    ):
        guard.apply_update(5, sync=False)
    with pytest.raises(ValueError, match="nonfinite_policy must be one of"):
        NonFiniteGuard("ignore", 1)


def test_guard_stop_without_sync_defers_to_the_next_check_naming_the_first_bad_step(one_rank_group):
    guard = NonFiniteGuard("stop", 0)
    _record(guard, 3, float("nan"), float("nan"))
    assert guard.apply_update(3, sync=False)  # no host read: the update goes ahead
    _record(guard, 4, 1.0, 1.0)  # a later finite step does not hide it
    with pytest.raises(
        NonFiniteError,
        match=r"^step 3: loss nan, gradient norm nan; the updates of steps 3-5 were "
        r"applied before this check \(metrics.log_freq\), nothing was saved",
    ):
        guard.check(5)


def test_stop_request_records_sigterm_and_restores_the_handler():
    previous = signal.getsignal(signal.SIGTERM)
    stop = StopRequest()
    os.kill(os.getpid(), signal.SIGTERM)
    stop.restore()
    assert stop.signal_name == "SIGTERM" and signal.getsignal(signal.SIGTERM) is previous


def poisoned_run(tmp_path, monkeypatch, nan_steps: set[int], *extra: str):
    """Train 4 steps in-process with a NaN loss at ``nan_steps``; returns (trainer, error, weights
    seen per step)."""
    text_file(tmp_path, n_plays=1)
    seen, real = {}, loss_module.cross_entropy_sum

    def loss(logits, labels):
        step = len(seen) + 1
        seen[step] = trainer.model.layers["0"].attention.wq.weight.full_tensor().clone()
        value = real(logits, labels)
        return value * float("nan") if step in nan_steps else value

    monkeypatch.setattr(loss_module, "cross_entropy_sum", loss)
    args = tiny_job(tmp_path, "--checkpoint.interval=2", "--checkpoint.keep_latest_k=0", *extra)
    trainer, stop, error = Trainer(parse_run(args)), StopRequest(), None
    try:
        trainer.train(stop)
    except NonFiniteError as err:
        error = err
    finally:
        stop.restore()
        final = trainer.model.layers["0"].attention.wq.weight.full_tensor().clone()
        dist.destroy_process_group()
    return trainer, error, seen, final


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    trainer, error, seen, final = poisoned_run(tmp_path, monkeypatch, {3})
    assert re.match(r"step 3: loss nan, gradient norm nan; the update was not applied", str(error))
    assert storage.complete_steps(str(tmp_path / "out" / "checkpoint")) == [2]
    assert sorted(p.name for p in (tmp_path / "out" / "checkpoint").iterdir()) == [
        ".lock",
        "step-2",
    ]
    assert torch.equal(
        final, seen[3]
    )  # the weights of step 2: the bad update never reached the optimizer


def test_nan_between_log_steps_is_caught_at_the_next_log_step_and_never_saved(
    tmp_path, monkeypatch
):
    # log_freq 4: steps 1 and 4 sync; step 2 is a save step (interval 2) and syncs too; the NaN of
    # step 3 is
    # found at step 4, before step 4's update and save.
    trainer, error, seen, final = poisoned_run(tmp_path, monkeypatch, {3}, "--metrics.log_freq=4")
    assert re.match(
        r"step 3: loss nan, gradient norm nan; the update of step 3 was applied", str(error)
    )
    assert storage.complete_steps(str(tmp_path / "out" / "checkpoint")) == [2]
    assert sorted(p.name for p in (tmp_path / "out" / "checkpoint").iterdir()) == [
        ".lock",
        "step-2",
    ]
    assert not torch.isfinite(
        final
    ).all()  # the NaN update went in (no sync at step 3): nothing saved from it


def test_skip_policy_drops_the_update_and_counts_it(tmp_path, monkeypatch):
    trainer, error, seen, _ = poisoned_run(
        tmp_path,
        monkeypatch,
        {3},
        "--training.nonfinite_policy=skip",
        "--training.max_skipped_steps=1",
    )
    assert error is None and trainer.train_state.skipped_steps == 1
    assert torch.equal(seen[4], seen[3]) and not torch.equal(seen[3], seen[2])
    assert storage.complete_steps(str(tmp_path / "out" / "checkpoint")) == [2, 4]


def test_skip_policy_stops_beyond_max_skipped_steps(tmp_path, monkeypatch):
    _, error, _, _ = poisoned_run(
        tmp_path,
        monkeypatch,
        {2, 3},
        "--training.nonfinite_policy=skip",
        "--training.max_skipped_steps=1",
    )
    assert re.match(r"step 3: loss nan, gradient norm nan, after 1 skipped steps", str(error))
    assert storage.complete_steps(str(tmp_path / "out" / "checkpoint")) == [2]


@pytest.mark.multiprocess
def test_sigterm_to_run_train_sh_saves_at_the_step_reached_exits_0_and_resumes(tmp_path):
    text_file(tmp_path, n_plays=1)
    args = tiny_job(tmp_path, "--checkpoint.interval=100000", "--training.steps=100000")
    proc = subprocess.Popen(
        ["./run_train.sh", *args],
        cwd=REPO,
        env=env(NGPU="2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if re.match(r"^\[rank0\]:step +3 ", line):
            proc.send_signal(signal.SIGTERM)
            break
    lines.extend(proc.stdout)
    assert proc.wait(timeout=120) == 0, "".join(lines[-30:])
    stopped = [
        m
        for line in lines
        if (m := re.search(r"stopped by a signal after step (\d+); checkpoint saved: (.*)$", line))
    ]
    assert len(stopped) == 1
    step = int(stopped[0].group(1))
    assert stopped[0].group(2) == str(tmp_path / "out" / "checkpoint" / f"step-{step}")
    assert storage.complete_steps(str(tmp_path / "out" / "checkpoint")) == [step]
    resumed = run_train([*args[:-1], f"--training.steps={step + 1}"], nproc=2)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert (
        f"resumed at step {step} from {tmp_path / 'out' / 'checkpoint' / f'step-{step}'} ("
        in resumed.stdout
    )
    assert re.search(rf"^\[rank0\]:step +{step + 1} ", resumed.stdout, re.M)
