"""Adaptive-history controller (SAGE §3, "adaptive history tracking") with [R] step/cap/cool-down.

Per request, keep a sliding window of the last ``window`` acceptance lengths.  Once the window is
full and at least ``window`` rounds have passed since the last change (full-window cool-down,
open point 9, ``docs/design/algorithm.md``), move ``D_max`` by ``-step`` when the mean is below ``lo`` and by ``+step``
when it is above ``hi``, clamped to ``[D_min, D_cap]``.

Everything is batched ``[B]`` tensor state updated with ``torch.where``: no host sync.

Worked trace (window 2, lo 2, hi 3, step 1, D_max 8, cap 10, full-window cool-down)::

    tau:            4    4    4    4    1    1
    window mean:    -    4    4    4   2.5   1
    since change:   1    2→0  1    2→0  1    2→0
    D_max:          8    9    9   10   10    9
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .params import SageParams

__all__ = ["HistoryState", "history_init", "history_update", "observe_history"]


@dataclass(frozen=True, slots=True)
class HistoryState:
    """Per-request controller state.

    Attributes:
        window: ``[B, W]`` float32 ring buffer of recent acceptance lengths.
        seen: ``[B]`` int64 rounds observed (saturates at W for the fill check).
        since_change: ``[B]`` int64 rounds since the last D_max change.
        d_max: ``[B]`` int64 current maximum depth.
        total: ``[B]`` float32 sum of every acceptance length observed (the relative thresholds' level).
        count: ``[B]`` int64 rounds observed in all.
    """

    window: torch.Tensor
    seen: torch.Tensor
    since_change: torch.Tensor
    d_max: torch.Tensor
    total: torch.Tensor
    count: torch.Tensor

    def index(self, idx: torch.Tensor) -> "HistoryState":
        """Rows ``idx`` (batch management: drop finished requests)."""
        return HistoryState(*(getattr(self, f)[idx] for f in HistoryState.__slots__))

    @staticmethod
    def cat(states: list["HistoryState"]) -> "HistoryState":
        return HistoryState(*(torch.cat([getattr(s, f) for s in states]) for f in HistoryState.__slots__))


def history_init(batch: int, window: int, d_max: int, device: torch.device | str = "cpu") -> HistoryState:
    return HistoryState(
        window=torch.zeros(batch, window, dtype=torch.float32, device=device),
        seen=torch.zeros(batch, dtype=torch.int64, device=device),
        since_change=torch.zeros(batch, dtype=torch.int64, device=device),
        d_max=torch.full((batch,), d_max, dtype=torch.int64, device=device),
        total=torch.zeros(batch, dtype=torch.float32, device=device),
        count=torch.zeros(batch, dtype=torch.int64, device=device),
    )


def history_update(
    state: HistoryState,
    tau: torch.Tensor,
    *,
    lo: float,
    hi: float,
    step: int,
    d_min: int,
    d_cap: int,
    full_window_cooldown: bool,
    relative: bool = False,
) -> HistoryState:
    """Push one round's acceptance length per request and move ``d_max`` (sync-free).

    Args:
        state: current state (``[B]`` rows).
        tau: ``[B]`` acceptance length in the configured units.
        lo, hi: thresholds on the window mean; with ``relative``, ratios to the request's running mean acceptance
            (every round so far), so the controller reacts to the draft doing better or worse than it usually does
            rather than to fixed levels made for one draft.
        step: change per move.
        d_min, d_cap: bounds on ``d_max``.
        full_window_cooldown: require ``W`` rounds since the last change before the next.

    Returns:
        The new state.

    >>> s, seen = history_init(1, 2, 8), []
    >>> for t in (4, 4, 4, 4, 1, 1):
    ...     s = history_update(s, torch.tensor([float(t)]), lo=2, hi=3, step=1, d_min=3, d_cap=10,
    ...                        full_window_cooldown=True)
    ...     seen.append(int(s.d_max))
    >>> seen
    [8, 9, 9, 10, 10, 9]
    """
    w = state.window.shape[1]
    window = torch.cat([state.window[:, 1:], tau.float()[:, None]], dim=1)
    seen = (state.seen + 1).clamp(max=w)
    since = state.since_change + 1
    total, count = state.total + tau.float(), state.count + 1
    mean = window.mean(1)
    ready = seen >= w
    if full_window_cooldown:
        ready = ready & (since >= w)
    if relative:  # mean < lo * total / count, cross-multiplied (exact for the small sums involved)
        scaled, below, above = window.sum(1) * count, lo * total * w, hi * total * w
    else:
        scaled, below, above = mean, lo, hi
    down = ready & (scaled < below) & (state.d_max > d_min)
    up = ready & (scaled > above) & (state.d_max < d_cap)
    d_max = torch.where(down, (state.d_max - step).clamp(min=d_min), state.d_max)
    d_max = torch.where(up, (state.d_max + step).clamp(max=d_cap), d_max)
    since = torch.where(down | up, torch.zeros_like(since), since)
    return HistoryState(window, seen, since, d_max, total, count)


def observe_history(cfg: SageParams, state: HistoryState, num_accepted: torch.Tensor) -> HistoryState:
    """One round of the configured controller: ``num_accepted [B]`` accepted draft tokens (bonus excluded) per request.

    Applies ``use_history`` (off: ``state`` unchanged), the tau units of open point 10 (``history_tau``: ``drafts``,
    or ``drafts_plus_bonus``), ``history_mode`` (``absolute``: the paper's thresholds ``history_lo/hi``;
    ``relative``: ``history_lo_ratio/hi_ratio`` times the request's running mean acceptance) and ``history_step``,
    ``d_min``, ``d_cap``, ``history_cooldown``.  Every runtime feeds its controller through this function.
    """
    if not cfg.use_history:
        return state
    tau = num_accepted.float() + (1.0 if cfg.history_tau == "drafts_plus_bonus" else 0.0)
    relative = cfg.history_mode == "relative"
    return history_update(
        state,
        tau,
        lo=cfg.history_lo_ratio if relative else cfg.history_lo,
        hi=cfg.history_hi_ratio if relative else cfg.history_hi,
        relative=relative,
        step=cfg.history_step,
        d_min=cfg.d_min,
        d_cap=cfg.d_cap,
        full_window_cooldown=cfg.history_cooldown == "full_window",
    )
