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
* ``"pooled"``: one level model (:mod:`.tier_levels`) shared by every tier: per level ``j`` the chance that a
  request's accepted path goes one level deeper, from every request of every step at any tier at least ``j`` deep, so
  a shallow tier's steps inform the deep ones; it assumes a level is as likely accepted whatever tier drafted it,
  which fails once the beam's most probable paths are verified (``rerank_pool: beam``: a ``[1, 2]`` tier verifies
  one node, ``[4, 8]`` seven, so the narrow tier's rejections price the wide tiers low;
  ``docs/design/sglang-internals.md``, "Tiers");
* ``"width"``: one level model per verify width (the tiers with the same ``draft_tokens`` share their counts; a
  deeper beam of the same width adds only deep candidates, so its shallow levels pass alike), a width not yet run
  measured first.

With the level models the control is acceptance-calibrated (``docs/design/serving-control.md``): ``prior_weight`` > 0
keeps acceptance per batch-size class and alpha bin, shrunk toward the broader estimates, with the draft's
confidence as the prior only; ``change_z`` > 0 replaces the long memory by a short one when acceptance changes;
``doubt`` > 0 makes the off tier the default under doubt (a drafted tier is chosen only if it wins with its expected
tokens ``doubt`` standard errors low); ``admission`` adds what each regime pays in admissions per token
(:mod:`.admission`); :meth:`TierChooser.choose` takes how many of the batch's requests speculate (a per-request gate,
:mod:`.request_gate`, whose threshold is :meth:`TierChooser.request_break_even`), each weighted by its own acceptance
(:mod:`.request_acceptance`), and their median factor, for which a drafted tier must pay too (``median_pays``).

A lagging draft (SGLang's ``tier_off_lag``: off steps skip the draft's extend, and the next drafted step first
catches the draft up in one forward, :meth:`record_catch_up` its price): :meth:`choose` takes whether the draft is
``behind``, and a step that switches against the batch size's *regime* pays the catch-up in its price.  The regime
is the tier that wins at the batch size with every tier's overall acceptance and no catch-up (the long-run choice);
a switch with it starts a run that amortises the catch-up, a switch against it (an off step on a low-alpha dip while
drafting pays, a probe) returns within a step or two and pays it whole.  Staying (off while behind, drafted while
current) pays nothing.  ``behind`` None (no lag) prices no catch-up.

