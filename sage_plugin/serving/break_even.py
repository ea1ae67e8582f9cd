"""What one more verified node, or one more drafting request, must return for a tier's step to pay: the break-even
thresholds the tier chooser hands a ragged verify (:meth:`BreakEven.row_threshold`) and the per-request gate
(:meth:`BreakEven.request_break_even`), from the measured step prices of the tier and of the off tier, and whether a
drafted step pays for the batch's median request too (:meth:`BreakEven.median_pays`).

Both compare a drafted tier's step price ``C`` with the off tier's ``C0`` at the same batch size ``B``: the
difference is what the drafts cost, and the tier's expected tokens ``tau`` per request what the step earns.
:meth:`BreakEven.worth_probing` puts off the probe of a tier that could not pay even with every draft accepted, and a
probe is judged at :meth:`BreakEven.optimistic_rate`.
Host-side floats only.
"""

from __future__ import annotations

from .tier_costs import Tier

__all__ = ["BreakEven", "top_tier"]


class BreakEven:
    """Break-even thresholds of a :class:`~.tiers.TierChooser` (its base: reads its ``tiers``, ``cost``,
    ``expected_tokens``, rates, probe gaps and the per-step overhead)."""

    def row_threshold(self, tier: Tier, batch_size: int, alpha: float | None = None) -> float:
        """The draft path probability below which verifying one more node of ``tier`` costs the batch more than it
        returns (a ragged verify, ``ragged_verify``); 0 while anything it needs is unmeasured.

        A step of ``tier`` costs ``C`` where the off tier costs ``C0``; spread over the ``N - 1`` nodes each of the
        ``B`` requests verifies, one node costs ``m = (C - C0) / (B (N - 1))`` seconds (an upper bound: ``C - C0``
        also holds the draft's work).  The batch earns ``B tau / C`` tokens a second (``tau`` the tier's expected
        tokens), and a node earns its acceptance probability ``p`` tokens, so it pays when ``p / m >= B tau / C``:
        ``p >= (C - C0) tau / ((N - 1) C)``.  Batch 16, ``[1, 2]`` at 140.5 ms, off 101.5 ms, 1.53 tokens: 0.42.
        """
        prices = self._drafted_prices(tier, batch_size, alpha) if tier.draft_tokens >= 2 else None
        if prices is None:
            return 0.0
        c, c0, tau = prices
        return min(1.0, (c - c0) * tau / ((tier.draft_tokens - 1) * c))

    def request_break_even(self, tier: Tier, batch_size: int, alpha: float | None = None) -> float:
        """The accepted drafts a request must add per step of ``tier`` at ``batch_size`` for its share of the step's
        extra cost to pay (a per-request gate's threshold, :mod:`.request_gate`); 0 while anything is unmeasured.

        With ``C`` and ``C0`` the tier's and the off tier's step prices, a request's draft rows cost about ``(C - C0) /
        B`` of a step the batch earns ``B tau`` tokens in, so they pay when its extra tokens reach ``tau (C - C0) / C``.
        Batch 16, ``[1, 2]`` at 139.8 ms, off 95.7 ms, 1.46 tokens: 0.46.
        """
        prices = self._drafted_prices(tier, batch_size, alpha)
        if prices is None:
            return 0.0
        c, c0, tau = prices
        return tau * (c - c0) / (c + (self.overhead_seconds() or 0.0))

    def worth_probing(self, tier: Tier, best: Tier, batch_size: int, alpha: float | None = None) -> bool:
        """Whether a probe of ``tier`` that is due at ``batch_size`` runs (``best``: the tier chosen there).

        A probe re-measures a tier whose acceptance may have changed; it cannot show a win where ``tier`` would lose
        to ``best`` even with every draft accepted (``1 + steps`` tokens a request) at its fastest step measured
        there.  Such a probe is put off to the longest gap (``probe_backoff * probe_every``), which still re-measures
        the cost now and then.  True while either rate is unknown.  Example: batch 16, ``[3, 4]`` measured at
        248 ms, off at 40 ms: 16 x 4 / 0.248 = 258 tokens/s at most against 400, so it waits the longest gap.
        """
        ceiling = self._per_second(batch_size, 1.0 + tier.steps, self.fastest_cost(tier, batch_size), tier)
        top, longest = self.rate(best, batch_size, alpha), self.probe_backoff * self.probe_every
        if ceiling is None or top is None or ceiling > top or self._gap[tier] >= longest:
            return True
        self._gap[tier] = longest
        return False

    def median_pays(
        self,
        tier: Tier,
        batch_size: int,
        alpha: float | None,
        median: float,
        behind: bool | None = None,
        regime: Tier | None = None,
        floor: float | None = None,
    ) -> bool:
        """Whether a step of ``tier`` at ``batch_size`` also pays for the batch's median request, of factor ``median``
        on the tier's expected accepted drafts (:mod:`.request_acceptance`; 0 when it does not draft): a batch of
        requests all like it rates at least the off tier's (both as :meth:`rate` prices them, the drafted tokens
        ``doubt`` standard errors low; ``floor``: the off tier's rate if the caller has it).  True for the off tier,
        without one, or while either rate is unknown.

        The batch's rate weighs each request by its tokens: out of domain a few requests accepting a draft most steps
        carry a drafted step whose other requests each wait longer for their one token than an off step would keep
        them, and the median request's time per token rises while the batch's tokens per second hold.  A rate of
        ``B t / S`` against ``B / S0`` is the same test as the median request's time per token, ``S / t`` against
        ``S0`` (``t = 1 + (tau - 1) median``, its tokens a step).  Batch 4, ``[1, 2]`` at 80 ms, off at 60 ms, 1.5
        tokens expected, no doubt, factors 0.2, 0.3, 0.5 and 3.0: the batch earns ``4 + 0.5 x 4 = 6`` tokens, 75
        tokens/s against 66.7, but the median request (factor 0.4) 1.2 tokens a step, 60 tokens/s for a batch like
        it: the off tier.
        """
        off = next((t for t in self.tiers if t.off), None)
        if tier.off or off is None:
            return True
        mine = self.rate(tier, batch_size, alpha, batch_size * median, -self.doubt, behind, regime)
        base = floor if floor is not None else self.rate(off, batch_size, alpha, None, 0.0, behind, regime)
        return mine is None or base is None or mine >= base

    def optimistic_rate(self, tier: Tier, batch_size: int, alpha: float | None = None) -> float | None:
        """The rate ``tier`` could still have at ``batch_size``: its fastest measured step there (noise only slows a
        step) and its expected tokens ``probe_confidence`` standard errors high.  None while either is unmeasured."""
        tokens = self.expected_tokens(tier, alpha, self.probe_confidence, batch_size)
        return self._per_second(batch_size, tokens, self.fastest_cost(tier, batch_size), tier)

    def _could_win(self, tier: Tier, best: Tier | None, batch_size: int, alpha: float | None) -> bool:
        """Whether ``tier``'s :meth:`optimistic_rate` reaches ``best``'s rate (True when either is unknown)."""
        opt, top = self.optimistic_rate(tier, batch_size, alpha), best and self.rate(best, batch_size, alpha)
        return opt is None or top is None or opt >= top

    def _can_win(self, tier: Tier, batch_size: int, alpha: float | None) -> bool:
        """Whether ``tier``'s best possible rate at ``batch_size`` (its expected tokens at ``alpha`` over
        :meth:`cost_bound`) exceeds the best rate measured there; True when either side is unknown."""
        bound, best = self.cost_bound(tier, batch_size), self.best(batch_size, alpha)
        if bound is None or best is None:
            return True
        optimistic = self._per_second(batch_size, self.expected_tokens(tier, alpha, batch_size=batch_size), bound, tier)
        return optimistic > self.rate(best, batch_size, alpha)

    def _drafted_prices(self, tier: Tier, batch_size: int, alpha: float | None) -> tuple[float, float, float] | None:
        """``(C, C0, tau)`` of drafted ``tier`` at ``batch_size`` (module docstring); None for the off tier, without an
        off tier, while any is unmeasured, or where the tier's step costs no more than the off tier's."""
        off = next((t for t in self.tiers if t.off), None)
        if tier.off or off is None:
            return None
        c, c0 = self.cost(tier, batch_size), self.cost(off, batch_size)
        tau = self.expected_tokens(tier, alpha, batch_size=batch_size)
        if c is None or c0 is None or tau is None or c <= c0:
            return None
        return c, c0, tau


def top_tier(rated: list[tuple[float, Tier]]) -> Tier | None:
    """The tier of the highest rate in ``rated`` (ties: fewer steps; None when empty)."""
    if not rated:
        return None
    top = max(r for r, _ in rated)
    return min(t for r, t in rated if r == top)
