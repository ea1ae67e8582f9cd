"""Repository-wide pytest configuration.

``--doctest-modules`` imports every module under ``sage_plugin/``.  Adapter modules that subclass a
runtime's classes import that runtime at module level; without the runtime installed (a venv set up by
plain ``tools/setup.sh``) they are left out of doctest collection instead of failing it.  Their tests live
in ``tests/integration/<runtime>/`` and skip there.

With SGLang installed (``tools/setup.sh --sglang``) on a machine without an NVIDIA driver, the CUDA-built
``sgl_kernel`` links ``libcuda.so.1``: ``tools/setup_sglang.sh`` unpacks Debian's user-space copy into
``.sglang-libcuda/``.  This file does what ``source .sglang-libcuda/env.sh`` does for a shell, before any
test imports SGLang: it loads that library into this process (the loader then resolves ``sgl_kernel``'s
dependency to it), puts its directory on ``LD_LIBRARY_PATH`` for the servers the tests launch, and selects
SGLang's CPU engine.  So README's single test command also runs the SGLang tier.  ``HF_HUB_OFFLINE`` is set for the
whole test run (below).

Tests come in tiers, marked here from where they live (``pytest -m``; CONTRIBUTING.md gives each tier's command and
wall time): ``unit`` (tests/unit and the doctests under sage_plugin/ and tests/oracles: no real model, no server),
``engine`` (tests/engine: the real SmolLM2 in this process), ``sglang`` (tests/integration/sglang: real SGLang
servers).  ``slow`` is marked by hand on tests that take more than a few seconds on a 2-core CPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
from pathlib import Path

import pytest

# Tests never reach a model hub (nothing is downloaded at run time): a model id that is not a local directory (the
# launch-validation tests pass "target") fails the hub lookup at once instead of retrying the network, 23 s a lookup
# on a machine where the hub does not answer.  Set before anything imports huggingface_hub, which reads it on import;
# the SGLang servers the tests launch inherit it.
os.environ["HF_HUB_OFFLINE"] = "1"

from sage_plugin.runtimes.sglang.cpu_env import cpu_launch_env, unpacked_libcuda  # noqa: E402

REPO = Path(__file__).resolve().parent

collect_ignore: list[str] = []
if importlib.util.find_spec("sglang") is None:
    collect_ignore += [
        "sage_plugin/runtimes/sglang/algo.py",
        "sage_plugin/runtimes/sglang/draft_worker.py",
        "sage_plugin/runtimes/sglang/worker.py",
    ]
elif ctypes.util.find_library("cuda") is None and (lib := unpacked_libcuda(REPO / ".sglang-libcuda")) is not None:
    ctypes.CDLL(str(lib / "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)
    os.environ.update(cpu_launch_env(os.environ, lib))

# Each SGLang server (and each torch.distributed rank) the tests start runs its torch ops on OpenMP threads bound to
# every core; libgomp's default waits by spinning, so two busy processes on a 2-core machine spin against each other
# and run about 4x slower together than passive waiting lets them (docs/user-guide/serving-sglang.md,
# "Troubleshooting").  Set after this process loaded torch, so only the processes the tests start wait passively.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

#: tier marker of each test directory (paths relative to the repository)
TIERS = {
    "tests/unit": "unit",
    "tests/oracles": "unit",
    "tests/engine": "engine",
    "tests/integration/sglang": "sglang",
    "sage_plugin": "unit",
}


def tier_of(path: Path) -> str | None:
    """The tier marker of a test file: the one of the deepest :data:`TIERS` directory holding it.

    >>> tier_of(REPO / "tests/integration/sglang/test_launch.py"), tier_of(REPO / "sage_plugin/core/entropy.py")
    ('sglang', 'unit')
    """
    rel = path.resolve().relative_to(REPO).as_posix()
    found = [d for d in TIERS if rel.startswith(d + "/")]
    return TIERS[max(found, key=len)] if found else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every collected test with its tier (:func:`tier_of`)."""
    for item in items:
        tier = tier_of(Path(str(item.path)))
        if tier is not None:
            item.add_marker(tier)
