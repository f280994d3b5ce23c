"""Log line format, throughput / MFU / ETA arithmetic, TensorBoard events, the run folder."""

from __future__ import annotations

import re

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from torchtitan_lite.components.metrics import (
    MetricsLogger,
    cpu_share_hint,
    format_duration,
    format_step_line,
    make_run_folder,
)


def test_step_line_exact_format():
    line = format_step_line(
        12,
        loss=6.12341,
        grad_norm=1.2341,
        lr=3e-3,
        tps=2345.4,
        tflops=0.1234,
        mfu=None,
        memory_bytes=int(1.23 * 2**30),
        data_wait_s=4.6e-5,
        elapsed_s=42.2,
        eta_s=190.4,
    )
    assert line == (
        "step  12  loss  6.1234  grad_norm 1.234  lr 3.0e-03  tps 2,345  tflops 0.12  mfu n/a  "
        "mem 1.23GiB  data_wait 0.05ms  elapsed 0:00:42  eta 0:03:10"
    )


def test_step_line_with_mfu_and_unknown_memory():
    line = format_step_line(
        1234,
        loss=10.5,
        grad_norm=12.0,
        lr=1.5e-4,
        tps=1234567.0,
        tflops=312.5,
        mfu=0.3125,
        memory_bytes=None,
        data_wait_s=0.0125,
        elapsed_s=3 * 3600 + 61,
        eta_s=26 * 3600,
    )
    assert line == (
        "step 1234  loss 10.5000  grad_norm 12.000  lr 1.5e-04  tps 1,234,567  tflops 312.50  mfu "
        "31.25%  mem n/a  data_wait 12.50ms  elapsed 3:01:01  eta 26:00:00"
    )


def test_cpu_share_hint_appears_only_below_half_the_threads_with_the_load():
    assert cpu_share_hint(8.0, 10.0, 2, load=5.23) == "cpu 0.8/2 load 5.2"  # 0.8 < 0.5 x 2 threads
    assert cpu_share_hint(10.0, 10.0, 2, load=5.0) == ""  # 1.0 = half of 2 threads: no hint
    assert cpu_share_hint(0.4, 1.0, 1, load=3.0) == "cpu 0.4/1 load 3.0"
    with pytest.raises(ValueError, match="threads >= 1"):
        cpu_share_hint(1.0, 0.0, 2)


def test_step_line_carries_the_cpu_hint_of_its_own_window(tmp_path):
    logger = _logger(tmp_path, enable_tensorboard=False, log_freq=1, cpu_threads=2)
    starved = logger.log_step(
        1,
        loss=5.0,
        grad_norm=1.0,
        lr=1e-3,
        tokens_per_step=1000,
        elapsed_s=10.0,
        memory_bytes=None,
        data_wait_s=0.0,
        cpu_s=3.0,
    )  # 0.3 CPU s per s of 2 threads
    assert re.fullmatch(r".*eta 0:\d\d:\d\d  cpu 0\.3/2 load \d+\.\d", starved)
    busy = logger.log_step(
        2,
        loss=5.0,
        grad_norm=1.0,
        lr=1e-3,
        tokens_per_step=1000,
        elapsed_s=20.0,
        memory_bytes=None,
        data_wait_s=0.0,
        cpu_s=3.0 + 19.0,
    )  # this window: 1.9 of 2
    assert "cpu" not in busy


def test_duration_rejects_negative():
    assert format_duration(0) == "0:00:00" and format_duration(59.5) == "0:01:00"
    assert format_duration(59.49) == "0:00:59"
    with pytest.raises(ValueError, match="got -1"):
        format_duration(-1)


def _logger(tmp_path, **kw):
    args = dict(
        enable_tensorboard=True,
        tb_subfolder="tb",
        rank=0,
        log_freq=10,
        total_steps=100,
        world_size=2,
        num_flops_per_token=6e6,
        peak_flops=1e12,
    )
    args.update(kw)
    return MetricsLogger(tmp_path, **args)


def _step(logger, step, elapsed_s, loss=5.0, tokens=1000, data_wait_s=0.0):
    """What the trainer does after each step: a line only when it is due (None otherwise)."""
    if not logger.due(step):
        return None
    return logger.log_step(
        step,
        loss=loss,
        grad_norm=1.0,
        lr=1e-3,
        tokens_per_step=tokens,
        elapsed_s=elapsed_s,
        memory_bytes=2**30,
        data_wait_s=data_wait_s,
    )


