"""A user error is one line (exit 2 while building the run, 1 while training); a bug shows its
traceback (exit 1)."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from ckpt_helpers import text_file, tiny_job
from dist_helpers import launcher_copy, run_train

from torchtitan_lite import train
from torchtitan_lite.models import get_model_spec

BUG = """

def _injected_bug(self, *args, **kwargs):
    raise TypeError("injected bug in forward")


from torchtitan_lite.models import get_model_spec as _get_model_spec  # noqa: E402

_get_model_spec("qwen3").model_cls.forward = _injected_bug
"""


def _args(tmp_path, *extra: str) -> list[str]:
    return tiny_job(tmp_path, "--training.steps=1", "--checkpoint.enable=false", *extra)


def _error_lines(stderr: str) -> tuple[str, list[str]]:
    """The last line of ``stderr`` and its error lines; a traceback fails the test (progress bars
    may precede)."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    return lines[-1], [line for line in lines if line.startswith(("error: ", "input error: "))]


def test_a_bug_in_the_models_forward_propagates_with_its_type(tmp_path, monkeypatch, capsys):
    text_file(tmp_path, n_plays=1)

    def forward(self, *args, **kwargs):
        raise TypeError("injected bug in forward")

    monkeypatch.setattr(get_model_spec("qwen3").model_cls, "forward", forward)
    with pytest.raises(TypeError, match="injected bug in forward"):
        train.main(_args(tmp_path))
    assert not dist.is_initialized()
    assert "error:" not in capsys.readouterr().err


def test_bad_data_is_one_input_error_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "data.txt").write_text("")
    assert train.main(_args(tmp_path)) == 2
    last, errors = _error_lines(capsys.readouterr().err)
    assert (
        errors == [last]
        and last.startswith("input error: dataset_path ")
        and "holds no documents" in last
    )
    assert not dist.is_initialized()


def test_a_failed_strict_init_check_is_one_error_line_and_exit_1(tmp_path, capsys):
    text_file(tmp_path, n_plays=1)
    assert (
        train.main(_args(tmp_path, "--model.overrides.output_init_std=1.0", "--debug.strict_init"))
        == 1
    )
    last, errors = _error_lines(capsys.readouterr().err)
    assert errors == [last] and last.startswith("error: ") and "output.weight" in last
    assert last.endswith("(debug.strict_init is on)")
    assert not dist.is_initialized()


@pytest.mark.multiprocess
def test_run_train_sh_shows_a_bugs_traceback_and_exits_1(tmp_path):
    work = launcher_copy(tmp_path)
    with open(
        work / "torchtitan_lite" / "components" / "loss.py", "a"
    ) as handle:  # the trainer's import
        handle.write(BUG)
    text_file(tmp_path, n_plays=1)
    proc = run_train(_args(tmp_path), cwd=work, TMPDIR=str(tmp_path))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert (
        "Traceback (most recent call last)" in output
        and "TypeError: injected bug in forward" in output
    )
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("error: training failed (torchrun exit status 1)")
    )
    assert "input error" not in output
