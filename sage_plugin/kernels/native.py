"""Build-at-first-use CPU kernels (``csrc/``): one loader for every C++ library the plugin ships.

Each ``csrc/<name>.cpp`` registers its operators as PyTorch custom ops in the ``sage_plugin`` namespace
(``TORCH_LIBRARY_FRAGMENT`` with the schema, ``TORCH_LIBRARY_IMPL`` with the CPU kernel), so a caller reaches them as
``torch.ops.sage_plugin.<op>`` and ``torch.compile`` / ``FakeTensorMode`` see them through the fake kernel the
kernel's Python module registers (``register_fake``) once the library is loaded.

Each library is compiled by ``torch.utils.cpp_extension.load`` (``-O3 -fopenmp``) for one of three x86-64 instruction
set levels, :data:`ISA_LEVELS`: ``avx512``, ``avx2`` or the baseline ``x86-64``, the best one whose CPU flags this
machine has (:func:`host_isa`).  The flags compiled for are explicit (``-march=x86-64`` plus that level's ``-m``
flags, never ``-march=native``).  A library is built into its own directory under :data:`KERNELS_DIR`, named after
the kernel, the level and a digest of its sources and flags (:func:`library_name`): machines sharing a home directory
each load a build whose instructions they all have, two checkouts of the same sources share one build, and a changed
source is a new library, never a rebuild of one in use.  A library already built is loaded as it is (no compiler,
no ninja).  ``sage setup`` builds them all once (about 30 s each); elsewhere a library not built yet is compiled at
its first use, except where :func:`build_at_first_use` turned that off (every SGLang process the plugin registers
in: no compiler runs inside a request).  Off x86-64 nothing is compiled: every caller keeps its torch path, after one
warning per process.  Where a library cannot be built (no compiler, no ninja) or is not built in a process that may
not build it, its caller keeps its torch path, after one warning per library and process.

Example (the ops of ``csrc/rows_linear.cpp``; None where it cannot be built)::

    ops = cpu_ops("rows_linear", "using weight-major products")
    y = ops.rows_linear(x, w) if ops is not None else fallback(x, w)
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

__all__ = [
    "ISA_LEVELS",
    "KERNELS_DIR",
    "NAMESPACE",
    "build_at_first_use",
    "cpu_ops",
    "host_isa",
    "isa_of",
    "library_name",
]

#: the custom-op namespace of every kernel: ``torch.ops.sage_plugin.<op>``
NAMESPACE = "sage_plugin"

#: instruction set level -> (the CPU flags it needs, as ``/proc/cpuinfo`` spells them; the compiler flags it is built
#: with), best first.  ``simd.h`` picks its vector width from the macros these define (``__AVX512F__``, ``__FMA__``).
ISA_LEVELS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "avx512": (frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"}),
               ("-march=x86-64", "-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl")),
    "avx2": (frozenset({"avx2", "fma"}), ("-march=x86-64", "-mavx2", "-mfma")),
    "x86-64": (frozenset(), ("-march=x86-64",)),
}  # fmt: skip
#: torch's CPU capability -> the level, where the CPU's flags cannot be read (no /proc/cpuinfo)
_CAPABILITY_LEVEL = {"AVX512": "avx512", "AVX2": "avx2"}
_X86_64 = {"x86_64", "amd64"}

_CSRC = Path(__file__).with_name("csrc")
#: the built libraries, one directory each, per torch version (its C++ ABI); ``SAGE_KERNELS_DIR`` moves the root
KERNELS_DIR = Path(os.environ.get("SAGE_KERNELS_DIR") or Path.home() / ".cache" / "sage_plugin" / "kernels") / (
    f"torch-{torch.__version__}"
)
_lock = threading.Lock()
_built: dict[str, Any] = {}  # library name -> the op namespace, or False where it cannot be built
_warned_off_x86: list[bool] = []  # one warning per process off x86-64
_may_build: list[bool] = [True]  # whether a library not built yet is compiled at its first use in this process


def build_at_first_use(allowed: bool) -> None:
    """Whether this process compiles a library not built yet when it is first used (the default: the reference engine,
    the tests), or runs its caller's torch path after one warning naming ``sage setup`` (an SGLang server: its plugin
    registration turns building off, so no compiler runs inside a request)."""
    _may_build[0] = allowed


def isa_of(machine: str, flags: frozenset[str] | None) -> str | None:
    """The level of :data:`ISA_LEVELS` the kernels are built for on a CPU of ``machine`` (``platform.machine()``)
    with CPU ``flags`` (None: unknown, torch's CPU capability decides), or None off x86-64.

    >>> isa_of("x86_64", frozenset({"sse2", "avx2", "fma"})), isa_of("x86_64", frozenset({"sse2", "avx"}))
    ('avx2', 'x86-64')
    >>> isa_of("aarch64", frozenset({"asimd"})) is None
    True
    """
    if machine.lower() not in _X86_64:
        return None
    if flags is None:
        return _CAPABILITY_LEVEL.get(torch.backends.cpu.get_cpu_capability(), "x86-64")
    return next(level for level, (needs, _) in ISA_LEVELS.items() if needs <= flags)


def _cpu_flags() -> frozenset[str] | None:
    """The ``flags`` of the first processor in ``/proc/cpuinfo``, or None where there is none (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), None)
    return frozenset(line.split(":", 1)[1].split()) if line is not None else None


