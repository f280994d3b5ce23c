"""compare_runs: per-step differences of TensorBoard scalars, --assert-equal exit status, the PNG."""

import pytest
from torch.utils.tensorboard import SummaryWriter

from torchtitan_lite.tools.compare_runs import compare, load_scalars, main

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
    assert "b vs a: 5 common steps, max |diff| 0 (atol 0), equal within atol" in capsys.readouterr().out


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
    assert pixels.shape == (540, 960, 4)


def test_missing_tag_or_events_exit_2_with_the_reason(tmp_path, capsys):
    a = write_run(tmp_path / "a", LOSSES)
    assert main([a, a, "--tag", "loss/nope"]) == 2
    assert "no scalar 'loss/nope'" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([a, str(tmp_path / "empty")]) == 2
    assert "no TensorBoard event files" in capsys.readouterr().err


def test_runs_with_different_steps_list_the_missing_ones(tmp_path):
    a, b = write_run(tmp_path / "a", LOSSES), write_run(tmp_path / "b", LOSSES[:3])
    result = compare(load_scalars(a, "loss/train"), load_scalars(b, "loss/train"), atol=0.0)
    assert result.steps == [1, 2, 3] and result.missing == [4, 5] and result.max_abs == 0.0
    assert main([a, b, "--assert-equal"]) == 1
