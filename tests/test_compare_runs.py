"""compare_runs: per-step differences of TensorBoard scalars, --assert-equal exit status, the
PNG."""

import json

import pytest
from torch.utils.tensorboard import SummaryWriter

from torchtitan_lite.tools.compare_runs import (
    CompareError,
    compare,
    curves_figure,
    labels_of,
    load_scalars,
    main,
)

LOSSES = [7.71, 7.02, 6.55, 6.13, 5.90]


def write_run(folder, losses, tag="loss/train"):
    """A run folder like the trainer's: events in <folder>/tb, one scalar per step from 1."""
    with SummaryWriter(log_dir=str(folder / "tb")) as writer:
        for step, value in enumerate(losses, start=1):
            writer.add_scalar(tag, value, step)
    return str(folder)


def test_identical_runs_differ_by_zero_and_pass_assert_equal(tmp_path, capsys):
    a, b = write_run(tmp_path / "a", LOSSES), write_run(tmp_path / "b", LOSSES)
    result = compare(load_scalars(a, "loss/train"), load_scalars(b, "loss/train"), atol=0.0)
    assert result.steps == [1, 2, 3, 4, 5] and result.diffs == [0.0] * 5
    assert result.max_abs == 0.0 and result.first_beyond is None and result.missing == []
    assert main([a, b, "--assert-equal"]) == 0
    assert (
        "run 1 (b) vs run 0 (a): 5 common steps (1-5): max |diff| 0 (atol 0), equal within atol"
        in capsys.readouterr().out
    )


def test_first_differing_step_is_reported_and_assert_equal_exits_1(tmp_path, capsys):
    changed = LOSSES[:2] + [6.5, 6.2, 5.8]
    a, b = write_run(tmp_path / "a", LOSSES), write_run(tmp_path / "b", changed)
    reference, other = load_scalars(a, "loss/train"), load_scalars(b, "loss/train")
    result = compare(reference, other, atol=0.02)  # diffs 0, 0, -0.05, +0.07, -0.1 (fp32 events)
    assert result.first_beyond == 3
    assert result.max_abs == pytest.approx(0.1, abs=1e-6)
    assert compare(reference, other, atol=0.06).first_beyond == 4
    assert main([a, b, "--atol", "0.2", "--assert-equal"]) == 0
    assert main([a, b, "--atol", "0.01", "--assert-equal"]) == 1
    out = capsys.readouterr().out
    assert "first step beyond atol: 3" in out