The choice maximises ``expected tokens / cost``. A tier never measured at a batch size is tried first there (the
runtime's start-up measurement, amortised over the first steps at each batch size), cheapest first, and only while it
could still win there: its cost is bounded below from the nearest smaller measured batch size (grown as the smallest
tier's cost grew since) and the nearest larger one (its cost per request there), less ``bound_slack``, and a tier whose
rate under that bound cannot beat the best rate measured at this size is not run for its price (else a batch draining
through many sizes measures a deep tier that cannot pay at each). A tier not chosen is re-measured (*probed*) once it
has not run for its probe gap, so the estimates follow the traffic. The gap starts at ``probe_every`` steps; a probe the
tier loses (another tier still rates higher at that batch size once its feedback is in) doubles it, up to
``probe_backoff * probe_every``, and a tier that wins (probe or plain choice) is back to ``probe_every``: the back-off
bounds what a deep tier that cannot pay at a large batch costs in probes, and a change of traffic is still found within
``probe_backoff * probe_every`` steps, the gap a probe that could not win with every draft accepted waits
(:meth:`worth_probing`). With ``probe_confidence`` ``z`` > 0 a probe is lost only if the tier loses even at its
:meth:`optimistic_rate` (its fastest step there, its tokens ``z`` standard errors high). Feedback may lag: the
runtime calls :meth:`TierChooser.choose` when a step starts and :meth:`observe` when its accept counts reach the host,
possibly after later steps started (overlap scheduling); observations are matched to steps in launch order. Batch
sizes that run as one captured shape share their costs (:mod:`.tier_costs`).

Worked example (two tiers, batch 1)::

    tiers (0, 1) and (3, 8); costs measured 60 ms and 100 ms; mean accepted drafts under (3, 8): 1.2
    expected tokens / s: (0, 1) 1 / 0.060 = 16.7;  (3, 8) 2.2 / 0.100 = 22.0  -> (3, 8)
    if acceptance drops to 0.5 accepted drafts: 1.5 / 0.100 = 15.0 < 16.7    -> (0, 1)
    with a lagging draft, a catch-up measured at 20 ms and the regime (3, 8): a dip to 0.5 accepted drafts
    prices the off step that would leave the draft behind at 60 + 20 ms: 1 / 0.080 = 12.5 < 15.0  -> (3, 8)
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from ..core.calibration import calibration_bin
from .admission import AdmissionPrice
from .break_even import BreakEven, top_tier
from .tier_costs import Tier, TierCosts, parse_tiers
from .tier_levels import LevelModel
from .tier_report import TierTally, tier_summary

__all__ = ["ACCEPTANCE_MODELS", "TIER_CONTROLS", "Tier", "TierChooser", "parse_tiers"]

#: how a tier's expected tokens are estimated (module docstring, "How the expected tokens are estimated")
ACCEPTANCE_MODELS = ("width", "pooled", "per_tier")
#: the tier control (config ``tier_control``, ``docs/design/serving-control.md``): the chooser's arguments of each mode
TIER_CONTROLS = {
    "calibrated": {"prior_weight": 8.0, "change_z": 4.0, "doubt": 1.0, "admission": True},
    "measured": {"prior_weight": 0.0, "change_z": 0.0, "doubt": 0.0, "admission": False},
}


class TierChooser(BreakEven, TierCosts):
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
        bound_slack: a tier is measured at a new batch size only if its rate at its :meth:`cost_bound` less this
            fraction could beat the best rate measured there (1: every tier is measured at every batch size).
        acceptance: ``"per_tier"`` (each tier's moving averages), ``"pooled"`` (one per-level model for all tiers)
            or ``"width"`` (one per verify width); module docstring.
        memory: with a level model, the steps (of its group) over which its counts decay by a factor ``e``.
        probe_confidence: ``z`` of :meth:`optimistic_rate`, which a probe must lose at to back off (0: any loss).
        prior_weight, change_z: the level model's calibration and change detection (:class:`.tier_levels.LevelModel`;
            0: measured acceptance, no change detection).
        doubt: ``z`` by which a drafted tier's expected tokens are lowered when choosing (0: point estimates).
        admission: the admission price per token of each regime (None: not priced; :mod:`.admission`).
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
        prior_weight: float = 0.0,
        change_z: float = 0.0,
        doubt: float = 0.0,
        admission: AdmissionPrice | None = None,
    ) -> None:
        super().__init__(tiers, smoothing, cost_window, unpriced_first, bound_slack)
        if acceptance not in ACCEPTANCE_MODELS or memory < 1:
            raise ValueError(f"acceptance one of {ACCEPTANCE_MODELS}, memory >= 1")
        self.acceptance = acceptance
        # level models: one group per verify width (width) or one for all (pooled); tier_levels.py
        self.levels = LevelModel(memory, prior_weight, change_z, alpha_bins=alpha_bins)
        if probe_backoff < 1 or probe_confidence < 0 or doubt < 0:
            raise ValueError("probe_backoff >= 1, probe_confidence >= 0, doubt >= 0")
        self.doubt = doubt
        self.admission = admission
        self.probe_confidence = probe_confidence
        self.probe_every = probe_every
        self._accepted: dict[Tier, float] = {t: 0.0 for t in self.tiers if t.off}
        self.alpha_bins = alpha_bins
        self._accepted_bin: dict[tuple[Tier, int], float] = {}
        self._last_used: dict[Tier, int] = {t: -1 for t in self.tiers}
        self.probe_backoff = probe_backoff
        self._gap: dict[Tier, int] = {t: probe_every for t in self.tiers}
        # (step, tier, batch size, alpha bin) of the probe awaiting its verdict
        self._probe: tuple[int, Tier, int, int | None] | None = None
        # (step, tier, alpha bin, size class, expected tokens) per step awaiting feedback; lost feedback cannot pile up
        self._pending: deque[tuple[int, Tier, int | None, int, float | None]] = deque(maxlen=8)
        self.tally = TierTally(self.tiers)  # steps per size class, accepted drafts per request credited
        self._steps = 0
        self.median_offs = 0  # steps chosen off for the median request where the batch's rate alone drafts (metrics)

    # -- estimates ----------------------------------------------------------------------------------------
    def alpha_bin(self, alpha: float | None) -> int | None:
        """The acceptance bin of a step whose batch has mean alpha ``alpha`` (None: no bins or no alpha)."""
        if not self.alpha_bins or alpha is None or alpha != alpha:  # NaN: no confidence known
            return None
        return calibration_bin(alpha, self.alpha_bins)

    def expected_tokens(
        self, tier: Tier, alpha: float | None = None, z: float = 0.0, batch_size: int | None = None
    ) -> float | None:
        """Expected tokens per request per step under ``tier`` when the batch's mean alpha is ``alpha`` (None until
        observed; per_tier: a bin without a sample falls back to the tier's overall average; pooled and width: the
        level model's, at ``batch_size``'s size class when it is calibrated; the off tier: 1).  ``z``: that many
        standard errors high (< 0: low; level models: per level; per_tier: the Bhatia-Davis bound ``acc (steps -
        acc)`` on a request's variance, over the requests served), never below 1."""
        b = self.alpha_bin(alpha)
        if self.acceptance != "per_tier" and not tier.off:
            size = None if batch_size is None else self.size_class(batch_size)
            return self.levels.tokens(self._group(tier), tier.steps, size, b, z)
        acc = self._accepted.get(tier) if b is None else self._accepted_bin.get((tier, b), self._accepted.get(tier))
        if acc is None:
            return None
        n = max(self.tally.requests(tier), 1)
        return max(1.0, 1.0 + acc + z * (max(acc * (tier.steps - acc), 0.0) / n) ** 0.5)

    def has_bin_estimate(self, tier: Tier, b: int) -> bool:
        """Whether ``tier``'s acceptance in alpha bin ``b`` has samples of its own (else it falls back)."""
        per_tier = self.acceptance == "per_tier"
        return (tier, b) in self._accepted_bin if per_tier else self.levels.has(self._group(tier), b)

    def _group(self, tier: Tier) -> int | None:
        """The level model ``tier`` shares: None (every tier, ``pooled``) or its verify width (``width``)."""
        return tier.draft_tokens if self.acceptance == "width" else None

    def rate(
        self,
        tier: Tier,
        batch_size: int,
        alpha: float | None = None,
        speculating: float | None = None,
        z: float = 0.0,
        behind: bool | None = None,
        regime: Tier | None = None,
    ) -> float | None:
        """Expected tokens per second of the whole batch (None while either estimate is missing), ``speculating`` of
        its requests drafting (None: all; the others one token each; a float: the drafting requests weighted by their
        own acceptance, :mod:`.request_acceptance`), the tokens ``z`` standard errors off, the step charged
        :meth:`switch_cost` for a draft ``behind`` or not (None: no lag), against ``regime`` if given."""
        tokens = self.expected_tokens(tier, alpha, z, batch_size)
        cost = self.cost(tier, batch_size)
        if cost is not None and behind is not None:
            cost += self.switch_cost(tier, batch_size, speculating, behind, regime)
        return self._per_second(batch_size, tokens, cost, tier, speculating)

    def switch_cost(
        self,
        tier: Tier,
        batch_size: int,
        speculating: float | None = None,
        behind: bool = False,
        regime: Tier | None = None,
    ) -> float:
        """Catch-up seconds a step of ``tier`` at ``batch_size`` is charged with the draft ``behind`` (True) or current
        (False): the measured catch-up if the step switches against :meth:`regime` (``regime`` if the caller has it),
        else 0 (module docstring, "A lagging draft").  Regime drafted: an off step with the draft current pays it, a
        drafted step with the draft behind does not (the switch back starts a drafted run)."""
        price = self.catch_up(batch_size)
        if not price or tier.off == behind:  # off while behind, drafted while current: no switch
            return 0.0
        regime = regime or self.regime(batch_size, speculating)
        return price if regime is not None and regime.off != tier.off else 0.0

    def regime(self, batch_size: int, speculating: float | None = None, median: float | None = None) -> Tier | None:
        """The long-run tier at ``batch_size``: the best at overall acceptance (no alpha), no catch-up charged."""
        return self.best(batch_size, None, speculating, median=median)

    def _per_second(
        self, batch_size: int, tokens: float | None, cost: float | None, tier: Tier, speculating: float | None = None
    ) -> float | None:
        """The batch's tokens (``B + (tokens - 1) speculating``, at most ``1 + steps`` a request; None: all at ``tokens``)
        over ``cost`` plus the per-step overhead plus the regime's admission time for them (None: unknown, <= 0)."""
        step = None if cost is None else cost + (self.overhead_seconds() or 0.0)
        if tokens is None or step is None or step <= 0.0:
            return None
        n = batch_size if speculating is None or tier.off else speculating
        total = min(batch_size + n * (tokens - 1.0), batch_size * (1.0 + tier.steps))
        admission = 0.0 if self.admission is None else self.admission.per_token(not tier.off, batch_size)
        return total / (step + total * admission)

    def best(
        self,
        batch_size: int,
        alpha: float | None = None,
        speculating: float | None = None,
        drafted: bool = False,
        behind: bool | None = None,
        median: float | None = None,
    ) -> Tier | None:
        """The tier with the highest known rate at ``batch_size`` and mean alpha ``alpha`` (ties: fewer steps), a
        drafted tier's tokens ``doubt`` standard errors low, the catch-up charged as :meth:`rate` does for ``behind``
        (against the regime, found once for every tier); None if none is known.  ``drafted``: drafted tiers only.
        ``median``: the median request's factor; a drafted tier must also pay for it (:meth:`median_pays`)."""
        return self._ranked(batch_size, alpha, speculating, drafted, behind, median)[0]

    def _ranked(
        self, batch_size: int, alpha: float | None, speculating: float | None, drafted: bool, behind: bool | None,
        median: float | None,
    ) -> tuple[Tier | None, Tier | None]:  # fmt: skip
        """:meth:`best`, and the tier that wins on the batch's rate alone (``median`` not priced), from one pass."""
        candidates = [t for t in self.tiers if not (drafted and t.off)]
        lag = behind is not None and self.catch_up(batch_size)
        regime = self.regime(batch_size, speculating, median) if lag else None
        rated = [
            (r, t) for t in candidates
            if (r := self.rate(t, batch_size, alpha, speculating, 0.0 if t.off else -self.doubt, behind, regime))
            is not None
        ]  # fmt: skip
        alone = top_tier(rated)
        if median is None:
            return alone, alone
        floor = next((r for r, t in rated if t.off), None)  # the off tier's rate, priced once for every tier
        paying = [(r, t) for r, t in rated if self.median_pays(t, batch_size, alpha, median, behind, regime, floor)]
        return top_tier(paying), alone

    # -- the per-step protocol ----------------------------------------------------------------------------
    def choose(
        self,
        batch_size: int,
        alpha: float | None = None,
        speculating: float | None = None,
        behind: bool | None = None,
        median: float | None = None,
    ) -> Tier:
        """The tier of the step about to start, for a batch of mean alpha ``alpha`` (None: unknown) of which
        ``speculating`` would draft (:meth:`rate`; 0: the off tier, unmeasured tiers and probes wait), the draft
        ``behind`` or not (None: no lag; module docstring, "A lagging draft"), the median request's factor ``median``
        (None: not priced; :meth:`best`), pending until :meth:`observe`."""
        self._steps += 1
        self._judge_probe()
        off = self.tiers[0] if self.tiers[0].off else None
        tier = off if speculating == 0 and off is not None else self._unmeasured(batch_size, alpha)
        if tier is None:
            tier, alone = self._ranked(batch_size, alpha, speculating, False, behind, median)
            tier = tier or self.tiers[-1]
            self._gap[tier] = self.probe_every
            if self.probe_every and self._probe is None:
                due = [t for t in self.tiers if t != tier and self._steps - self._last_used[t] >= self._gap[t]]
                due = [t for t in due if self.worth_probing(t, tier, batch_size, alpha)]
                if due:
                    tier = min(due, key=lambda t: (self._last_used[t], t))
                    self._probe = (self._steps, tier, batch_size, alpha)
            self.median_offs += median is not None and tier.off and alone is not None and not alone.off
        self._last_used[tier] = self._steps
        size = self.size_class(batch_size)
        expected = None if tier.off else self.expected_tokens(tier, alpha, 0.0, batch_size)
        self.tally.count_step(tier, size)
        self._pending.append((self._steps, tier, self.alpha_bin(alpha), size, expected))
        return tier

    def probe_gap(self, tier: Tier) -> int:
        """Steps ``tier`` may go unchosen before it is re-measured."""
        return self._gap[tier]

    def _judge_probe(self) -> None:
        """Once the last probe's feedback is in (or was dropped): a loss (at the optimistic rate) doubles the gap."""
        if self._probe is None:
            return
        step, tier, bs, alpha = self._probe
        if any(p[0] == step for p in self._pending):
            return
        self._probe = None
        best = self.best(bs, alpha)
        if best == tier or (self.probe_confidence > 0 and self._could_win(tier, best, bs, alpha)):
            self._gap[tier] = self.probe_every
        else:
            self._gap[tier] = min(2 * self._gap[tier], self.probe_backoff * self.probe_every)

    def observe(self, accepted_drafts: Sequence[int], others: int = 0) -> Tier | None:
        """Accepted draft counts (bonus token excluded) of the oldest pending step, one per request (with a
        per-request gate: the drafting requests only, and ``others`` the step's requests that did not draft); returns
        the tier they are credited to (None when no step is pending: a prefill's feedback)."""
        if not self._pending:
            return None
        _, tier, b, size, expected = self._pending.popleft()
        if self.admission is not None:
            n = len(accepted_drafts) + others
            self.admission.step(not tier.off, sum(accepted_drafts) + n, n)
        if tier.off or not accepted_drafts:
            return tier
        self.tally.credit(tier, accepted_drafts, size, expected)
        if self.acceptance != "per_tier":
            self.levels.count(self._group(tier), tier.steps, accepted_drafts, size, b)
            return tier
        mean = sum(accepted_drafts) / len(accepted_drafts)
        self._accepted[tier] = self._ema(self._accepted.get(tier), mean)
        if b is not None:
            self._accepted_bin[(tier, b)] = self._ema(self._accepted_bin.get((tier, b)), mean)
        return tier

    def record_prefill(self, seconds: float) -> None:
        """A measured prefill pass (admissions into the running batch), for the admission price (if any)."""
        if self.admission is not None:
            self.admission.prefill(seconds)

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

    def summary(self) -> dict[str, dict[str, float | None]]:
        """The chooser's estimates, costs and step counts for metrics (:func:`.tier_report.tier_summary`)."""
        return tier_summary(self)
