"""The tree is ``ruff check`` and ``ruff format --check`` clean at pyproject's rules and 100 columns
(docs/design.md, "Note: on style")."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True
    )


def test_ruff_check_finds_nothing():
    done = _ruff("check", "--output-format", "concise", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_would_change_nothing():
    done = _ruff("format", "--check", ".")
    assert done.returncode == 0, done.stdout + done.stderr
