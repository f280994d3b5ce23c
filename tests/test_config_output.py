"""What the config prints: ``--help`` with the values a config file (and the command line) set, and
a ``--job.print_config`` output that loads as a config file and trains the same run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from ckpt_helpers import TINY_MODEL, TINY_RUN, text_file

from torchtitan_lite.config.cli import config_dict
from torchtitan_lite.config.load import CONFIG_FILE_FROM_ENV
from torchtitan_lite.lifecycle.faults import StopRequest
from torchtitan_lite.preflight import checks as cfg
from torchtitan_lite.train import Trainer

DEBUG = "train_configs/qwen3_debug.toml"
ROOT = Path(__file__).resolve().parents[1]


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as stop:
        cfg.load_run_or_exit([*argv, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_help_with_a_config_file_shows_its_values_beside_the_defaults(capsys):
    text = _help(
        capsys, "--job.config_file", DEBUG, "--training.seed=7", "--model.overrides.max_seq_len=512"
    )
    assert (
        f"'this run:' marks a value set by {DEBUG} or the command line; '=' gives the default"
        in text
    )
    assert (
        f"  --training.steps  int = 200  (>= 1, <= 1000000000000)\n      this run: 400 ({DEBUG} "
        "line 17)\n" in text
    )
    assert f"  --checkpoint.enable  bool = true\n      this run: false ({DEBUG} line 58)\n" in text
    assert (
        "  --training.seed  int = 42  (>= 0)\n      this run: 7 (command line)\n" in text
    )  # the file says 42
    assert (
        "  --model.overrides  table = {}\n      this run: max_seq_len = 512 (command line)\n"
        in text
    )
    assert (
        "  --training.dataset_path  str | None = none\n      Train on local" in text
    )  # not set: default only
    assert _help(capsys) == cfg.help_text() + "\n"  # no file, no options: the defaults only


def test_help_names_a_config_file_that_does_not_read_and_still_shows_the_defaults(tmp_path, capsys):
    text = _help(capsys, "--job.config_file", str(tmp_path / "missing.toml"))
    missing = tmp_path / "missing.toml"
    assert (
        "the values of this run are not shown: job.config_file (command line): no such file "
        f"'{missing}'" in text
    )
    assert (
        "  --training.steps  int = 200  (>= 1, <= 1000000000000)\n      Optimizer steps to train."
        in text
    )


def test_help_names_config_file_when_run_train_sh_supplied_the_file(capsys, monkeypatch):
    monkeypatch.setenv(
        CONFIG_FILE_FROM_ENV, "CONFIG_FILE"
    )  # run_train.sh, CONFIG_FILE set by the user
    text = _help(capsys, "--job.config_file", DEBUG)
    assert (
        f'  --job.config_file  str | None = none\n      this run: "{DEBUG}" (CONFIG_FILE)\n' in text
    )
    # given again after run_train.sh's: the command line's wins
    other = "train_configs/gpt_oss_debug.toml"
    text = _help(capsys, "--job.config_file", DEBUG, f"--job.config_file={other}")
    assert (
        f'  --job.config_file  str | None = none\n      this run: "{other}" (command line)\n'
        in text
    )


@pytest.mark.parametrize(
    "argv, error",
    [
        (
            ["--training.stepz=3"],
            "config error: training.stepz (command line): unknown key (did you mean "
            "training.steps?)",
        ),
        (
            ["--training.steps=abc"],
            "config error: training.steps (command line): expected int, got 'abc'",
        ),
        (
            ["--job.config_file=no_such.toml"],
            "config error: job.config_file (command line): no such file 'no_such.toml'",
        ),
    ],
)
def test_common_config_errors_exit_2_before_torch_is_imported(argv, error):
    probe = (
        f"import runpy, sys\nsys.argv[1:] = {argv!r}\ntry:\n"
        "    runpy.run_module('torchtitan_lite.preflight', run_name='__main__')\n"
        "except SystemExit as stop:\n    print(stop.code, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout == "2 False\n" and done.stderr.startswith(error)


def _train(argv: list[str]) -> list[float]:
    """Train in this process; the loss of every step (read back from the log lines' values)."""
    trainer, stop, losses = Trainer(cfg.parse_run(argv)), StopRequest(), []
    log_step = trainer.metrics.log_step
    trainer.metrics.log_step = lambda step, **kw: (losses.append(kw["loss"]), log_step(step, **kw))[
        1
    ]
    try:
        trainer.train(stop)
    finally:
        stop.restore()
        dist.destroy_process_group()
    return losses


def test_print_config_output_is_a_config_file_that_trains_the_same_run(tmp_path, capsys):
    data = text_file(tmp_path, n_plays=1)
    argv = [
        "--job.config_file",
        DEBUG,
        *TINY_MODEL,
        *TINY_RUN,
        "--training.steps=2",
        "--checkpoint.enable=false",
        f"--training.dataset_path={data}",
        f"--job.dump_folder={tmp_path / 'out'}",
    ]
    with pytest.raises(SystemExit) as stop:
        cfg.load_run_or_exit([*argv, "--job.print_config"])
    assert stop.value.code == 0
    printed = capsys.readouterr().out
    assert not re.search(r"^(# )?(print_config|config_file)\b", printed, re.M)
    saved = tmp_path / "saved.toml"
    saved.write_text(printed)
    again = cfg.load_run_or_exit(["--job.config_file", str(saved)]).config
    assert config_dict(again) == config_dict(cfg.parse_args(argv)) and not again.job.print_config
    first = _train(argv)
    assert _train(["--job.config_file", str(saved)]) == first and len(first) == 2
