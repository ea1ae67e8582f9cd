"""Build-at-first-use CPU kernels (``csrc/``): one loader for every C++ library the plugin ships.

Each ``csrc/<name>.cpp`` registers its operators as PyTorch custom ops in the ``sage_plugin`` namespace
(``TORCH_LIBRARY_FRAGMENT`` with the schema, ``TORCH_LIBRARY_IMPL`` with the CPU kernel), so a caller reaches them as
``torch.ops.sage_plugin.<op>`` and ``torch.compile`` / ``FakeTensorMode`` see them through the fake kernel the
kernel's Python module registers (``register_fake``) once the library is loaded.  Each library is compiled for the
machine it runs on (``-O3 -march=native -fopenmp``) by ``torch.utils.cpp_extension.load`` and cached by torch under
``~/.cache/torch_extensions``; the build name carries torch's CPU capability, so machines sharing a cache never load
a build for another instruction set.  ``tools/setup.sh`` builds them once (about 30 s each) instead of at the first
forward.  Where a library cannot be built (no compiler, no ninja) its caller keeps its torch path, after one warning
per library and process.

Example (the ops of ``csrc/rows_linear.cpp``; None where it cannot be built)::

    ops = cpu_ops("rows_linear", "using weight-major products")
    y = ops.rows_linear(x, w) if ops is not None else fallback(x, w)
"""

from __future__ import annotations

import hashlib
import logging
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

__all__ = ["NAMESPACE", "cpu_ops"]

#: the custom-op namespace of every kernel: ``torch.ops.sage_plugin.<op>``
NAMESPACE = "sage_plugin"

_CSRC = Path(__file__).with_name("csrc")
_lock = threading.Lock()
_built: dict[str, Any] = {}  # library name -> the op namespace, or False where it cannot be built


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


def _headers_digest() -> str:
    """The first 16 hex digits of a SHA-256 over ``csrc/*.h`` (names and contents)."""
    digest = hashlib.sha256()
    for header in sorted(_CSRC.glob("*.h")):
        digest.update(header.name.encode() + b"\0" + header.read_bytes())
    return digest.hexdigest()[:16]


def _build(name: str, fallback: str) -> Any:
    # importing cpp_extension on a CPU-only machine logs "No CUDA runtime is found" and, with a driver stub, warns
    # that the driver is too old: both true, neither a concern of a CPU build
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    log.setLevel(logging.ERROR)
    isa = torch.backends.cpu.get_cpu_capability().lower()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="CUDA initialization", category=UserWarning)
            from torch.utils.cpp_extension import load

            load(
                name=f"{NAMESPACE}_{name}_{isa}",
                sources=[str(_CSRC / f"{name}.cpp")],
                # torch rebuilds when a source or a flag changes; the headers' digest as a flag covers them too
                extra_cflags=["-O3", "-march=native", "-fopenmp", f"-DSAGE_CSRC_HEADERS=0x{_headers_digest()}"],
                extra_ldflags=["-fopenmp"],
                is_python_module=False,  # loaded into the process: its TORCH_LIBRARY blocks register the ops
                verbose=False,
            )
            return getattr(torch.ops, NAMESPACE)
    except Exception as exc:
        warnings.warn(f"sage_plugin: the CPU kernel {name} could not be built ({exc}); {fallback}", stacklevel=4)
        return False
    finally:
        log.setLevel(level)