def test_throughput_mfu_and_eta_use_the_window_since_last_line(tmp_path, capsys):
    logger = _logger(tmp_path)
    first = _step(logger, 1, elapsed_s=4.0)  # first step of the run: printed; 1000 tok / 4 s
    assert "tps 250  tflops 0.00  mfu 0.15%" in first  # 6e6 * 250 = 1.5e9 FLOP/s of 1e12
    assert first.endswith("elapsed 0:00:04  eta 0:06:36")  # 4 s/step * 99 steps
    assert [_step(logger, s, elapsed_s=4.0 + (s - 1) * 0.5) for s in range(2, 10)] == [None] * 8
    line = _step(
        logger, 10, elapsed_s=8.5, data_wait_s=0.0045
    )  # 9 steps, 9000 tokens in 4.5 s -> 2000 tok/s
    assert "tps 2,000  tflops 0.01  mfu 1.20%" in line  # 6e6 * 2000 = 1.2e10 of 1e12
    assert "data_wait 0.50ms" in line  # 4.5 ms over the window's 9 steps
    assert line.endswith("elapsed 0:00:09  eta 0:00:45")  # 0.5 s * 90 steps
    assert capsys.readouterr().out.splitlines() == [first, line]
    logger.close()


def test_last_step_is_logged_with_zero_eta(tmp_path):
    logger = _logger(tmp_path, total_steps=7, log_freq=5)
    lines = [_step(logger, s, elapsed_s=float(s)) for s in range(1, 8)]
    assert [i + 1 for i, line in enumerate(lines) if line is not None] == [1, 5, 7]
    assert lines[-1].endswith("eta 0:00:00")
    logger.close()


def test_a_step_that_is_not_due_is_refused(tmp_path):
    logger = _logger(tmp_path, enable_tensorboard=False)
    _step(logger, 1, elapsed_s=1.0)
    assert not logger.due(2) and logger.due(10)
    with pytest.raises(ValueError, match="step 2 is not due"):
        logger.log_step(
            2,
            loss=1.0,
            grad_norm=1.0,
            lr=1e-3,
            tokens_per_step=1,
            elapsed_s=2.0,
            memory_bytes=None,
            data_wait_s=0.0,
        )


def test_unknown_peak_prints_na(tmp_path):
    logger = _logger(tmp_path, peak_flops=None, enable_tensorboard=False)
    assert "mfu n/a" in _step(logger, 1, elapsed_s=1.0)
    with pytest.raises(ValueError, match="peak_flops must be > 0 or None .* got 0"):
        _logger(tmp_path, peak_flops=0)


def test_tensorboard_scalars_read_back(tmp_path):
    logger = _logger(tmp_path, log_freq=1, total_steps=3)
    for step, loss in ((1, 7.5), (2, 6.25), (3, 5.125)):
        _step(logger, step, elapsed_s=float(step), loss=loss)
    logger.log_validation(3, 5.5, 4096)
    logger.log_text(["model qwen3 debug", "world size 2"])
    logger.close()
    acc = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss/train")] == [
        (1, 7.5),
        (2, 6.25),
        (3, 5.125),
    ]
    assert [(e.step, e.value) for e in acc.Scalars("loss/validation")] == [(3, 5.5)]
    assert [e.value for e in acc.Scalars("tokens_seen")] == [2000, 4000, 6000]
    assert [e.value for e in acc.Scalars("memory_gib")] == [1.0, 1.0, 1.0]
    assert acc.Scalars("mfu")[1].value == pytest.approx(0.6)  # 1000 tok/s * 6e6 / 1e12, in percent
    assert set(acc.Tags()["scalars"]) == {
        "loss/train",
        "loss/validation",
        "grad_norm",
        "lr",
        "tps",
        "tflops",
        "mfu",
        "memory_gib",
        "data_wait_ms",
        "tokens_seen",
    }


def test_only_rank_zero_writes_tensorboard(tmp_path):
    logger = _logger(tmp_path, rank=1)
    _step(logger, 1, elapsed_s=1.0)
    logger.close()
    assert not (tmp_path / "tb").exists()