def test_plot_is_a_png_with_one_curve_per_run(tmp_path):
    import matplotlib.image

    a = write_run(tmp_path / "a", LOSSES)
    b = write_run(tmp_path / "b", [v + 0.5 for v in LOSSES])
    png = tmp_path / "curves.png"
    assert main([a, b, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(str(png))
    assert pixels.shape == (
        720,
        960,
        4,
    )  # 8 x 6 inches at 120 dpi: the curves and, below, their difference


def test_missing_tag_or_events_exit_2_with_the_reason(tmp_path, capsys):
    a = write_run(tmp_path / "a", LOSSES)
    assert main([a, a, "--tag", "loss/nope"]) == 2
    assert "no scalar 'loss/nope'" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([a, str(tmp_path / "empty")]) == 2
    assert "no TensorBoard event files" in capsys.readouterr().err


def test_runs_with_different_steps_are_compared_over_the_common_steps_with_the_ranges_stated(
    tmp_path, capsys
):
    a, b = write_run(tmp_path / "a", LOSSES), write_run(tmp_path / "b", LOSSES[:3])
    result = compare(load_scalars(a, "loss/train"), load_scalars(b, "loss/train"), atol=0.0)
    assert result.steps == [1, 2, 3] and result.missing == [4, 5] and result.max_abs == 0.0
    assert main([a, b, "--assert-equal"]) == 0
    out = capsys.readouterr().out
    assert f"  run 1: b  ({b}; steps 1-3)" in out
    assert (
        "run 1 (b) vs run 0 (a): 3 common steps (1-3): max |diff| 0 (atol 0), equal within atol; "
        "steps in one of them only: 4-5"
    ) in out


def test_a_resumed_run_equals_the_full_run_over_the_steps_after_the_resume(tmp_path, capsys):
    full = write_run(tmp_path / "full", LOSSES)
    resumed = tmp_path / "resumed"
    with SummaryWriter(
        log_dir=str(resumed / "tb")
    ) as writer:  # resumed at step 3: logs steps 4 and 5
        for step in (4, 5):
            writer.add_scalar("loss/train", LOSSES[step - 1], step)
    assert main([full, str(resumed), "--assert-equal", "--names", "full", "resumed at 3"]) == 0
    out = capsys.readouterr().out
    assert (
        "run 1 (resumed at 3) vs run 0 (full): 2 common steps (4-5): max |diff| 0 (atol 0), equal "
        "within atol; steps in one of them only: 1-3"
    ) in out
    apart = write_run(tmp_path / "apart", [])
    with SummaryWriter(log_dir=str(tmp_path / "apart" / "tb")) as writer:
        writer.add_scalar("loss/train", 1.0, 9)
    assert main([full, apart, "--assert-equal"]) == 1  # no common step: nothing was shown equal
    assert "0 common steps (none): nothing to compare" in capsys.readouterr().out


def _run_json(folder, world_size, **config):
    sections = {"job": {"dump_folder": str(folder.parent)}, "training": {"steps": 20, "seed": 42}}
    for key, value in config.items():
        section, name = key.split("__")
        sections[section][name] = value
    (folder / "run.json").write_text(
        json.dumps(
            {
                "world_size": world_size,
                "local_world_size": world_size,
                "argv": [],
                "config": sections,
            }
        )
    )


def test_runs_are_labelled_by_the_settings_that_differ_in_one_order_everywhere(tmp_path, capsys):
    one, two = write_run(tmp_path / "r1", LOSSES), write_run(tmp_path / "r2", LOSSES)
    _run_json(tmp_path / "r1", 1)
    _run_json(tmp_path / "r2", 2)
    assert labels_of([one, two]) == ["NGPU=1", "NGPU=2"]
    _run_json(tmp_path / "r2", 1, training__seed=7)
    assert labels_of([two, one]) == ["training.seed=7", "training.seed=42"]
    plain = write_run(
        tmp_path / "plain" / "r1", LOSSES
    )  # no run.json: the folder names, whole paths if they repeat
    assert labels_of([one, plain]) == [one, plain] and labels_of(
        [plain, write_run(tmp_path / "b", [])]
    ) == ["r1", "b"]
    assert main([two, one]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:3] == [
        f"  run 0: training.seed=7  ({two}; steps 1-5)",
        f"  run 1: training.seed=42  ({one}; steps 1-5)",
    ]
    assert out[-1].startswith(
        "run 1 (training.seed=42) vs run 0 (training.seed=7): 5 common steps (1-5)"
    )
    with pytest.raises(CompareError, match="--names: give one distinct name per run"):
        labels_of([one, two], ["same", "same"])


def test_plot_has_a_title_integer_step_ticks_and_a_difference_panel():
    fig = curves_figure(
        {"NGPU=1": {1: 7.5, 2: 7.0, 3: 6.5}, "NGPU=2": {1: 7.5, 2: 7.25, 3: 6.25}}, "loss/train"
    )
    top, bottom = fig.axes
    assert top.get_title() == "loss/train: NGPU=2 vs NGPU=1"
    assert [line.get_label() for line in top.get_lines()] == ["NGPU=1", "NGPU=2"]
    (diff,) = [line for line in bottom.get_lines() if line.get_label() == "NGPU=2"]
    assert list(diff.get_xdata()) == [1, 2, 3] and list(diff.get_ydata()) == [0.0, 0.25, -0.25]
    fig.canvas.draw()
    ticks = [t for t in bottom.get_xticks() if bottom.get_xlim()[0] <= t <= bottom.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
