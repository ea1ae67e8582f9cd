"""A real ``python -m sglang.launch_server --speculative-algorithm sage``: bad SAGE values abort early and cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("sglang")

pytestmark = pytest.mark.slow

#: SGLang's own import takes ~10 s on a busy 2-core box; resolution fails right after it.
ABORT_WITHIN_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(target_dir, env, *extra: str) -> tuple[int, str, float]:
    """Launch the server in its own process group; return (exit code, output, seconds). Never leaks it."""
    import torch

    device = [] if torch.cuda.is_available() else ["--device", "cpu"]
    argv = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(target_dir), *device, "--host", "127.0.0.1", "--port", str(_free_port()),
        "--speculative-algorithm", "sage", "--speculative-draft-model-path", str(target_dir),
        "--max-total-tokens", "4096", "--mem-fraction-static", "0.85", *extra,
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=ABORT_WITHIN_S + 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"launch_server did not abort within {ABORT_WITHIN_S + 60} s:\n{out[-4000:]}")
    elapsed = time.monotonic() - start
    # Nothing of the launch may be left: its process group (leader included) must be empty.
    deadline = time.monotonic() + 10
    while True:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("processes of the aborted launch were still alive 10 s after it exited")
        time.sleep(0.5)
    return proc.returncode, out, elapsed


def test_bad_sage_value_aborts_launch(target_dir, launch_env):
    code, out, elapsed = _launch(target_dir, launch_env, "--sage-w-max", "99")
    assert code != 0, out[-4000:]
    expected = "--sage-w-max must be an integer in [2, 10] (--sage-w-min <= --sage-w-max <= --sage-k), got 99"
    assert expected in out, out[-4000:]
    assert out.rstrip().splitlines()[-1].endswith(expected)  # the last line says it all
    assert "Load weight begin" not in out  # aborted before any model was loaded
    assert elapsed < ABORT_WITHIN_S


def test_unparsable_sage_value_is_an_argparse_error(target_dir, launch_env):
    code, out, _ = _launch(target_dir, launch_env, "--sage-use-history", "maybe")
    assert code == 2, out[-4000:]
    assert "argument --sage-use-history: expected true or false, got 'maybe'" in out
