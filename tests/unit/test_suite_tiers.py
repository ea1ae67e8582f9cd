"""The test suite's tiers (conftest.py, CONTRIBUTING.md): every collected test carries exactly one tier marker, and
collecting the whole suite builds or loads no CPU kernel library (the tests that need one check for it when they run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TIERS = ("unit", "engine", "sglang")

#: a pytest plugin reporting, once collection is done, each test's tier markers and the kernel libraries loaded so far
PROBE = f"""
import json

import pytest

@pytest.hookimpl(trylast=True)  # after conftest.py has marked the tiers
def pytest_collection_modifyitems(items):
    from sage_plugin.kernels import native

    tiers = {{item.nodeid: [t for t in {TIERS!r} if item.get_closest_marker(t)] for item in items}}
    print("RESULT " + json.dumps({{"tiers": tiers, "loaded": sorted(native._built)}}))
"""


@pytest.mark.slow  # collects the whole suite in a child: about 40 s on a 2-core CPU
def test_collection_marks_one_tier_per_test_and_loads_no_kernel(tmp_path):
    (tmp_path / "tier_probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "tier_probe",
                           "-p", "no:cacheprovider"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(lines[-1][len("RESULT ") :])
    assert len(report["tiers"]) > 1000  # the whole suite was collected
    wrong = {node: tiers for node, tiers in report["tiers"].items() if len(tiers) != 1}
    assert not wrong, sorted(wrong.items())[:10]
    present = {"unit", "engine"} | ({"sglang"} if importlib.util.find_spec("sglang") else set())  # else skipped
    assert {tiers[0] for tiers in report["tiers"].values()} == present
    assert report["loaded"] == [], report["loaded"]
