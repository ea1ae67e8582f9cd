"""Speculative tiers: a small fixed set of draft shapes and the host-side choice of one per step.

A serving runtime that captures graphs (SGLang's CUDA graphs) runs a step at one of a few shapes fixed at start-up,
a *tier* ``(steps, draft_tokens)``: ``steps`` draft forwards of a fixed-width beam, then one verify forward of
``draft_tokens`` tokens per request (the root included).  ``(0, 1)`` is speculation off: the verify forward is a
plain decode step.  Inside a tier SAGE still shapes each request's tree (which ``draft_tokens - 1`` candidates are
verified); the tier only bounds it.

:class:`TierChooser` picks the tier of each step from host-side numbers only (no device tensor is read, no device
sync).  The step timings are each process's own, so tensor-parallel ranks agree on a tier only if they share them
(the SGLang adapter feeds every rank rank 0's, ``RankZeroTimes``).  The inputs:

* the batch size;
* each tier's measured step cost at that batch size (seconds; the low median of the runtime's last ``cost_window``
  step timings, :meth:`TierChooser.record_cost`: robust to a slow step now and then; the first ``unpriced_first``
  steps a tier ever runs are its warm-up, not priced: a first step carries allocations and first-shape kernels,
  often many times a warm step), plus the runtime's per-step overhead outside the forward passes (scheduling, result
  processing: :meth:`TierChooser.record_overhead`), which every tier pays once per step;
* each tier's expected tokens per request per step (1 + the mean accepted drafts, an exponential moving average
  fed from the accept counts the runtime already copies to the host, :meth:`TierChooser.observe`; exactly 1 for
  the off tier);
* with ``alpha_bins`` > 0, the draft's confidence at the step's root: the batch's mean SAGE alpha (Eq. 7-9, from the
  draft's top probabilities for the next token, which the runtime copies to the host without a sync, possibly a step
  late).  Each tier then keeps one moving average per alpha bin (``alpha_bins`` equal bins of ``[0, 1]``, the rule of
  :func:`~sage_plugin.core.calibration.calibration_bin`), and a step's expected tokens are its bin's (the tier's
  overall average until the bin has a sample): a confident draft turns a deep tier on, an unsure one turns
  speculation off, step by step, as SAGE's alpha sizes its trees.

How the expected tokens are estimated (``acceptance``):

* ``"per_tier"``: each tier's own moving averages (above);
* ``"pooled"``: one model shared by every tier, the chance that a request's accepted path goes one level deeper,
  per level ``j`` and alpha bin: ``h_j = P(accepted >= j | accepted >= j - 1)``, counted from every request of every
  step at any tier at least ``j`` deep (a step at ``s`` steps that accepted ``a`` drafts reached levels
  ``1 .. min(a + 1, s)`` and passed levels ``1 .. a``), counts decaying by ``1 - 1 / memory`` per step so they
  follow the traffic, with a prior of half a pass in one reach.  A tier of ``s`` steps expects
  ``1 + sum_{j <= s} prod_{i <= j} h_i`` tokens.  A step at a shallow tier then informs the deep ones (the ``[1, 2]``
  tier's steps tell how often level 1 is accepted).  It assumes a level is as likely accepted whatever tier drafted
  it, which fails once the beam's most probable paths are verified (``rerank_pool: beam``: a ``[1, 2]`` tier
  verifies one node, ``[4, 8]`` seven, so the narrow tier's rejections price the wide tiers low;
  ``docs/design/sglang-internals.md``, "Tiers");
* ``"width"``: the same level model, one per verify width: the tiers with the same ``draft_tokens`` share their
  level counts (a deeper beam of the same width adds only deep candidates, so its shallow levels pass alike), a
  group's counts decay by its own steps, and a width not yet run is measured first.

The choice maximises ``expected tokens / cost``.  A tier never measured at a batch size is tried first there (the
runtime's start-up measurement, amortised over the first steps at each batch size), cheapest first, and only while
it could still win there: its cost at the nearest smaller measured batch size, grown as the smallest tier's cost
grew since (less ``bound_slack``), bounds its cost from below, and a tier whose rate under that bound cannot beat the
best rate measured at this size is not run for its price (a traffic ramp through many batch sizes would otherwise
measure a deep tier that cannot pay at every one of them).  A tier not chosen is
re-measured (*probed*) once it has not run for its probe gap, so the estimates follow the traffic.  The gap starts
at ``probe_every`` steps; a probe the tier loses (another tier still rates higher at that batch size once its
feedback is in) doubles it, up to ``probe_backoff * probe_every``, and a tier that wins (probe or plain choice) is
back to ``probe_every``.  A deep tier that cannot pay at a large batch costs several off steps per probe; the
back-off bounds that while a change of traffic is still found within ``probe_backoff * probe_every`` steps.  With
``probe_confidence`` ``z`` > 0 a probe is lost only if the tier loses even at its :meth:`optimistic_rate` (its
fastest step there, its tokens ``z`` standard errors high), so a few unlucky early steps, which price a tier high
and its tokens low, cannot hold it out for a whole run.  Feedback may lag: the runtime calls
:meth:`TierChooser.choose` when a step starts and :meth:`observe` when its accept counts reach the host, possibly
after later steps started (overlap scheduling); observations are matched to steps in launch order.

Batch sizes that run as one captured shape share their costs (:meth:`TierChooser.set_size_classes`): a CUDA
graph runner pads a batch to its next captured size, so a tier costs the same at every size up to it, and one
measurement prices the whole class (``[1, 2, 4, 8, 16, 24, 32]`` captured: 13 requests run, and are priced, as 16).
Without captured sizes (CPU, eager) every batch size is its own class.

Worked example (two tiers, batch 1)::

    tiers (0, 1) and (3, 8); costs measured 60 ms and 100 ms; mean accepted drafts under (3, 8): 1.2
    expected tokens / s: (0, 1) 1 / 0.060 = 16.7;  (3, 8) 2.2 / 0.100 = 22.0  -> (3, 8)
    if acceptance drops to 0.5 accepted drafts: 1.5 / 0.100 = 15.0 < 16.7    -> (0, 1)
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

from .calibration import calibration_bin

__all__ = ["ACCEPTANCE_MODELS", "Tier", "TierChooser", "parse_tiers"]

#: how a tier's expected tokens are estimated (module docstring, "How the expected tokens are estimated")
ACCEPTANCE_MODELS = ("width", "pooled", "per_tier")


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


class TierChooser:
    """Host-side choice of the tier that maximises expected tokens per second (see the module docstring).

    Args:
        tiers: the tiers, at least one.
        probe_every: steps between re-measurements of a non-chosen tier (0: never re-measure).
        probe_backoff: the longest probe gap, in multiples of ``probe_every``, that lost probes double it to (1: fixed
            gap).
        unpriced_first: the first steps of each tier (at any batch size) whose timings are dropped (warm-up).
        alpha_bins: alpha bins of the acceptance averages (0: one average per tier, alpha ignored).
        smoothing: weight of a new sample in the moving averages (acceptance, overhead), in (0, 1].
        cost_window: step timings kept per tier and batch size (the cost is their low median).
        bound_slack: a tier is measured at a new batch size only if its rate there, with its step cost bounded below
            (:meth:`cost_bound`, less this fraction), could beat the best rate measured there (1: every tier is
            measured at every batch size).
        acceptance: ``"per_tier"`` (each tier's moving averages), ``"pooled"`` (one per-level model for all tiers)
            or ``"width"`` (one per verify width); module docstring.
        memory: with a level model, the steps (of its group) over which its counts decay by a factor ``e``.
        probe_confidence: ``z`` of :meth:`optimistic_rate`, which a probe must lose at to back off (0: any loss).
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        probe_every: int = 16,
        smoothing: float = 0.2,
        cost_window: int = 9,
        probe_backoff: int = 8,
        unpriced_first: int = 1,
        alpha_bins: int = 0,
        bound_slack: float = 0.1,
        acceptance: str = "per_tier",
        memory: int = 100,
        probe_confidence: float = 0.0,
    ) -> None:
        if not tiers:
            raise ValueError("at least one tier")
        if acceptance not in ACCEPTANCE_MODELS or memory < 1:
            raise ValueError(f"acceptance one of {ACCEPTANCE_MODELS}, memory >= 1")
        self.acceptance = acceptance
        self._decay = 1.0 - 1.0 / memory
        # level models: (group, alpha bin or None for all, level j) -> [requests that reached level j, of those
        # accepted there]; the group is None (pooled) or the tier's draft tokens (width)
        self._levels: dict[tuple[int | None, int | None, int], list[float]] = {}
        if probe_backoff < 1 or probe_confidence < 0:
            raise ValueError("probe_backoff >= 1, probe_confidence >= 0")
        self.probe_confidence = probe_confidence
        self.tiers = tuple(sorted(set(tiers)))
        self.probe_every = probe_every
        self.smoothing = smoothing
        self.cost_window = cost_window
        self._cost: dict[tuple[Tier, int], deque[float]] = {}
        self._accepted: dict[Tier, float] = {t: 0.0 for t in self.tiers if t.off}
        self.alpha_bins = alpha_bins
        self.bound_slack = bound_slack
        self._accepted_bin: dict[tuple[Tier, int], float] = {}
        self._last_used: dict[Tier, int] = {t: -1 for t in self.tiers}
        self.probe_backoff = probe_backoff
        self._unpriced = {t: unpriced_first for t in self.tiers}  # warm-up steps left per tier
        self._gap: dict[Tier, int] = {t: probe_every for t in self.tiers}
        # (step, tier, batch size, alpha bin) of the probe awaiting its verdict
        self._probe: tuple[int, Tier, int, int | None] | None = None
        # (step, tier, alpha bin) per step awaiting feedback; a step whose feedback never comes cannot pile up
        self._pending: deque[tuple[int, Tier, int | None]] = deque(maxlen=8)
        self._overhead: float | None = None
        self._steps_at: dict[tuple[Tier, int], int] = {}  # steps run per (tier, size class)
        self._classes: tuple[int, ...] = ()  # captured batch sizes, ascending (empty: every size its own class)
        # per tier: accepted drafts summed over every request of every credited step, and that request count
        self._lifetime: dict[Tier, list[int]] = {t: [0, 0] for t in self.tiers}
        self._steps = 0

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

    # -- estimates ----------------------------------------------------------------------------------------
    def alpha_bin(self, alpha: float | None) -> int | None:
        """The acceptance bin of a step whose batch has mean alpha ``alpha`` (None: no bins or no alpha)."""
        if not self.alpha_bins or alpha is None or alpha != alpha:  # NaN: no confidence known
            return None
        return calibration_bin(alpha, self.alpha_bins)

    def expected_tokens(self, tier: Tier, alpha: float | None = None, z: float = 0.0) -> float | None:
        """Expected tokens per request per step under ``tier`` when the batch's mean alpha is ``alpha`` (None until
        observed; per_tier: a bin without a sample falls back to the tier's overall average; pooled and width:
        :meth:`_pooled`; the off tier: 1).  ``z`` > 0: that many standard errors high (level models: per level;
        per_tier: the Bhatia-Davis bound ``acc (steps - acc)`` on a request's variance, over the requests served)."""
        b = self.alpha_bin(alpha)
        if self.acceptance != "per_tier" and not tier.off:
            return self._pooled(tier, b, z)
        acc = self._accepted.get(tier) if b is None else self._accepted_bin.get((tier, b), self._accepted.get(tier))
        if acc is None:
            return None
        n = max(self._lifetime[tier][1], 1)
        return 1.0 + acc + z * (max(acc * (tier.steps - acc), 0.0) / n) ** 0.5

    def _group(self, tier: Tier) -> int | None:
        """The level model ``tier`` shares: None (every tier, ``pooled``) or its verify width (``width``)."""
        return tier.draft_tokens if self.acceptance == "width" else None

    def _pooled(self, tier: Tier, b: int | None, z: float = 0.0) -> float | None:
        """``1 + sum_{j <= steps} prod_{i <= j} h_i`` from the level counts of the tier's group and bin ``b`` (a level
        the bin has not reached: all bins'); None before any request of the group reached level 1.  ``z`` > 0: each
        ``h`` raised by ``z`` standard errors of a proportion, ``sqrt(h (1 - h) / (reached + 1))``, at most 1."""
        g = self._group(tier)
        if (g, None, 1) not in self._levels:
            return None
        expected = survive = 1.0
        for j in range(1, tier.steps + 1):
            reached, passed = self._levels.get((g, b, j)) or self._levels.get((g, None, j)) or (0.0, 0.0)
            h = (passed + 0.5) / (reached + 1.0)
            survive *= min(1.0, h + z * (h * (1.0 - h) / (reached + 1.0)) ** 0.5)
            expected += survive
        return expected

    def cost(self, tier: Tier, batch_size: int) -> float | None:
        """Measured seconds per step of ``tier`` at ``batch_size``'s size class (None until measured)."""
        samples = self._cost.get((tier, self.size_class(batch_size)))
        return None if not samples else statistics.median_low(samples)

    def rate(self, tier: Tier, batch_size: int, alpha: float | None = None) -> float | None:
        """Expected tokens per second of the whole batch (None while either estimate is missing)."""
        return self._per_second(batch_size, self.expected_tokens(tier, alpha), self.cost(tier, batch_size))

    def optimistic_rate(self, tier: Tier, batch_size: int, alpha: float | None = None) -> float | None:
        """The rate ``tier`` could still have at ``batch_size``: its fastest measured step there (noise only slows a
        step) and its expected tokens ``probe_confidence`` standard errors high.  None while either is unmeasured."""
        samples = self._cost.get((tier, self.size_class(batch_size)))
        tokens = self.expected_tokens(tier, alpha, self.probe_confidence)
        return self._per_second(batch_size, tokens, min(samples) if samples else None)

    def _per_second(self, batch_size: int, tokens: float | None, cost: float | None) -> float | None:
        """``batch_size * tokens`` over a step of ``cost`` plus the per-step overhead (None if unknown or not > 0)."""
        step = None if cost is None else cost + (self._overhead or 0.0)
        if tokens is None or step is None or step <= 0.0:
            return None
        return batch_size * tokens / step

    def best(self, batch_size: int, alpha: float | None = None) -> Tier | None:
        """The tier with the highest known rate at ``batch_size`` and mean alpha ``alpha`` (ties: fewer steps); None if
        none is known."""
        rated = [(r, t) for t in self.tiers if (r := self.rate(t, batch_size, alpha)) is not None]
        if not rated:
            return None
        top = max(r for r, _ in rated)
        return min(t for r, t in rated if r == top)

    # -- the per-step protocol ----------------------------------------------------------------------------
    def choose(self, batch_size: int, alpha: float | None = None) -> Tier:
        """The tier of the step about to start, for a batch of mean alpha ``alpha`` (None: unknown); recorded as
        pending until :meth:`observe`."""
        self._steps += 1
        self._judge_probe()
        b = self.alpha_bin(alpha)
        tier = self._unmeasured(batch_size, alpha)
        if tier is None:
            tier = self.best(batch_size, alpha) or self.tiers[-1]
            self._gap[tier] = self.probe_every
            if self.probe_every and self._probe is None:
                due = [t for t in self.tiers if t != tier and self._steps - self._last_used[t] >= self._gap[t]]
                if due:
                    tier = min(due, key=lambda t: (self._last_used[t], t))
                    self._probe = (self._steps, tier, batch_size, alpha)
        self._last_used[tier] = self._steps
        key = (tier, self.size_class(batch_size))
        self._steps_at[key] = self._steps_at.get(key, 0) + 1
        self._pending.append((self._steps, tier, b))
        return tier

    def probe_gap(self, tier: Tier) -> int:
        """Steps ``tier`` may go unchosen before it is re-measured."""
        return self._gap[tier]

    def _judge_probe(self) -> None:
        """Once the last probe's feedback is in (or was dropped): a loss (at the optimistic rate) doubles the gap."""
        if self._probe is None:
            return
        step, tier, bs, alpha = self._probe
        if any(s == step for s, _, _ in self._pending):
            return
        self._probe = None
        best = self.best(bs, alpha)
        if best == tier or (self.probe_confidence > 0 and self._could_win(tier, best, bs, alpha)):
            self._gap[tier] = self.probe_every
        else:
            self._gap[tier] = min(2 * self._gap[tier], self.probe_backoff * self.probe_every)

    def _could_win(self, tier: Tier, best: Tier | None, batch_size: int, alpha: float | None) -> bool:
        """Whether ``tier``'s :meth:`optimistic_rate` reaches ``best``'s rate (True when either is unknown)."""
        opt, top = self.optimistic_rate(tier, batch_size, alpha), best and self.rate(best, batch_size, alpha)
        return opt is None or top is None or opt >= top

    def record_cost(self, tier: Tier, batch_size: int, seconds: float) -> None:
        """A measured step time of ``tier`` at ``batch_size`` (kept for its size class; dropped while the tier is warming
        up)."""
        if self._unpriced[tier] > 0:
            self._unpriced[tier] -= 1
            return
        key = (tier, self.size_class(batch_size))
        self._cost.setdefault(key, deque(maxlen=self.cost_window)).append(seconds)

    def record_overhead(self, seconds: float) -> None:
        """A measured gap between two consecutive decode steps (the runtime's work outside the forwards)."""
        seconds = max(seconds, 0.0)
        old = self._overhead
        self._overhead = seconds if old is None else old + self.smoothing * (seconds - old)

    def observe(self, accepted_drafts: Sequence[int]) -> Tier | None:
        """Accepted draft counts (bonus token excluded) of the oldest pending step, one per request.

        Returns the tier they are credited to (None when no step is pending: a prefill's feedback).
        """
        if not self._pending:
            return None
        _, tier, b = self._pending.popleft()
        if tier.off or not accepted_drafts:
            return tier
        self._lifetime[tier][0] += sum(accepted_drafts)
        self._lifetime[tier][1] += len(accepted_drafts)
        if self.acceptance != "per_tier":
            self._count_levels(tier, b, accepted_drafts)
            return tier
        mean = sum(accepted_drafts) / len(accepted_drafts)
        self._accepted[tier] = self._ema(self._accepted.get(tier), mean)
        if b is not None:
            self._accepted_bin[(tier, b)] = self._ema(self._accepted_bin.get((tier, b)), mean)
        return tier

    def _count_levels(self, tier: Tier, b: int | None, accepted_drafts: Sequence[int]) -> None:
        """Count one step's requests into the tier's group, after decaying the group's counts by one step."""
        g = self._group(tier)
        for key, counts in self._levels.items():
            if key[0] == g:
                counts[0] *= self._decay
                counts[1] *= self._decay
        for key in {None, b}:
            for a in accepted_drafts:
                for j in range(1, min(a + 1, tier.steps) + 1):
                    counts = self._levels.setdefault((g, key, j), [0.0, 0.0])
                    counts[0] += 1.0
                    counts[1] += float(a >= j)

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)

    def _unmeasured(self, batch_size: int, alpha: float | None = None) -> Tier | None:
        """The tier to measure before choosing, if any.

        First a tier with no acceptance estimate yet (largest first: its acceptance bounds the others'); then, at a
        batch size not measured yet, the cheapest-known tier first (the off tier: it sets the rate to beat), each
        other tier only while it could still beat the best rate measured there (:meth:`_can_win`).
        """
        for tier in reversed(self.tiers):
            if self.expected_tokens(tier) is None:
                return tier
        for tier in self.tiers:
            if self.cost(tier, batch_size) is None and self._can_win(tier, batch_size, alpha):
                return tier
        return None

    def cost_bound(self, tier: Tier, batch_size: int) -> float | None:
        """A lower bound on ``tier``'s step seconds at ``batch_size``, from the nearest smaller batch size ``b`` where
        it was measured: its cost there, scaled by the smallest tier's growth from ``b`` to ``batch_size`` when that is
        measured at both, times ``1 - bound_slack``; None when no smaller size is measured.

        It holds while a larger tier's cost relative to the smallest tier's does not fall as the batch grows (its
        extra verified tokens turn compute-bound first); ``bound_slack`` absorbs this CPU's row-count kinks.
        """
        smaller = [bs for (t, bs) in self._cost if t == tier and bs < self.size_class(batch_size)]
        if not smaller or self.bound_slack >= 1.0:
            return None
        b = max(smaller)
        bound = self.cost(tier, b)
        ref_now, ref_then = self.cost(self.tiers[0], batch_size), self.cost(self.tiers[0], b)
        if tier != self.tiers[0] and ref_now is not None and ref_then is not None:
            bound *= max(1.0, ref_now / ref_then)
        return (1.0 - self.bound_slack) * bound

    def row_threshold(self, tier: Tier, batch_size: int, alpha: float | None = None) -> float:
        """The draft path probability below which verifying one more node of ``tier`` costs the batch more than it
        returns (a ragged verify, ``ragged_verify``); 0 while anything it needs is unmeasured.

        A step of ``tier`` costs ``C`` where the off tier costs ``C0``; spread over the ``N - 1`` nodes each of the
        ``B`` requests verifies, one node costs ``m = (C - C0) / (B (N - 1))`` seconds (an upper bound: ``C - C0``
        also holds the draft's work).  The batch earns ``B tau / C`` tokens a second (``tau`` the tier's expected
        tokens), and a node earns its acceptance probability ``p`` tokens, so it pays when ``p / m >= B tau / C``:
        ``p >= (C - C0) tau / ((N - 1) C)``.  Batch 16, ``[1, 2]`` at 140.5 ms, off 101.5 ms, 1.53 tokens: 0.42.
        """
        off = next((t for t in self.tiers if t.off), None)
        if tier.off or off is None or tier.draft_tokens < 2:
            return 0.0
        c, c0, tau = self.cost(tier, batch_size), self.cost(off, batch_size), self.expected_tokens(tier, alpha)
        if c is None or c0 is None or tau is None or c <= c0:
            return 0.0
        return min(1.0, (c - c0) * tau / ((tier.draft_tokens - 1) * c))

    def _can_win(self, tier: Tier, batch_size: int, alpha: float | None) -> bool:
        """Whether ``tier``'s best possible rate at ``batch_size`` (its expected tokens at ``alpha`` over
        :meth:`cost_bound`) exceeds the best rate measured there; True when either side is unknown."""
        bound, best = self.cost_bound(tier, batch_size), self.best(batch_size, alpha)
        if bound is None or best is None:
            return True
        optimistic = self._per_second(batch_size, self.expected_tokens(tier, alpha), bound)
        return optimistic > self.rate(best, batch_size, alpha)

    def summary(self) -> dict[str, dict[str, float | None]]:
        """Per tier: expected tokens per request (the chooser's current estimates: overall, and per alpha bin
        ``tokens@aB``), ``mean_tokens`` (tokens per request averaged over every request the tier ever served, None
        before any; the off tier: 1.0), the measured cost (ms) at each size class seen (:meth:`size_class`: the batch size
        itself without captured sizes) and the steps run there."""
        out: dict[str, dict[str, float | None]] = {}
        levels = self.acceptance != "per_tier"
        for t in self.tiers:
            steps_at = {bs: n for (tt, bs), n in sorted(self._steps_at.items(), key=lambda kv: kv[0][1]) if tt == t}
            row: dict[str, float | None] = {"tokens": self.expected_tokens(t), "steps": sum(steps_at.values())}
            total, n = self._lifetime[t]
            row["mean_tokens"] = 1.0 if t.off else (round(1.0 + total / n, 3) if n else None)
            for b in range(self.alpha_bins):
                if not t.off and ((self._group(t), b, 1) in self._levels if levels else (t, b) in self._accepted_bin):
                    row[f"tokens@a{b}"] = round(self.expected_tokens(t, (b + 0.5) / self.alpha_bins), 3)
            for tt, bs in sorted(self._cost, key=lambda k: k[1]):
                if tt == t:
                    row[f"ms@{bs}"] = round(1000.0 * self.cost(tt, bs), 2)
            row.update({f"steps@{bs}": n for bs, n in steps_at.items()})
            out[f"{t.steps}:{t.draft_tokens}"] = row
        out["overhead"] = {"ms": None if self._overhead is None else round(1000.0 * self._overhead, 2)}
        return out
