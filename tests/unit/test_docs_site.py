"""The documentation site builds with ``mkdocs build --strict``: no broken link or anchor, every page in ``nav``.

``mkdocs.yml`` turns each of those into a warning, and strict mode fails on any warning.  The build needs the ``dev``
extra's ``mkdocs-material``; without it the test is skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs-material is not installed (pip install -e '.[dev]' installs it)",
)
def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").is_file()