@functools.cache
def host_isa() -> str | None:
    """This machine's kernel level (:func:`isa_of`), or None off x86-64."""
    return isa_of(platform.machine(), _cpu_flags())


def cpu_ops(name: str, fallback: str, register_fakes: Callable[[], None] | None = None) -> Any:
    """``torch.ops.sage_plugin`` once ``csrc/<name>.cpp`` is built and loaded (on first use), or None where it cannot be
    built (one warning naming ``fallback``, what the caller does instead).  ``register_fakes`` runs once, after the
    load: it registers the fake kernels of the library's ops."""
    if name not in _built:
        with _lock:
            if name not in _built:
                _built[name] = _build(name, fallback)
                if _built[name] and register_fakes is not None:
                    register_fakes()
    return _built[name] or None


def _cflags(isa: str) -> list[str]:
    """The level's instruction set, scheduled for the building CPU (``-mtune`` picks no instruction, so the build runs
    on every CPU of its level; GCC's generic tuning splits unaligned 256-bit loads, which slows the rows kernel)."""
    return ["-O3", *ISA_LEVELS[isa][1], "-mtune=native", "-fopenmp"]


def library_name(name: str, isa: str) -> str:
    """The library of kernel ``name`` built for level ``isa``: ``sage_plugin_<name>_<level>_<digest>``, the digest
    (12 hex digits of a SHA-256) over ``csrc/<name>.cpp``, every ``csrc/*.h`` (names and contents) and the flags."""
    digest = hashlib.sha256()
    for path in [_CSRC / f"{name}.cpp", *sorted(_CSRC.glob("*.h"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(" ".join(_cflags(isa)).encode())
    return f"{NAMESPACE}_{name}_{isa.replace('-', '_')}_{digest.hexdigest()[:12]}"


def _build(name: str, fallback: str) -> Any:
    isa = host_isa()
    if isa is None:
        if not _warned_off_x86:
            _warned_off_x86.append(True)
            warnings.warn(f"sage_plugin: the CPU kernels are x86-64 only ({platform.machine()} here): torch paths",
                          stacklevel=4)  # fmt: skip
        return False
    lib = library_name(name, isa)
    directory = KERNELS_DIR / lib
    built = directory / f"{lib}.so"
    if built.is_file():
        torch.ops.load_library(str(built))  # its TORCH_LIBRARY blocks register the ops
        return getattr(torch.ops, NAMESPACE)
    if not _may_build[0]:
        warnings.warn(f"sage_plugin: the CPU kernel {name} is not built here (`sage setup` builds it); {fallback}",
                      stacklevel=4)  # fmt: skip
        return False
    # importing cpp_extension on a CPU-only machine logs "No CUDA runtime is found" and, with a driver stub, warns
    # that the driver is too old: both true, neither a concern of a CPU build
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="CUDA initialization", category=UserWarning)
            from torch.utils.cpp_extension import load

            directory.mkdir(parents=True, exist_ok=True)
            load(
                name=lib,
                sources=[str(_CSRC / f"{name}.cpp")],
                extra_cflags=_cflags(isa),
                extra_ldflags=["-fopenmp"],
                build_directory=str(directory),
                is_python_module=False,  # loaded into the process: its TORCH_LIBRARY blocks register the ops
                verbose=False,
            )
            return getattr(torch.ops, NAMESPACE)
    except Exception as exc:
        warnings.warn(f"sage_plugin: the CPU kernel {name} could not be built ({exc}); {fallback}", stacklevel=4)
        return False
    finally:
        log.setLevel(level)
