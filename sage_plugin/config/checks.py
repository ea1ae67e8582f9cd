"""The value checks behind :class:`~sage_plugin.config.SageConfig`: each raises :class:`ConfigError` naming the field
and its allowed range (``SageConfig.__post_init__`` calls them).

>>> _int_in("d_min", 0, 1, 64)
Traceback (most recent call last):
...
sage_plugin.config.ConfigError: d_min must be an integer in [1, 64], got 0
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A configuration value is out of its allowed range (the message names the field).

    Public as ``sage_plugin.config.ConfigError``, the name tracebacks show.
    """


def _int_in(name: str, value: Any, lo: int, hi: int, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{name} must be an integer in [{lo}, {hi}]{why}, got {value!r}")


def _float_in(name: str, value: Any, lo: float, hi: float, *, lo_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        left = "(" if lo_open else "["
        raise ConfigError(f"{name} must be a number in {left}{lo}, {hi}], got {value!r}")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def _bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")


def _validate_calibration(table: Any) -> None:
    """Empty, or 1-64 rows of the same 1-64 numbers in (0, 1]."""
    if table == ():
        return
    if not isinstance(table, tuple) or not all(isinstance(r, tuple) for r in table):
        raise ConfigError(f"calibration must be a list of rows of acceptance rates, got {table!r}")
    widths = {len(r) for r in table}
    if not 1 <= len(table) <= 64 or len(widths) != 1 or not 1 <= widths.pop() <= 64:
        raise ConfigError("calibration must have 1-64 rows (alpha bins) of one length 1-64 (probability bins)")
    for r in table:
        for v in r:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < v <= 1.0:
                raise ConfigError(f"calibration values must be numbers in (0, 1], got {v!r}")


def _validate_tiers(tiers: Any) -> None:
    """Empty, or 1-16 distinct ``[steps, draft_tokens]`` pairs: ``[0, 1]`` (off) or steps 1-64 with 2-1025 tokens."""
    if tiers == ():
        return
    if not isinstance(tiers, tuple) or not all(isinstance(t, tuple) for t in tiers) or not 1 <= len(tiers) <= 16:
        raise ConfigError(f"tiers must be a list of 1-16 [steps, draft_tokens] pairs, got {tiers!r}")
    for t in tiers:
        ints = len(t) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in t)
        if not ints or not (t == (0, 1) or (1 <= t[0] <= 64 and 2 <= t[1] <= 1025)):
            raise ConfigError(
                "tiers: every tier must be [steps, draft_tokens] with steps in [1, 64] and draft_tokens in "
                f"[2, 1025] (the root counts), or [0, 1] for speculation off; got {list(t)!r}"
            )
    if len(set(tiers)) != len(tiers):
        raise ConfigError(f"tiers must be distinct, got {[list(t) for t in tiers]!r}")


def _validate_tree_choices(name: str, paths: Any, k: int) -> None:
    if not isinstance(paths, tuple) or not paths:
        raise ConfigError(f"{name} must be a non-empty list of rank paths, got {paths!r}")
    seen = set()
    for p in paths:
        if not isinstance(p, tuple) or not p or not all(isinstance(r, int) and 0 <= r < k for r in p):
            raise ConfigError(f"{name}: every rank path must be a non-empty list of ranks in [0, {k - 1}], got {p!r}")
        seen.add(p)
    if len(seen) != len(paths):
        raise ConfigError(f"{name} contains duplicate rank paths")
    for p in paths:
        if len(p) > 1 and p[:-1] not in seen:
            raise ConfigError(
                f"{name}: path {list(p)} has no parent path {list(p[:-1])} (tree must be ancestor-closed)"
            )


ConfigError.__module__ = "sage_plugin.config"
