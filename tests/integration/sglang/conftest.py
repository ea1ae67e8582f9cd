"""Fixtures for the SGLang integration tier: they need the pinned SGLang (``tools/setup.sh --sglang``).

Every test module here starts with ``pytest.importorskip("sglang")``, so the tier skips in a venv
without SGLang.  This conftest imports no SGLang at module level for the same reason.

Run: ``.venv/bin/python -m pytest -q tests/integration/sglang`` (the repository's ``conftest.py`` loads the
user-space libcuda ``import sgl_kernel`` needs on a machine without an NVIDIA driver and sets
``SGLANG_USE_CPU_ENGINE=1``, as ``source .sglang-libcuda/env.sh`` does for a shell).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[3]
#: the shipped CPU config every SAGE server of the tier starts from
CPU_CONFIG = REPO / "engine_configs" / "sglang" / "smollm2_cpu_sage.yaml"
#: The SmolLM2 target used as both target and (STANDALONE) draft in launch tests.
TARGET_DIR = Path.home() / ".cache" / "sage_plugin" / "smollm2-135m-instruct-f32"
RESULT_PREFIX = "RESULT "


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test process's environment without SAGE_* variables (each test sets its own), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(extra or {})
    return env


@pytest.fixture(scope="session")
def run_python() -> Callable[..., dict[str, Any]]:
    """Run a Python snippet in a fresh interpreter; it reports by printing ``RESULT <json>`` last.

    Returns a callable ``run(code, env=None, timeout=240) -> dict`` (the JSON) that fails the test,
    with the child's output, when the child exits non-zero or prints no result.
    """

    def run(code: str, env: dict[str, str] | None = None, timeout: float = 240) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            cwd=REPO,
            env=_clean_env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
        if proc.returncode != 0 or not lines:
            pytest.fail(
                f"child exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
            )
        return json.loads(lines[-1][len(RESULT_PREFIX) :])

    return run


@pytest.fixture(scope="session")
def sglang_plugins() -> None:
    """SGLang's ``load_plugins()`` in this process (once): the SAGE hooks are applied, SAGE is registered."""
    pytest.importorskip("sglang")
    from sglang.srt.plugins import load_plugins

    load_plugins()


@pytest.fixture(scope="session")
def target_dir() -> Path:
    if not (TARGET_DIR / "config.json").exists():
        pytest.skip(f"SmolLM2 target not found at {TARGET_DIR} (tools/setup.sh downloads it)")
    return TARGET_DIR


@pytest.fixture(scope="session")
def launch_env() -> dict[str, str]:
    """Environment for a real ``sglang.launch_server`` child; skips where SGLang cannot run at all."""
    import torch

    if not torch.cuda.is_available() and os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":
        pytest.skip("no CUDA and SGLANG_USE_CPU_ENGINE is not 1: run tools/setup.sh --sglang (it unpacks libcuda)")
    return _clean_env()


def launch_servers(env: dict[str, str], *launches: tuple[list[str], Path]) -> list:
    """Start one ``sglang.launch_server`` per ``(args, log)`` side by side and wait for them all; any start failing
    stops them all.  On the 2-core CI machine the SmolLM2 pair starts in 64 s against 130 s one after the other (the
    Qwen2-VL pair gains nothing: 90 against 92 s)."""
    from sage_plugin.bench.servers import Server

    servers: list = []
    try:
        for args, log in launches:
            servers.append(Server(args, env, log, wait=False))
        for server in servers:
            server.wait_ready()
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def draft_dir(target: Path) -> Path:
    """The bundled trained draft (else the target's first 4 layers)."""
    from sage_plugin.models import bundled_draft_dir, truncated_draft

    return bundled_draft_dir() or truncated_draft(target, 4)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the shared :func:`servers` pair run after this tier's other tests (in their own order, those
    marked ``fresh_pair`` first).

    The pair lives until the tier ends (package scope); run first, its two idle servers would hold their memory while
    the tier's other servers start, and on CPU SGLang sizes each KV pool from the free memory it measures while
    loading.  A ``fresh_pair`` test needs SAGE's tier control as a new server has it: the traffic of other tests (a
    load of random prompts, say) teaches it that drafting does not pay, and a control that learned so rightly keeps
    speculation off, so a test that must see drafted steps runs before that traffic.  Only this directory's items move,
    within the slots they already hold."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if here in Path(str(item.path)).parents]
    mine = [items[i] for i in slots]

    def on_pair(item: pytest.Item) -> bool:
        module = getattr(item, "module", None)
        return "servers" in getattr(item, "fixturenames", ()) and not hasattr(module, "servers")

    pair = [item for item in mine if on_pair(item)]
    pair.sort(key=lambda item: item.get_closest_marker("fresh_pair") is None)  # stable: fresh_pair first
    ordered = [item for item in mine if not on_pair(item)] + pair
    for i, item in zip(slots, ordered):
        items[i] = item


@pytest.fixture(scope="package")
def servers(target_dir, launch_env, tmp_path_factory):
    """``(plain, sage)``, shared by the modules of this tier: plain SGLang with the shipped CPU YAML's non-speculative
    flags and SAGE from the YAML itself (the bundled trained draft), both accepting custom logit processors.

    Plain runs without the overlap scheduler: with it, SGLang 0.5.23's plain decoding feeds the frequency / presence /
    repetition penalizers one token late (``docs/user-guide/serving-sglang.md``, "Request parameters"), and SAGE gives
    plain decoding's exact output, which is the scheduler-independent one.  Outputs without those penalties are the
    same either way."""
    from sage_plugin.bench.serving import plain_flags

    logs = tmp_path_factory.mktemp("sglang_logs")
    extra = ["--enable-custom-logit-processor"]
    plain, sage = launch_servers(
        launch_env,
        (["--model-path", str(target_dir), *plain_flags(CPU_CONFIG), "--disable-overlap-schedule", *extra],
         logs / "plain.log"),
        (["--config", str(CPU_CONFIG), "--model-path", str(target_dir), "--speculative-draft-model-path",
          str(draft_dir(target_dir)), "--enable-metrics", *extra], logs / "sage.log"),
    )  # fmt: skip
    yield plain, sage
    sage.stop()
    plain.stop()


@pytest.fixture(scope="module")
def kv_start(servers):
    """Free KV tokens of the module's SAGE server (its ``servers`` fixture: ``(plain, sage)``) before the load, with
    the radix cache flushed (the warm-up request left its prefix there)."""
    _, sage = servers
    sage.post("/flush_cache", {})
    return sage.get("/server_info")["internal_states"][0]["sage"]["kv_available_tokens"]
