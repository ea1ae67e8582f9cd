"""SGLang adapter for SAGE: ``python -m sglang.launch_server --speculative-algorithm sage ...``.

SGLang finds :func:`register` through the entry point in ``pyproject.toml``::

    [project.entry-points."sglang.srt.plugins"]
    sage = "sage_plugin.runtimes.sglang:register"

and calls it in every SGLang process (launcher, schedulers, detokenizer) from ``load_plugins()``.
The package must therefore be an installed distribution (``pip install -e .``), and :func:`register`
must be idempotent and cheap.  SGLang logs and swallows an exception raised here, and
``--speculative-algorithm sage`` then fails with "Unknown speculative algorithm name: sage".

Modules (``docs/design/sglang-internals.md`` describes how they fit together):

* :mod:`.args`: the ``--sage-*`` flags (generated from SageConfig), ``--sage-config``, SGLang draft sizes;
* :mod:`.support`: the SageConfig fields the worker honours (checked at launch);
* :mod:`.hooks`: every ``HookRegistry`` AROUND hook (flags, node choice, metrics, CPU sampling, CPU linear layers,
  CPU tensor parallelism, CPU overlap scheduling, the CPU ragged verify, exact request parameters through
  :mod:`.penalties`; each listed in ``patches/INDEX.md``);
* :mod:`.algo`: ``SageSpecAlgo`` and its EAGLE variants, the server-args callbacks (imports SGLang);
* :mod:`.worker`: the SAGE workers on SGLang's EAGLE v2 workers; :mod:`.selection` the plan and the node choice
  inside the captured draft step; :mod:`.tiers` the serving tiers on SGLang's adaptive runtime states;
  :mod:`.tpsync` the tree broadcast from rank 0;
* :mod:`.request_meta`: ``meta_info["sage"]`` per request; :mod:`.admission_hold` the bound on SGLang's
  min-free-slots delayer's hold;
* :mod:`.draft_weights`, :mod:`.lean_draft`, :mod:`.off_decode`, :mod:`.off_lag`, :mod:`.ragged_verify`: the CPU paths (the
  draft's head rows and bfloat16 weights, its lean decoder, the off tier's DECODE forward and skipped extends, the
  ragged verify);
* :mod:`.cpu_ops`, :mod:`.cpu_env`: pure-torch ``sgl_kernel`` CPU ops SGLang's CPU speculative path needs, and the
  CPU-only launch environment.

Environment variables, read once, by :func:`register` (the only environment variables the package reads):

* ``SAGE_ENABLED=0``: register nothing (no flags, no algorithm, no ops);
* ``SAGE_SKIP_VERSION_CHECK=1``: warn instead of failing when SGLang is not the pinned version
  (:data:`sage_plugin.compat.SGLANG_VERSION`);
* ``SAGE_LOG_LEVEL``: level of the ``sage_plugin`` logger (``DEBUG``, ``INFO``, ...).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

__all__ = ["ALGORITHM", "register"]

logger = logging.getLogger(__name__)

#: The name SGLang registers (``--speculative-algorithm sage`` is upper-cased to it).
ALGORITHM = "SAGE"

_registered = False  # module guard: register() did its work (or was switched off) in this process


@dataclass(frozen=True)
class _Env:
    enabled: bool
    skip_version_check: bool
    log_level: str | None


def _read_env() -> _Env:
    """The plugin's three environment variables; read only here, once per process, by :func:`register`."""
    return _Env(
        enabled=os.environ.get("SAGE_ENABLED", "1").strip() != "0",
        skip_version_check=os.environ.get("SAGE_SKIP_VERSION_CHECK", "0").strip() == "1",
        log_level=os.environ.get("SAGE_LOG_LEVEL") or None,
    )


def register() -> None:
    """SGLang plugin entry point: add ``--speculative-algorithm sage`` and its ``--sage-*`` flags.

    In order: honour ``SAGE_ENABLED=0``; check the SGLang version against the pin (unless
    ``SAGE_SKIP_VERSION_CHECK=1``); register the flag hooks; on CPU, register the pure-torch
    ``sgl_kernel`` ops; register the ``SAGE`` algorithm with :class:`.algo.SageSpecAlgo` (and its EAGLE-head variants
    ``SAGE_EAGLE``/``SAGE_EAGLE3``, :data:`.algo.REGISTRATIONS`).

    Idempotent: a module guard makes later calls no-ops, and each step also checks SGLang's registries
    (hooks, algorithms, ops), so even a second copy of this module registers nothing twice.

    Raises:
        sage_plugin.compat.RuntimeVersionError: SGLang is not the pinned version; the message names both
            versions and ``SAGE_SKIP_VERSION_CHECK=1``.
        RuntimeError: another plugin already registered a different algorithm named ``SAGE``.
    """
    global _registered
    if _registered:
        return
    env = _read_env()
    if env.log_level is not None:
        _set_log_level(env.log_level)
    if not env.enabled:
        logger.info("SAGE_ENABLED=0: the SAGE plugin registers nothing")
        _registered = True
        return

    from sage_plugin.compat import SGLANG_VERSION, check_runtime_version

    check_runtime_version("sglang", SGLANG_VERSION, skip=env.skip_version_check)

    from .hooks import install_hooks

    install_hooks()
    from sage_plugin.kernels.native import build_at_first_use

    build_at_first_use(False)  # a kernel `sage setup` did not build runs its torch path: no compiler in a request
    _register_cpu_ops()
    _register_algorithm()
    _registered = True
    logger.debug("SAGE plugin registered (--speculative-algorithm sage)")


def _set_log_level(name: str) -> None:
    level = logging.getLevelName(name.strip().upper())
    if isinstance(level, int):
        logging.getLogger("sage_plugin").setLevel(level)
    else:
        logger.warning("SAGE_LOG_LEVEL=%r is not a logging level; ignored", name)


def _register_cpu_ops() -> None:
    """On a CPU SGLang, fill ``torch.ops.sgl_kernel`` with the pure-torch ops SGLang's CPU path calls.

    ``sgl_kernel`` is imported first (if it imports at all) so that a real CPU build keeps its own
    kernels: :func:`.cpu_ops.register_cpu_ops` only adds what is missing, and is idempotent.
    """
    from sglang.srt.utils.common import is_cpu

    if not is_cpu():
        return
    try:
        import sgl_kernel  # noqa: F401  (its schemas first; see the docstring)
    except (ImportError, OSError, RuntimeError) as exc:
        logger.warning("import sgl_kernel failed (%s); registering SAGE's pure-torch CPU ops without it", exc)

    from .cpu_ops import register_cpu_ops

    ops = register_cpu_ops()
    logger.debug("SAGE CPU ops in torch.ops.sgl_kernel: %s", ", ".join(ops))


def _register_algorithm() -> None:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from .algo import REGISTRATIONS, validate_server_args

    for name, (spec_class, factory) in REGISTRATIONS.items():
        try:
            existing = SpeculativeAlgorithm.from_string(name)
        except ValueError:  # "Unknown speculative algorithm name": not registered yet
            existing = None
        if existing is not None:
            cls = type(existing)
            if (cls.__module__, cls.__qualname__) == (spec_class.__module__, spec_class.__qualname__):
                continue  # registered by an earlier copy of this module
            raise RuntimeError(f"speculative algorithm {name} is already registered by someone else: {existing!r}")
        SpeculativeAlgorithm.register(
            name,
            supports_overlap=True,  # on CPU handle_server_args turns it off unless cpu_overlap
            validate_server_args=validate_server_args,
            spec_class=spec_class,
        )(factory)