def test_run_folder_name_is_readable_and_unique(tmp_path):
    first = make_run_folder(tmp_path / "outputs", "qwen3", "debug")
    second = make_run_folder(tmp_path / "outputs", "qwen3", "debug")
    assert re.fullmatch(r"qwen3-debug-\d{8}-\d{6}", first.name) and first.is_dir()
    assert second.is_dir()
    # same second -> suffix "-2"; the clock ticked in between -> a later timestamp
    assert second.name == first.name + "-2" or second.name > first.name


def test_scalars_and_lines_given_by_a_model_are_written_and_printed(tmp_path, capsys):
    logger = _logger(tmp_path)
    logger.log_scalars(3, {"moe/layers.1.moe/max_load": 3.0, "moe/layers.1.moe/min_load": 0.0})
    logger.log_line("step   3  anything the model reports")
    logger.close()
    assert capsys.readouterr().out.strip() == "step   3  anything the model reports"
    acc = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert [(e.step, e.value) for e in acc.Scalars("moe/layers.1.moe/max_load")] == [(3, 3.0)]
    assert [(e.step, e.value) for e in acc.Scalars("moe/layers.1.moe/min_load")] == [(3, 0.0)]


def test_eta_is_the_moving_average_of_the_last_steps_without_the_first_step_and_pauses(tmp_path):
    # step 1: 30 s of warm-up; steps 2-25: 1 s each; steps 26-40: 3 s each; a 100 s validation pause
    # after step 20
    logger = _logger(tmp_path, log_freq=1, total_steps=100, enable_tensorboard=False, eta_window=10)
    elapsed, lines = 0.0, {}
    for step in range(1, 41):
        elapsed += 30.0 if step == 1 else 1.0 if step <= 25 else 3.0
        lines[step] = _step(logger, step, elapsed_s=elapsed)
        if step == 20:
            logger.add_pause(100.0)
            elapsed += 100.0
    assert lines[1].endswith("eta 0:49:30")  # only step 1 is known: 30 s * 99 steps
    assert lines[2].endswith("eta 0:01:38")  # step 1 left out: 1 s * 98
    assert "tps 1,000 " in lines[21] and lines[21].endswith(
        "eta 0:01:19"
    )  # the pause is not a step: 1 s * 79
    assert lines[30].endswith("eta 0:02:20")  # steps 21-30: five of 1 s, five of 3 s -> 2 s * 70
    assert lines[40].endswith("eta 0:03:00")  # steps 31-40: 3 s * 60


def test_step_time_average_keeps_whole_windows_covering_the_last_steps():
    from torchtitan_lite.components.metrics import StepTimeAverage

    average = StepTimeAverage(window=20)
    assert average.seconds_per_step() is None
    average.add(1, 50.0)  # the first step of the run
    assert average.seconds_per_step() == 50.0
    for _ in range(3):
        average.add(10, 10.0)  # windows of 10 steps (log_freq = 10) at 1 s per step
    average.add(10, 30.0)  # 3 s per step: the last two windows (20 steps) remain
    assert average.seconds_per_step() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="need steps >= 1 and seconds >= 0, got 0, 1.0"):
        average.add(0, 1.0)


def test_paused_time_is_left_out_of_throughput(tmp_path):
    logger = _logger(tmp_path, log_freq=5, enable_tensorboard=False)
    _step(logger, 1, elapsed_s=1.0)
    with logger.paused():
        pass  # a real pause measures its own wall time; this one is ~0 s
    logger.add_pause(2.0)  # e.g. a validation of 2 s after step 1
    line = _step(logger, 5, elapsed_s=7.0)  # 4 steps in 6 s, 2 of them paused: 4000 tokens in 4 s
    assert "tps 1,000 " in line and line.endswith("eta 0:01:35")  # 1 s per step * 95


def test_tokens_per_source_go_to_tensorboard_each_time_and_print_only_when_asked(tmp_path, capsys):
    logger = _logger(tmp_path, log_freq=1, total_steps=2)
    logger.log_source_tokens(1, {"web": 70, "code": 30}, echo=False)
    logger.log_source_tokens(2, {"web": 140, "code": 60})
    logger.close()
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["step   2  tokens per source: web 140 (70.0%), code 60 (30.0%)"]
    acc = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert [e.value for e in acc.Scalars("tokens_seen/web")] == [70, 140]
