"""Naive references for the adaptive-history controller and the per-request policy state between rounds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from tests.oracles.trees import RefTree

__all__ = ["HistoryRef", "RefState", "history_init_ref", "history_update_ref", "init_state_ref", "observe_ref"]


@dataclass
class HistoryRef:
    """One request's controller state: recent tau values (at most ``window``), counters, D_max, and every tau seen."""

    window: list[float]
    since_change: int
    d_max: int
    all_taus: list[float] = field(default_factory=list)


def history_init_ref(d_max: int) -> HistoryRef:
    return HistoryRef([], 0, d_max)


def history_update_ref(
    h: HistoryRef,
    tau: float,
    *,
    window: int,
    lo: float,
    hi: float,
    step: int,
    d_min: int,
    d_cap: int,
    full_window_cooldown: bool,
    relative: bool = False,
) -> HistoryRef:
    """Push ``tau``; once ``window`` values are held (and, with the cool-down, ``window`` rounds
    have passed since the last change), move D_max by -step if the mean < lo, by +step if the
    mean > hi, clamped to ``[d_min, d_cap]``.  With ``relative``, ``lo`` and ``hi`` are multiplied by
    the mean of every tau seen so far (this one included).

    >>> h = history_init_ref(8)
    >>> out = []
    >>> for t in (4, 4, 4, 4, 1, 1):
    ...     h = history_update_ref(h, t, window=2, lo=2, hi=3, step=1, d_min=3, d_cap=10, full_window_cooldown=True)
    ...     out.append(h.d_max)
    >>> out
    [8, 9, 9, 10, 10, 9]
    """
    values = (h.window + [float(tau)])[-window:]
    all_taus = h.all_taus + [float(tau)]
    since = h.since_change + 1
    d_max = h.d_max
    ready = len(values) == window and (since >= window or not full_window_cooldown)
    if ready:
        if relative:  # window mean vs lo * running mean, both sides times window * rounds (exact arithmetic)
            x, low, high = sum(values) * len(all_taus), lo * sum(all_taus) * window, hi * sum(all_taus) * window
        else:
            x, low, high = sum(values) / window, lo, hi
        if x < low and d_max > d_min:
            d_max = max(d_min, d_max - step)
            since = 0
        elif x > high and d_max < d_cap:
            d_max = min(d_cap, d_max + step)
            since = 0
    return HistoryRef(values, since, d_max, all_taus)


@dataclass
class RefState:
    """One request's policy state between rounds."""

    alpha: float
    first_round: bool
    history: HistoryRef


def init_state_ref(cfg) -> RefState:
    return RefState(cfg.alpha_init, True, history_init_ref(cfg.d_max))


def observe_ref(cfg, state: RefState, tree: RefTree, accepted: Sequence[int], tau: int) -> RefState:
    """State after a round: next alpha (lag-1 root alpha, or the mean confidence over the accepted
    path's drafted nodes, root included, for ``path_mean``) and the history controller update."""
    if cfg.policy != "sage":
        return RefState(tree.root_alpha, False, state.history)
    if cfg.alpha_source == "path_mean":
        confs = [tree.nodes[i].conf for i in accepted if tree.nodes[i].conf is not None]
        alpha = sum(confs) / len(confs) if confs else tree.root_alpha
    else:
        alpha = tree.root_alpha
    history = state.history
    if cfg.use_history:
        t = tau + (1 if cfg.history_tau == "drafts_plus_bonus" else 0)
        relative = cfg.history_mode == "relative"
        history = history_update_ref(
            history,
            t,
            window=cfg.history_window,
            lo=cfg.history_lo_ratio if relative else cfg.history_lo,
            hi=cfg.history_hi_ratio if relative else cfg.history_hi,
            relative=relative,
            step=cfg.history_step,
            d_min=cfg.d_min,
            d_cap=cfg.d_cap,
            full_window_cooldown=cfg.history_cooldown == "full_window",
        )
    return RefState(alpha, False, history)
