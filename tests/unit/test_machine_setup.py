"""``sage setup`` (sage_plugin/machine_setup.py): one line per item, the exit status from the required steps, and the
SGLang check naming what is missing with the command that provides it (it installs nothing)."""

from __future__ import annotations

import pytest

from sage_plugin import machine_setup
from sage_plugin.cli import main
from sage_plugin.compat import SGLANG_VERSION, installed_version
from sage_plugin.runtimes.sglang.cpu_env import LIBCUDA_SUBDIR


def test_without_a_driver_the_missing_libcuda_names_the_script_that_fetches_it(tmp_path):
    problems = machine_setup.sglang_problems(tmp_path, driver=False)
    assert any("no NVIDIA driver and no libcuda.so.1" in p and "tools/setup_sglang.sh" in p for p in problems)
    (tmp_path / LIBCUDA_SUBDIR).mkdir(parents=True)
    (tmp_path / LIBCUDA_SUBDIR / "libcuda.so.1").write_bytes(b"")
    assert not any("libcuda" in p for p in machine_setup.sglang_problems(tmp_path, driver=False))
    assert not any("libcuda" in p for p in machine_setup.sglang_problems(tmp_path / "none", driver=True))


def test_the_sglang_check_follows_the_installed_version(tmp_path):
    problems = machine_setup.sglang_problems(tmp_path, driver=True)
    if installed_version("sglang") == SGLANG_VERSION:
        assert problems == []  # the venv CI runs in: the pinned SGLang and this package's entry point
    else:
        assert any(p.startswith("sglang ") and SGLANG_VERSION in p for p in problems), problems


def test_setup_reports_each_step_and_fails_only_on_a_required_one(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(machine_setup, "_target", lambda cache: str(cache / "smollm2"))
    monkeypatch.setattr(machine_setup, "_kernels", lambda: [("rows linear", False, "not built (no c++): weight-major")])
    monkeypatch.setattr(machine_setup, "sglang_problems", lambda libcuda_dir: [])
    assert main(["setup", "--cache-dir", str(tmp_path), "--sglang"]) == 0  # a kernel not built is not a failure
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(" (")[0] for ln in lines] == [
        f"ok target: {tmp_path / 'smollm2'}",
        "-- rows linear: not built",
        "ok sglang: ready: --speculative-algorithm sage",
    ]
    monkeypatch.setattr(machine_setup, "sglang_problems", lambda libcuda_dir: ["sglang not installed: fix"])
    assert main(["setup", "--cache-dir", str(tmp_path), "--sglang"]) == 1
    assert "-- sglang: sglang not installed: fix" in capsys.readouterr().out


@pytest.mark.slow  # loads each kernel (a ninja check each) and the converted target: about 10 s
def test_setup_on_this_machine_builds_every_kernel_it_can(capsys):
    assert main(["setup"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok target: ") and out.count("\n") == 5
    for name in ("rows linear", "paged attention", "Llama decoder", "beam level"):
        assert f" {name}: " in out
