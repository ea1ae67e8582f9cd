"""Pinned upstream runtime versions and the startup version check (the runtimes a release is tested against).

The SGLang adapter (:mod:`sage_plugin.runtimes.sglang`) hooks SGLang internals that change between
releases (``patches/INDEX.md``), so it supports exactly one SGLang version.  That version is pinned
here, once: :data:`SGLANG_VERSION`.  The ``[sglang]`` extra in ``pyproject.toml`` must pin the same
version (``tests/integration/sglang/test_compat.py`` checks that).

This module imports only the standard library; it never imports a runtime.

>>> check_runtime_version("sglang", SGLANG_VERSION, installed="0.5.23")
>>> check_runtime_version("sglang", SGLANG_VERSION, installed="0.5.24")
Traceback (most recent call last):
...
sage_plugin.compat.RuntimeVersionError: sage-plugin's sglang adapter is pinned to sglang==0.5.23, but sglang 0.5.24 is installed. Install the pinned version (pip install 'sglang==0.5.23', or the 'sage-plugin[sglang]' extra), or set SAGE_SKIP_VERSION_CHECK=1 to run against sglang 0.5.24 at your own risk.
>>> check_runtime_version("sglang", SGLANG_VERSION, installed="0.5.24", skip=True)
"""

from __future__ import annotations

import logging
from importlib import metadata

__all__ = ["SGLANG_VERSION", "RuntimeVersionError", "check_runtime_version", "installed_version"]

logger = logging.getLogger(__name__)

#: The one SGLang release the adapter is written and tested against (the ``[sglang]`` extra pins the same).
SGLANG_VERSION = "0.5.23"

#: The environment variable that turns the version mismatch error into a warning (read by ``register()``).
SKIP_ENV = "SAGE_SKIP_VERSION_CHECK"


class RuntimeVersionError(RuntimeError):
    """The installed runtime is not the version this adapter is pinned to."""


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or ``None`` if it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def check_runtime_version(distribution: str, pinned: str, *, installed: str | None = None, skip: bool = False) -> None:
    """Raise :class:`RuntimeVersionError` unless ``distribution`` is installed at exactly ``pinned``.

    Args:
        distribution: the runtime's distribution name (``"sglang"``).
        pinned: the pinned version (:data:`SGLANG_VERSION`).
        installed: the installed version; read from the package metadata when ``None``.
        skip: ``SAGE_SKIP_VERSION_CHECK=1``: log a warning instead of raising.
    """
    found = installed if installed is not None else installed_version(distribution)
    if found == pinned:
        return
    shown = f"{distribution} {found}" if found is not None else f"no {distribution} distribution"
    if skip:
        logger.warning(
            "%s=1: running sage-plugin (pinned to %s==%s) against %s; untested combination",
            SKIP_ENV,
            distribution,
            pinned,
            shown,
        )
        return
    raise RuntimeVersionError(
        f"sage-plugin's {distribution} adapter is pinned to {distribution}=={pinned}, but {shown} is installed. "
        f"Install the pinned version (pip install '{distribution}=={pinned}', or the 'sage-plugin[{distribution}]' "
        f"extra), or set {SKIP_ENV}=1 to run against {shown} at your own risk."
    )
