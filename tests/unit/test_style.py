"""The code is formatted and linted as ``pyproject.toml`` configures ruff (``ruff format``, ``ruff check``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TARGETS = ["sage_plugin", "demo", "tests", "conftest.py"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    # the venv's own ruff (the dev extra pins its range), not whatever is on PATH
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *TARGETS], cwd=REPO, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_ruff_is_clean(command):
    out = _ruff(*command)
    assert out.returncode == 0, out.stdout + out.stderr
