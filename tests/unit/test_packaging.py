"""The two distributions built from this repository: the plugin's wheel carries what a GPU server imports and nothing
else (no weights, no prompt sets, no demo-only dependency); ``sage-plugin-demo`` carries every file of ``demo/``.
Both are built the way ``python -m build`` does, from copies of the sources, so the checkout is left untouched."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import tomllib

from sage_plugin import demo_assets
from sage_plugin.compat import SGLANG_VERSION

REPO = Path(__file__).resolve().parents[2]
WHEEL_LIMIT = 2 * 1024 * 1024
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")


def _build(src: Path, out: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dists")
    plugin = root / "plugin"
    plugin.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, plugin / name)
    shutil.copytree(REPO / "sage_plugin", plugin / "sage_plugin", ignore=IGNORED)
    shutil.copytree(REPO / "demo", root / "demo", ignore=IGNORED)
    return {"plugin": _build(plugin, root / "out-plugin"), "demo": _build(root / "demo", root / "out-demo")}


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(z.read(name).decode())


def _project(path: Path) -> dict:
    return tomllib.loads(path.read_text())["project"]


@pytest.mark.slow  # builds both wheels: about 6 s
def test_the_plugin_wheel_is_lean_and_has_the_kernel_sources_and_the_sglang_entry_point(wheels):
    wheel = wheels["plugin"]
    assert wheel.stat().st_size <= WHEEL_LIMIT, f"{wheel.name}: {wheel.stat().st_size / 2**20:.2f} MiB"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert not [n for n in names if n.endswith((".safetensors", ".jsonl", ".png", ".jpg", ".mp4"))]
    assert all(n.startswith(("sage_plugin/", "sage_plugin-")) for n in names)
    sources = {f"sage_plugin/kernels/csrc/{p.name}" for p in (REPO / "sage_plugin/kernels/csrc").iterdir()}
    assert sources and sources <= set(names)  # sage setup builds the kernels from the installed package
    assert "[sglang.srt.plugins]\nsage = sage_plugin.runtimes.sglang:register" in entry_points
    requires = _metadata(wheel).get_all("Requires-Dist")
    always = sorted(re.split(r"[<>=!~;\[ ]", r)[0] for r in requires if "extra ==" not in r)
    assert always == ["numpy", "pyyaml", "torch", "tqdm"]  # no transformers, no ninja: those are the demo's
    assert f'sglang=={SGLANG_VERSION}; extra == "sglang"' in requires
    assert any(r.startswith("tensorrt-llm") and 'extra == "trtllm"' in r for r in requires)


@pytest.mark.slow  # shares the wheels fixture
def test_the_demo_wheel_carries_every_file_of_the_demo_folder_and_moves_with_the_plugins_version(wheels):
    package = REPO / "demo" / demo_assets.PACKAGE
    files = {
        str(p.relative_to(REPO / "demo")) for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }
    with zipfile.ZipFile(wheels["demo"]) as z:
        shipped = {n for n in z.namelist() if not n.split("/")[0].endswith(".dist-info")}
        licences = {n.split("licenses/", 1)[1] for n in z.namelist() if "/licenses/" in n}
    assert shipped == files
    assert {"sage_plugin_demo/drafts/smollm2-draft/model.safetensors", "sage_plugin_demo/data/SOURCES.md"} <= shipped
    declared = _project(REPO / "demo" / "pyproject.toml")["license-files"]
    assert len(licences) >= len(declared) and "LICENSE" in licences
    plugin, demo = _project(REPO / "pyproject.toml"), _project(REPO / "demo" / "pyproject.toml")
    assert plugin["version"] == demo["version"]
    assert plugin["optional-dependencies"]["demo"] == [f"{demo['name']}=={demo['version']}"]
    assert demo["name"] == demo_assets.DISTRIBUTION
