"""A run is resolved once per process (docs/design.md, "Note: one resolved run"): the model args are
built once by a worker started alone, once by the launcher's check and once by each worker it
starts, once by ``inspect_init`` and ``generate``; the Trainer reads the run it is given and calls
no resolution of the config again."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import pytest
from ckpt_helpers import text_file, tiny_job

import torchtitan_lite.preflight.model_args as model_args
from torchtitan_lite import generate, train
from torchtitan_lite.preflight.checks import load_run
from torchtitan_lite.preflight.resolved import RESOLVED_CONFIG_ENV, write_resolved
from torchtitan_lite.tools import inspect_init

TRAIN = Path(train.__file__)


@pytest.fixture
def builds(monkeypatch) -> list[str]:
    """The model name of every ``build_model_args`` call in this process, under any name a module
    imported."""
    calls, real = [], model_args.build_model_args

    def counted(config):
        calls.append(config.model.name)
        return real(config)

    for module in list(sys.modules.values()):
        if (
            getattr(module, "__name__", "").startswith("torchtitan_lite")
            and getattr(module, "build_model_args", None) is real
        ):
            monkeypatch.setattr(module, "build_model_args", counted)
    return calls


def one_step(tmp_path: Path) -> list[str]:
    text_file(tmp_path, n_plays=1)
    return tiny_job(tmp_path, "--training.steps=1", "--checkpoint.enable=false")


def test_a_worker_started_alone_builds_the_model_args_once(tmp_path, builds):
    assert train.main(one_step(tmp_path)) == 0
    assert builds == ["qwen3"]


def test_the_launchers_check_and_its_worker_each_build_the_model_args_once(
    tmp_path, builds, monkeypatch
):
    argv = one_step(tmp_path)
    run = load_run(argv)  # what python -m torchtitan_lite.preflight does, then writes
    write_resolved(run.config, str(tmp_path / "resolved.json"))
    assert builds == ["qwen3"]
    builds.clear()
    monkeypatch.setenv(RESOLVED_CONFIG_ENV, str(tmp_path / "resolved.json"))
    assert train.main(argv) == 0
    assert builds == ["qwen3"]


def test_inspect_init_builds_the_model_args_once(tmp_path, builds, capsys):
    assert inspect_init.main([*one_step(tmp_path), "--meta"]) == 0
    assert builds == ["qwen3"]
    assert "expected step-1 loss" in capsys.readouterr().out


def test_generate_builds_the_model_args_once(tmp_path, builds, capsys):
    text_file(tmp_path, n_plays=1)
    job = tiny_job(tmp_path, "--training.steps=1", "--checkpoint.interval=1")
    assert train.main(job) == 0
    builds.clear()
    step = tmp_path / "out" / "checkpoint" / "step-1"
    argv = ["--prompt", "ROMEO:", "--max_new_tokens", "2", *job, f"--checkpoint.load_path={step}"]
    assert generate.main(argv) == 0
    assert builds == ["qwen3"]
    assert capsys.readouterr().out.splitlines()[-1].startswith("generated ids: ")


def names_imported_from(tree: ast.Module, prefixes: tuple[str, ...]) -> set[str]:
    """The names ``tree`` imports with ``from <module> import name`` from a module under
    ``prefixes``."""
    return {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module.startswith(prefixes)
        for alias in node.names
    }


def test_the_trainer_calls_nothing_of_the_config_floor_but_the_memory_check_of_its_node():
    tree = ast.parse(TRAIN.read_text(encoding="utf-8"))
    floor = names_imported_from(tree, ("torchtitan_lite.config", "torchtitan_lite.preflight"))
    trainer = next(
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Trainer"
    )
    called = {
        node.func.id
        for node in ast.walk(trainer)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert "load_run" in floor and "init_distributed" in called  # the scan sees both sides
    assert called & floor == {"check_memory"}  # this node's share of memory: known after the group


def test_the_trainers_init_is_at_most_60_lines():
    assert len(inspect.getsourcelines(train.Trainer.__init__)[0]) <= 60
