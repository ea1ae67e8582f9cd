"""The cost side of the tier chooser: the tiers, their measured step costs per batch-size class, the overhead.

:class:`TierCosts` keeps what :class:`~.tiers.TierChooser` prices a step with besides its expected tokens: each
tier's step seconds at each batch-size class (the low median of the last ``cost_window`` timings, the first
``unpriced_first`` steps of a tier being its warm-up), the per-step overhead outside the forward passes (a moving
average), the price of catching a lagging draft up (:meth:`TierCosts.catch_up`, the low median of its timings per
size class), and a lower bound on a tier's cost at a batch size it has not run at yet, from the sizes around it.
A measured cost is held to at most what any larger batch of the tier was measured at (:meth:`TierCosts.cost`).
Host-side floats only.

Batch sizes that run as one captured shape share their costs (:meth:`TierCosts.set_size_classes`): a CUDA graph runner
pads a batch to its next captured size, so a tier costs the same at every size up to it, and one measurement prices
the whole class (``[1, 2, 4, 8, 16, 24, 32]`` captured: 13 requests run, and are priced, as 16).  Without captured
sizes (CPU, eager) every batch size is its own class.

Worked example: ``[3, 4]`` timed 0.30, 0.11, 0.12, 0.10 s at batch 4 with one warm-up step: the 0.30 s step is
dropped and the cost is the low median of the rest, 0.11 s.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = ["Tier", "TierCosts", "parse_tiers"]


@dataclass(frozen=True, order=True, slots=True)
class Tier:
    """One captured shape: ``steps`` draft forwards, ``draft_tokens`` verified tokens per request (root included)."""

    steps: int
    draft_tokens: int

    @property
    def off(self) -> bool:
        """Speculation off: no draft step, the verify forward is a plain decode step."""
        return self.steps == 0


def parse_tiers(pairs: Iterable[Sequence[int]]) -> tuple[Tier, ...]:
    """Tiers from ``[steps, draft_tokens]`` pairs, sorted; the pairs are validated by the config."""
    return tuple(sorted(Tier(int(s), int(n)) for s, n in pairs))


class TierCosts:
    """Measured step costs of ``tiers`` per batch-size class and the per-step overhead (module docstring).

    Args:
        tiers: the tiers, at least one.
        smoothing: weight of a new overhead sample in its moving average, in (0, 1].
        cost_window: step timings kept per tier and batch size (the cost is their low median).
        unpriced_first: the first steps of each tier (at any batch size) whose timings are dropped (warm-up).
        bound_slack: the fraction :meth:`cost_bound` takes off its bound (1: no bound).
    """

    def __init__(
        self, tiers: Sequence[Tier], smoothing: float, cost_window: int, unpriced_first: int, bound_slack: float
    ) -> None:
        if not tiers:
            raise ValueError("at least one tier")
        self.tiers = tuple(sorted(set(tiers)))
        self.smoothing = smoothing
        self.cost_window = cost_window
        self.bound_slack = bound_slack
        self._cost: dict[tuple[Tier, int], deque[float]] = {}
        self._median: dict[tuple[Tier, int], float] = {}  # the low median of each ``_cost`` window
        self._held: dict[tuple[Tier, int], float] = {}  # that, held to the larger classes' (:meth:`cost`)
        self._unpriced = {t: unpriced_first for t in self.tiers}  # warm-up steps left per tier
        self._overhead: float | None = None
        self._catch_up: dict[int, deque[float]] = {}  # size class -> catch-up timings (``record_catch_up``)
        self._classes: tuple[int, ...] = ()  # captured batch sizes, ascending (empty: every size its own class)

    def set_size_classes(self, sizes: Iterable[int] | None) -> None:
        """Batch sizes run as one shape (a graph runner's captured sizes; None or empty: every size its own class).

        A batch of ``B`` requests is priced at the smallest captured size ``>= B`` (the runner pads to it), or at ``B``
        above the largest (it runs eager).  Set before the first step (costs already recorded keep their keys).
        """
        self._classes = tuple(sorted({int(b) for b in sizes or () if int(b) > 0}))

    def size_class(self, batch_size: int) -> int:
        """The batch size whose measured costs price a batch of ``batch_size`` (module docstring)."""
        i = bisect.bisect_left(self._classes, batch_size)
        return self._classes[i] if i < len(self._classes) else batch_size

    def cost(self, tier: Tier, batch_size: int) -> float | None:
        """Measured seconds per step of ``tier`` at ``batch_size``'s size class (None until measured there), at most
        its measured cost at any larger size class: a step of fewer requests never costs more, so a size priced high
        by a slow spell of the machine (or by longer contexts at the time) is held to what a larger batch was seen to
        cost.  Example: off measured 46 ms at 16 and 52 ms at 13 is priced 46 ms at 13."""
        return self._held.get((tier, self.size_class(batch_size)))

    def fastest_cost(self, tier: Tier, batch_size: int) -> float | None:
        """The fastest of ``tier``'s kept step timings at ``batch_size``'s size class (None until measured there): a
        step noise has not slowed, the cost an optimistic rate is priced at."""
        samples = self._cost.get((tier, self.size_class(batch_size)))
        return min(samples) if samples else None

    def record_cost(self, tier: Tier, batch_size: int, seconds: float) -> None:
        """A measured step time of ``tier`` at ``batch_size`` (kept for its size class; dropped while the tier is warming
        up)."""
        if self._unpriced[tier] > 0:
            self._unpriced[tier] -= 1
            return
        key = (tier, self.size_class(batch_size))
        samples = self._cost.setdefault(key, deque(maxlen=self.cost_window))
        samples.append(seconds)
        self._median[key] = statistics.median_low(samples)
        low = float("inf")  # the tier's costs again, from its largest class down (set once per recorded step)
        for b in sorted((b for (t, b) in self._median if t == tier), reverse=True):
            low = self._held[tier, b] = min(low, self._median[tier, b])

    def record_catch_up(self, batch_size: int, seconds: float) -> None:
        """A measured catch-up of a draft left behind by off steps that skipped its extend (SGLang's
        ``tier_off_lag``), timed apart from the drafted step it preceded, at ``batch_size``'s size class."""
        self._catch_up.setdefault(self.size_class(batch_size), deque(maxlen=self.cost_window)).append(seconds)

    def catch_up(self, batch_size: int) -> float | None:
        """Measured seconds of a catch-up at ``batch_size``'s size class (None until one ran there)."""
        samples = self._catch_up.get(self.size_class(batch_size))
        return None if not samples else statistics.median_low(samples)

    def catch_up_classes(self) -> list[int]:
        """The size classes where a catch-up was measured, ascending."""
        return sorted(self._catch_up)

    def overhead_seconds(self) -> float | None:
        """The measured per-step overhead outside the forward passes (a moving average; None until measured)."""
        return self._overhead

    def record_overhead(self, seconds: float) -> None:
        """A measured gap between two consecutive decode steps (the runtime's work outside the forwards)."""
        seconds = max(seconds, 0.0)
        old = self._overhead
        self._overhead = seconds if old is None else old + self.smoothing * (seconds - old)

    def cost_classes(self, tier: Tier) -> list[int]:
        """The size classes where ``tier``'s step cost has samples, ascending."""
        return sorted(bs for (t, bs) in self._cost if t == tier)

    def cost_bound(self, tier: Tier, batch_size: int) -> float | None:
        """A lower bound on ``tier``'s step seconds at ``batch_size``'s size class ``B``, times ``1 - bound_slack``; the
        larger of two, each where it is measured (None when neither is):

        * from the nearest smaller measured size ``b``: its cost there, scaled by the smallest tier's growth from ``b``
          to ``B`` when that is measured at both.  It holds while a larger tier's cost relative to the smallest tier's
          does not fall as the batch grows (its extra verified tokens turn compute-bound first);
        * from the nearest larger measured size ``b2``: its cost there times ``B / b2``.  It holds while a request
          costs no less in a larger batch than in a smaller one (a batch split in two repeats its fixed work).

        ``bound_slack`` absorbs this CPU's row-count kinks.  Worked example: ``[3, 4]`` measured at 242 ms at batch
        16, then the batch drains to 13: its cost there is at least ``0.9 x 242 x 13 / 16 = 177`` ms.
        """
        if self.bound_slack >= 1.0:
            return None
        size = self.size_class(batch_size)
        measured = self.cost_classes(tier)
        smaller, larger = [bs for bs in measured if bs < size], [bs for bs in measured if bs > size]
        bounds = []
        if smaller:
            b = max(smaller)
            bound = self.cost(tier, b)
            ref_now, ref_then = self.cost(self.tiers[0], batch_size), self.cost(self.tiers[0], b)
            if tier != self.tiers[0] and ref_now is not None and ref_then is not None:
                bound *= max(1.0, ref_now / ref_then)
            bounds.append(bound)
        if larger:
            b2 = min(larger)
            bounds.append(self.cost(tier, b2) * size / b2)
        return (1.0 - self.bound_slack) * max(bounds) if bounds else None
