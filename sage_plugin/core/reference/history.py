"""Naive references for the adaptive-history controller and the per-request policy state between rounds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .trees import RefTree

__all__ = ["HistoryRef", "RefState", "history_init_ref", "history_update_ref", "init_state_ref", "observe_ref"]


@dataclass
class HistoryRef:
    """One request's controller state: recent tau values (at most ``window``), counters, D_max."""

    window: list[float]
    since_change: int
    d_max: int


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
) -> HistoryRef:
    """Push ``tau``; once ``window`` values are held (and, with the cool-down, ``window`` rounds
    have passed since the last change), move D_max by -step if the mean < lo, by +step if the
    mean > hi, clamped to ``[d_min, d_cap]``.

    >>> h = history_init_ref(8)
    >>> out = []
    >>> for t in (4, 4, 4, 4, 1, 1):
    ...     h = history_update_ref(h, t, window=2, lo=2, hi=3, step=1, d_min=3, d_cap=10, full_window_cooldown=True)
    ...     out.append(h.d_max)
    >>> out
    [8, 9, 9, 10, 10, 9]
    """
    values = (h.window + [float(tau)])[-window:]
    since = h.since_change + 1
    d_max = h.d_max
    ready = len(values) == window and (since >= window or not full_window_cooldown)
    if ready:
        mean = sum(values) / window
        if mean < lo and d_max > d_min:
            d_max = max(d_min, d_max - step)
            since = 0
        elif mean > hi and d_max < d_cap:
            d_max = min(d_cap, d_max + step)
            since = 0
    return HistoryRef(values, since, d_max)


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
        history = history_update_ref(
            history,
            t,
            window=cfg.history_window,
            lo=cfg.history_lo,
            hi=cfg.history_hi,
            step=cfg.history_step,
            d_min=cfg.d_min,
            d_cap=cfg.d_cap,
            full_window_cooldown=cfg.history_cooldown == "full_window",
        )
    return RefState(alpha, False, history)
