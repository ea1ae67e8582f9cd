"""The launch environment of CPU-only SGLang: what ``source .sglang-libcuda/env.sh`` does, for Python callers.

The CUDA-built ``sgl_kernel`` links ``libcuda.so.1``; on a machine without an NVIDIA driver
``tools/setup_sglang.sh`` unpacks Debian's user-space copy under ``<root>/usr/lib/x86_64-linux-gnu/nvidia/current``
(``root`` defaults to ``.sglang-libcuda``).  Imports nothing from SGLang (the test configuration uses it before
SGLang is imported).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["LIBCUDA_SUBDIR", "cpu_launch_env", "server_env", "unpacked_libcuda"]

#: Debian's layout inside the libcuda1 package, as unpacked by tools/setup_sglang.sh
LIBCUDA_SUBDIR = Path("usr/lib/x86_64-linux-gnu/nvidia/current")


def unpacked_libcuda(root: str | Path) -> Path | None:
    """The directory holding ``libcuda.so.1`` under ``root`` (absolute), or None where nothing was unpacked."""
    lib = Path(root) / LIBCUDA_SUBDIR
    return lib.resolve() if (lib / "libcuda.so.1").is_file() else None


def cpu_launch_env(env: Mapping[str, str], lib: Path) -> dict[str, str]:
    """``env`` with ``lib`` first on ``LD_LIBRARY_PATH`` (once) and ``SGLANG_USE_CPU_ENGINE=1`` unless set.

    >>> e = cpu_launch_env({"LD_LIBRARY_PATH": "/x"}, Path("/l"))
    >>> e["LD_LIBRARY_PATH"], e["SGLANG_USE_CPU_ENGINE"], cpu_launch_env(e, Path("/l"))["LD_LIBRARY_PATH"]
    ('/l:/x', '1', '/l:/x')
    """
    out = dict(env)
    paths = [p for p in out.get("LD_LIBRARY_PATH", "").split(":") if p]
    if str(lib) not in paths:
        out["LD_LIBRARY_PATH"] = ":".join([str(lib), *paths])
    out.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    return out


def server_env(env: Mapping[str, str], root: str | Path) -> dict[str, str]:
    """The environment to launch an SGLang server with: :func:`cpu_launch_env` where ``root`` holds an unpacked
    libcuda (a CPU machine set up by ``tools/setup_sglang.sh``), else a copy of ``env`` (a machine with a driver).

    >>> server_env({"A": "1"}, "/nonexistent")
    {'A': '1'}
    """
    lib = unpacked_libcuda(root)
    return cpu_launch_env(env, lib) if lib is not None else dict(env)
