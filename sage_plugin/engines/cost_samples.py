"""The timings behind a :class:`~sage_plugin.core.cost.RoundCost`, kept current by the rounds' own forwards.

A start-up sample (:func:`~sage_plugin.engines.profile.measure_cost_samples`, a few forwards per size) prices every
round of the run; one noisy sample, or a context that grows over a long generation, then mis-prices the cut for
the whole run.  With ``cost_refresh`` R > 0 (:class:`~sage_plugin.config.SageConfig`) the engine times each verify
and draft forward it runs (host clock, after a device sync) and every R rounds rebuilds the curve from the median of
the last :data:`WINDOW` timings at each size: the start-up samples first, pushed out by in-loop ones.  A size the
run has not used yet is priced at its start-up timing times the drift the used sizes show (the median over them of
their current median / their start-up median), so a device that slows down, or a context that grows, moves the
whole curve and not only the sizes that happen to run; new sizes (unpadded runs) join the interpolation.

Host-side only (Python floats), never a per-step device path.

Example (sizes are draft nodes, root excluded; start-up samples at 0, 4 and 8 nodes)::

    verify 0: [35, 36]   4: [48, 47]   8: [56, 55]       -> 35.5 / 47.5 / 55.5
    in-loop: 4 nodes ran at 60, 61, 59 ms                 -> 4: median([48, 47, 60, 61, 59]) = 59
    the next rebuild prices 4 nodes at 59 ms; drift 59 / 47.5 = 1.24 prices 0 at 44.1 and 8 at 69.0
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.cost import RoundCost, interpolate

__all__ = ["CostSamples", "TimedForwards", "WINDOW", "timed_ms"]

#: timings kept per size: the median of the last WINDOW (start-up samples included until pushed out)
WINDOW = 9


def timed_ms(fn, sync, *args):
    """``(fn(*args), milliseconds)``: the wall time between two ``sync()`` (the device's queue drained before and
    after), how every forward the reference engine prices is timed."""
    sync()
    t0 = time.perf_counter()
    out = fn(*args)
    sync()
    return out, (time.perf_counter() - t0) * 1e3


@dataclass(slots=True)
class CostSamples:
    """Verify timings by draft-node count and draft timings by width, as ``{size: recent ms}``.

    Attributes:
        verify: ``{q: deque of ms}``: target forwards over ``q`` draft nodes plus the root.
        draft: ``{w: deque of ms}``: draft forwards of ``w`` tokens per request.
        max_nodes: largest tree the policy builds (the curve's length - 1).
        pad: price by the cheapest measured size at or above (``RoundCost.from_samples``).
        typical_width: the draft width ``draft_ms`` is read at (padded where ``pad``).
        limit: node counts past it cost infinity (the start-up timing stopped there: too slow to ever pay).
        refresh: rebuild the curve after this many rounds (0: never, the start-up curve stays).
    """

    verify: dict[int, deque] = field(default_factory=dict)
    draft: dict[int, deque] = field(default_factory=dict)
    max_nodes: int = 0
    pad: bool = False
    typical_width: int = 1
    limit: int = 0
    refresh: int = 0
    rounds: int = 0
    startup: dict[int, float] = field(default_factory=dict)  # start-up median by node count (set by start())
    used: set[int] = field(default_factory=set)  # node counts timed in the loop

    def start(self) -> "CostSamples":
        """End the start-up timing: its medians become the base the in-loop drift is measured against."""
        self.startup = {q: statistics.median(d) for q, d in self.verify.items()}
        return self

    def add_verify(self, nodes: int, ms: float) -> None:
        self.verify.setdefault(nodes, deque(maxlen=WINDOW)).append(float(ms))
        if self.startup:
            self.used.add(nodes)

    def add_draft(self, width: int, ms: float) -> None:
        self.draft.setdefault(width, deque(maxlen=WINDOW)).append(float(ms))

    def timed(self, forward, kind: str, size: int, sync, *args):
        """``forward(*args)`` (a model's forward), its wall time (:func:`timed_ms`) added as ``kind``
        ``verify`` of ``size`` draft nodes or ``draft`` of ``size`` tokens per request."""
        out, ms = timed_ms(forward, sync, *args)
        (self.add_verify if kind == "verify" else self.add_draft)(size, ms)
        return out

    def end_round(self) -> bool:
        """Count a round; True when the curve is due for a rebuild (every ``refresh`` rounds)."""
        self.rounds += 1
        return self.refresh > 0 and self.rounds % self.refresh == 0

    def cost(self) -> RoundCost:
        """The :class:`RoundCost` of the current medians (``verify`` must hold a timing at 0 nodes)."""
        counts = sorted(q for q in self.verify if q <= self.limit)
        ms = [statistics.median(self.verify[q]) for q in counts]
        if self.used and self.startup:
            start = sorted(self.startup)
            base = interpolate(start, [self.startup[q] for q in start], max(counts))  # start-up medians, raw
            drift = statistics.median(statistics.median(self.verify[q]) / base[q] for q in self.used)
            ms = [m if q in self.used else self.startup[q] * drift for q, m in zip(counts, ms)]
        widths = sorted(self.draft) if self.pad else []
        width_ms = [statistics.median(self.draft[w]) for w in widths]
        cost = RoundCost.from_samples(counts, ms, 0.0, self.max_nodes, self.pad, widths, width_ms)
        typical = cost.draft_width(self.typical_width)
        near = min(self.draft, key=lambda w: (abs(w - typical), w))  # the typical width, or the closest timed
        draft_ms = statistics.median(self.draft[near])
        verify_ms = cost.verify_ms.clone()
        verify_ms[self.limit + 1 :] = float("inf")
        return RoundCost(verify_ms, float(draft_ms), cost.verify_run, cost.draft_run)


class TimedForwards:
    """The forwards of a decode, timed into its live :class:`CostSamples` when it keeps them (``_live``; None: run
    untimed); the reference engine's base.  ``device`` is the engine's."""

    _live: CostSamples | None
    device: Any

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _timed_forward(self, model: Any, kind: str, size: int, *args) -> Any:
        """``model.forward(*args)``, timed into the live cost samples when this decode keeps them."""
        return self._timed(model.forward, kind, size, *args)

    def _timed(self, forward, kind: str, size: int, *args):
        live = self._live
        return forward(*args) if live is None else live.timed(forward, kind, size, self._sync, *args)
