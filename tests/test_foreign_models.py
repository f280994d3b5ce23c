"""Every entry point runs from a folder that holds a user's own ``models`` package: ours is
imported as ``torchtitan_lite.models`` (``torchtitan_lite/models``, a symlink to ``models/``), so a
``models/`` in the working directory, first on ``sys.path`` under ``python -m``, shadows nothing of
ours."""

import os
import shutil
import subprocess
import sys

import pytest
from dist_helpers import REPO

CONFIG = str(REPO / "train_configs" / "qwen3_debug.toml")
HELP = [
    "torchtitan_lite.generate",
    "torchtitan_lite.evaluate",
    "torchtitan_lite.tools.inspect_init",
    "torchtitan_lite.tools.compare_runs",
    "torchtitan_lite.data.prepare",
]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A user's project folder: its own ``models`` package, which has none of our registry's
    names."""
    folder = tmp_path_factory.mktemp("project")
    (folder / "models").mkdir()
    (folder / "models" / "__init__.py").write_text('"""A user\'s own models."""\nNAME = "theirs"\n')
    return folder


def run(args: list[str], cwd, **extra: str) -> subprocess.CompletedProcess:
    environ = {
        k: v for k, v in os.environ.items() if k != "PYTHONPATH"
    }  # as a user's shell: no path to the repo
    return subprocess.run(
        args,
        cwd=cwd,
        env={**environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable, **extra},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_user_s_models_package_is_the_one_python_finds_there(project):
    probe = run(
        [
            sys.executable,
            "-c",
            "import models, torchtitan_lite.models as ours; print(models.NAME, "
            "ours.model_names()[0])",
        ],
        project,
    )
    assert (probe.returncode, probe.stdout.strip()) == (0, "theirs qwen3"), probe.stderr


NO_INSTALL = (
    "import sys; sys.meta_path[:] = [f for f in sys.meta_path "
    "if not getattr(f, '__module__', '').startswith('__editable__')]; "
)
"""Drops ``pip install -e``'s finder: the process imports as a clone without an install would."""


def test_a_plain_clone_imports_torchtitan_lite_models_by_pythonpath_alone(project, tmp_path):
    clone = tmp_path / "clone"
    assert os.readlink(REPO / "torchtitan_lite" / "models") == "../models"
    for name in ("torchtitan_lite", "models"):
        shutil.copytree(
            REPO / name, clone / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    code = NO_INSTALL + (
        "import models, torchtitan_lite.models as ours, torchtitan_lite.models.qwen3.model as m; "
        "from pathlib import Path; "
        "print(models.NAME, ours.model_names()[0], Path(ours.__file__), Path(m.__file__).resolve())"
    )
    probe = run([sys.executable, "-c", code], project, PYTHONPATH=str(clone))
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.split() == [
        "theirs",
        "qwen3",
        str(clone / "torchtitan_lite" / "models" / "__init__.py"),
        str((clone / "models" / "qwen3" / "model.py").resolve()),
    ]


@pytest.mark.parametrize("module", HELP)
def test_every_python_m_tool_starts_beside_a_foreign_models_package(project, module):
    proc = run([sys.executable, "-m", module, "--help"], project)
    assert proc.returncode == 0 and module.split(".")[-1] in proc.stdout, proc.stderr[-2000:]


def test_the_preflight_and_inspect_init_resolve_the_model_beside_a_foreign_models_package(project):
    check = run(
        [sys.executable, "-m", "torchtitan_lite.preflight", "--job.config_file", CONFIG], project
    )
    assert (check.returncode, check.stderr) == (0, ""), check.stderr[-2000:]
    inspect = run(
        [
            sys.executable,
            "-m",
            "torchtitan_lite.tools.inspect_init",
            "--job.config_file",
            CONFIG,
            "--meta",
            "--out",
            str(project / "inspect"),
        ],
        project,
    )
    assert inspect.returncode == 0 and "expected step-1 loss" in inspect.stdout, inspect.stderr[
        -2000:
    ]


@pytest.mark.multiprocess
def test_run_train_sh_trains_beside_a_foreign_models_package(project):
    proc = run(
        [
            str(REPO / "run_train.sh"),
            "--training.steps=1",
            "--lr_scheduler.warmup_steps=0",
            "--validation.enable=false",
            "--metrics.enable_tensorboard=false",
            f"--job.dump_folder={project / 'outputs'}",
        ],
        project,
        CONFIG_FILE=CONFIG,
    )
    assert proc.returncode == 0 and "step-1 check" in proc.stdout + proc.stderr, proc.stderr[-3000:]
