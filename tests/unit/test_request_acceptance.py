"""Each request's acceptance factor (``serving/request_acceptance.py``) against a naive oracle, and the chooser's price
of a batch whose drafting requests are weighted by it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.serving.request_acceptance import RequestAcceptance
from sage_plugin.serving.tiers import Tier, TierChooser

OFF, ONE, DEEP = Tier(0, 1), Tier(1, 2), Tier(3, 4)


def _naive_factor(history: list[tuple[int, float]], prior: float, memory: int) -> float:
    """``(A + c) / (E + c)`` from a request's drafted steps ``(accepted, expected)``, oldest first, each weighted by
    ``(1 - 1/memory) ** age``."""
    d = 1.0 - 1.0 / memory
    n = len(history)
    a = sum(acc * d ** (n - 1 - i) for i, (acc, _) in enumerate(history))
    e = sum(exp * d ** (n - 1 - i) for i, (_, exp) in enumerate(history))
    return (a + prior) / (e + prior)


def test_the_worked_example():
    ra = RequestAcceptance(prior=2.0, memory=16)
    for _ in range(4):
        ra.observe(["bad", "good"], [0, 2], expected=0.8)
    assert ra.factor("bad") == pytest.approx(0.41, abs=0.005)
    assert ra.factor("good") == pytest.approx(1.89, abs=0.005)
    assert ra.factor("new") == 1.0
    assert ra.weight(["bad", "good", "new"]) == pytest.approx(ra.factor("bad") + ra.factor("good") + 1.0)
    assert ra.weight(["bad", "good", "new"], [False, True, True]) == pytest.approx(ra.factor("good") + 1.0)
    assert ra.weight(["bad"], [False]) == 0.0  # nobody drafting: the chooser's off step
    ra.reset(["good"])  # a new request in the slot starts at the population's rate
    assert ra.factor("good") == 1.0
    assert ra.summary() == {"requests": 1, "mean_factor": pytest.approx(0.41, abs=0.005)}


def test_a_request_that_did_not_draft_is_left_alone():
    ra = RequestAcceptance()
    ra.observe([1, 2], [0, 0], expected=1.0, mask=[True, False])
    assert ra.factor(1) < 1.0 and ra.factor(2) == 1.0
    with pytest.raises(ValueError):
        RequestAcceptance(prior=0.0)
    with pytest.raises(ValueError):
        RequestAcceptance(memory=0)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), min_size=3, max_size=3),
            st.floats(0.0, 3.0),
            st.lists(st.booleans(), min_size=3, max_size=3),
        ),
        max_size=40,
    ),
    prior=st.floats(0.1, 8.0),
    memory=st.integers(1, 32),
    resets=st.sets(st.integers(0, 39)),
)
def test_factors_match_the_naive_oracle(steps, prior, memory, resets):
    """Random drafted steps over three request slots (some requests not drafting, some slots refilled): every factor
    and weight equals the oracle's over each request's own drafted steps since its slot's last prefill."""
    ra = RequestAcceptance(prior, memory)
    history: dict[int, list[tuple[int, float]]] = {k: [] for k in range(3)}
    for i, (accepted, expected, mask) in enumerate(steps):
        if i in resets:
            ra.reset([i % 3])
            history[i % 3] = []
        ra.observe([0, 1, 2], accepted, expected, mask)
        for k in range(3):
            if mask[k]:
                history[k].append((accepted[k], expected))
    want = {k: _naive_factor(h, prior, memory) for k, h in history.items()}
    for k in range(3):
        assert ra.factor(k) == pytest.approx(want[k], rel=1e-9)
    assert ra.weight([0, 1, 2], [True, False, True]) == pytest.approx(want[0] + want[2], rel=1e-9)


def _priced(bs: int = 2) -> TierChooser:
    chooser = TierChooser([OFF, ONE, DEEP], probe_every=0, unpriced_first=0)
    for _ in range(3):
        chooser.record_cost(OFF, bs, 0.031)
        chooser.record_cost(ONE, bs, 0.034)
        chooser.record_cost(DEEP, bs, 0.044)
    for tier, acc in ((DEEP, [1, 1]), (ONE, [0, 1])):  # unestimated tiers run first, the largest first
        assert chooser.choose(bs) == tier
        chooser.observe(acc)  # DEEP expects 2 tokens a request, ONE 1.5
    return chooser


def test_the_chooser_prices_the_drafting_requests_at_their_weights():
    """A batch of ``B`` at a tier of ``tau`` expected tokens returns ``B + (tau - 1) w`` tokens, ``w`` the drafting
    requests' summed factors, at most ``1 + steps`` a request: requests whose drafts fail turn the step off, requests
    whose drafts pass turn on a deep tier the population's rate would not."""
    chooser = _priced()
    assert chooser.expected_tokens(DEEP) == pytest.approx(2.0) and chooser.expected_tokens(ONE) == pytest.approx(1.5)
    assert chooser.rate(DEEP, 2, speculating=2.0) == pytest.approx(4.0 / 0.044)  # factors 1: the population's
    assert chooser.rate(DEEP, 2, speculating=0.5) == pytest.approx(2.5 / 0.044)
    assert chooser.rate(DEEP, 2, speculating=9.0) == pytest.approx(8.0 / 0.044)  # at most 1 + 3 tokens a request
    assert chooser.rate(OFF, 2, speculating=0.5) == pytest.approx(2.0 / 0.031)  # the off tier: one token each
    assert chooser.best(2) == DEEP
    assert chooser.best(2, speculating=0.2) == OFF  # both requests' drafts failing
    assert chooser.best(2, speculating=0.8) == ONE  # ONE: 2.4 / 0.034 = 70.6 > DEEP 2.8 / 0.044 = 63.6 > OFF 64.5
