"""The median request's price (``BreakEven.median_pays``, ``TierChooser.best(median=...)``) against a naive oracle:
a drafted tier is chosen only where it also pays for the batch's median request."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.serving.request_acceptance import RequestAcceptance
from sage_plugin.serving.tiers import Tier, TierChooser

OFF, ONE, DEEP = Tier(0, 1), Tier(1, 2), Tier(3, 4)


def _chooser(bs: int, costs: dict[Tier, float], accepted: dict[Tier, list[int]], doubt: float = 0.0) -> TierChooser:
    """A measured chooser: each tier's step at ``bs`` costs ``costs[tier]`` and its requests accepted ``accepted``."""
    chooser = TierChooser(list(costs), probe_every=0, unpriced_first=0, doubt=doubt)
    for tier, seconds in costs.items():
        for _ in range(3):
            chooser.record_cost(tier, bs, seconds)
    for tier in sorted(accepted, reverse=True):  # unestimated tiers run first, the largest first
        assert chooser.choose(bs) == tier
        chooser.observe(accepted[tier])
    return chooser


def test_the_worked_example():
    """Batch 4, ``[1, 2]`` at 80 ms, off at 60 ms, 1.5 tokens expected, factors 0.2, 0.3, 0.5 and 3.0."""
    chooser = _chooser(4, {OFF: 0.060, ONE: 0.080}, {ONE: [0, 1, 0, 1]})
    assert chooser.expected_tokens(ONE) == pytest.approx(1.5)
    factors = [0.2, 0.3, 0.5, 3.0]
    median = statistics.median(factors)
    assert median == pytest.approx(0.4)
    assert chooser.rate(ONE, 4, speculating=sum(factors)) == pytest.approx(6.0 / 0.080)  # 75 tokens/s
    assert chooser.rate(OFF, 4) == pytest.approx(4.0 / 0.060)  # 66.7
    assert chooser.best(4, speculating=sum(factors)) == ONE  # the batch's rate alone drafts
    assert not chooser.median_pays(ONE, 4, None, median)  # 1.2 tokens: 60 tokens/s for a batch like it
    assert chooser.best(4, speculating=sum(factors), median=median) == OFF
    assert chooser.choose(4, speculating=sum(factors), median=median) == OFF
    assert chooser.choose(4, speculating=sum(factors)) == ONE
    # a median request that pays: factors 0.6, 0.8, 1.0, 1.6 (median 0.9: 1.45 tokens, 72.5 tokens/s)
    assert chooser.median_pays(ONE, 4, None, 0.9)
    assert chooser.best(4, speculating=4.0, median=0.9) == ONE
    assert chooser.median_pays(OFF, 4, None, 0.0)  # the off tier always pays for itself


def test_the_median_request_is_priced_with_the_doubt_and_the_admissions_of_the_batch():
    """The median request's tokens are ``doubt`` standard errors low, as the batch's; a chooser without an off tier
    has nothing to compare with and prices the batch alone."""
    chooser = _chooser(4, {OFF: 0.060, ONE: 0.080}, {ONE: [0, 1, 0, 1]}, doubt=1.0)
    low = chooser.expected_tokens(ONE, z=-1.0)
    assert low < 1.5
    pays = (1.0 + (low - 1.0) * 1.0) / 0.080 >= 1.0 / 0.060
    assert chooser.median_pays(ONE, 4, None, 1.0) == pays
    no_off = _chooser(4, {ONE: 0.080, DEEP: 0.120}, {DEEP: [1, 1, 1, 1], ONE: [0, 0, 0, 1]})
    assert no_off.median_pays(ONE, 4, None, 0.0) and no_off.best(4, median=0.0) is not None


def _naive_best(bs, costs, tokens, factors, steps):
    """The oracle: each tier's batch rate ``min(B + (tau - 1) sum f, B (1 + s)) / C``; a drafted tier qualifies only
    if the median request's time a token, ``C / min(1 + (tau - 1) median f, 1 + s)``, is at most the off step's."""
    med = statistics.median(factors)
    off_cost = costs[OFF]
    best, top = None, None
    for tier in sorted(costs):
        tau = tokens[tier]
        total = min(bs + (tau - 1.0) * sum(factors), bs * (1.0 + steps[tier])) if not tier.off else float(bs)
        rate = total / costs[tier]
        if not tier.off and costs[tier] / min(1.0 + (tau - 1.0) * med, 1.0 + steps[tier]) > off_cost:
            continue
        if top is None or rate > top:
            best, top = tier, rate
    return best


@settings(max_examples=150, deadline=None)
@given(
    bs=st.integers(1, 16),
    off_cost=st.floats(0.02, 0.2),
    extra=st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 2.0)),
    accepted=st.tuples(st.lists(st.integers(0, 1), min_size=4, max_size=4),
                       st.lists(st.integers(0, 3), min_size=4, max_size=4)),
    factors=st.lists(st.floats(0.0, 4.0), min_size=1, max_size=16),
)  # fmt: skip
def test_the_choice_matches_the_naive_oracle(bs, off_cost, extra, accepted, factors):
    """Random step prices, acceptance and request factors: the tier chosen with the median request priced is the
    oracle's (ties aside: rates within 1e-9 of each other are not told apart)."""
    factors = (factors * bs)[:bs]
    costs = {OFF: off_cost, ONE: off_cost * (1 + extra[0]), DEEP: off_cost * (1 + extra[0] + extra[1])}
    chooser = _chooser(bs, costs, {DEEP: accepted[1], ONE: accepted[0]})
    tokens = {t: chooser.expected_tokens(t) for t in costs}
    steps = {t: t.steps for t in costs}
    want = _naive_best(bs, costs, tokens, factors, steps)
    got = chooser.best(bs, speculating=sum(factors), median=statistics.median(factors))
    if got != want:  # only a near-tie may differ
        rates = {t: chooser.rate(t, bs, speculating=sum(factors)) for t in (got, want)}
        near = abs(rates[got] - rates[want]) <= 1e-9 * rates[want]
        med = statistics.median(factors)
        edge = [abs(costs[t] / min(1 + (tokens[t] - 1) * med, 1 + t.steps) - off_cost) <= 1e-9 for t in (ONE, DEEP)]
        assert near or any(edge)
    # without the median the choice is the batch's alone, never slower for the batch than with it
    alone = chooser.best(bs, speculating=sum(factors))
    assert chooser.rate(alone, bs, speculating=sum(factors)) >= chooser.rate(got, bs, speculating=sum(factors))


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=5, max_size=5), st.floats(0.1, 3.0)), max_size=30),
    mask=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_the_median_factor_is_the_median_of_the_drafting_requests_and_zeros(steps, mask):
    ra = RequestAcceptance()
    keys = ["a", "b", "c", "d", "e"]
    for accepted, expected in steps:
        ra.observe(keys, accepted, expected)
    want = statistics.median([ra.factor(k) if m else 0.0 for k, m in zip(keys, mask)])
    assert ra.median(keys, mask) == pytest.approx(want)
    assert ra.median(keys) == pytest.approx(statistics.median(ra.factor(k) for k in keys))
    assert RequestAcceptance().median(["new"]) == 1.0
