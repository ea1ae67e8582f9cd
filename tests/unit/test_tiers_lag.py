"""The tier chooser with a lagging draft (``tier_off_lag``): the catch-up priced on a switch against the regime.

Off steps that skip the draft's extend leave it behind, and the next drafted step first catches it up.  The
chooser charges that catch-up to a step that switches against the batch size's regime (an off step on a low-alpha
dip while drafting pays; a drafted probe while the regime is off) and to nothing else
(``sage_plugin/serving/tiers.py``, "A lagging draft").  The controller's side (the catch-up timed apart from the
drafted step it preceded, shared across tensor-parallel ranks) is ``tests/integration/sglang/test_tiers_control.py``.
"""

from __future__ import annotations

import random

import pytest

from sage_plugin.serving.tiers import Tier, TierChooser

OFF, ONE = Tier(0, 1), Tier(1, 2)
#: seconds a step at batch 1 and 8: drafting pays at 1 (the regime), speculation off wins at 8
COSTS = {1: {OFF: 0.030, ONE: 0.050}, 8: {OFF: 0.060, ONE: 0.140}}
HIGH, LOW = 0.9, 0.1  # alphas of the two bins


def _chooser(probe_every: int = 0) -> TierChooser:
    """Off and one drafted tier, every tier and alpha bin taught: at batch 1 one accepted draft at high alpha and
    0.6 at low alpha (off wins that bin narrowly, 33.3 against 32.0 tokens/s), at batch 8 drafting loses."""
    ch = TierChooser((OFF, ONE), probe_every, smoothing=0.05, unpriced_first=0, alpha_bins=2, acceptance="per_tier")
    for bs in COSTS:
        for tier in (ONE, OFF):
            ch.record_cost(tier, bs, COSTS[bs][tier])
    ch.choose(1, HIGH)  # ONE, no estimate yet
    ch.observe([1])
    ch.choose(1, LOW)
    ch.observe([0, 1, 1, 1, 0])  # 0.6 in the low bin
    return ch


def test_the_taught_chooser_dips_off_at_low_alpha_without_a_lag():
    ch = _chooser()
    assert ch.regime(1) == ONE and ch.regime(8) == OFF
    assert ch.rate(OFF, 1, LOW) == pytest.approx(1 / 0.030) and ch.rate(ONE, 1, LOW) == pytest.approx(1.6 / 0.050)
    assert ch.best(1, LOW) == OFF and ch.best(1, HIGH) == ONE and ch.best(8, HIGH) == OFF


def test_switch_cost_charges_only_a_switch_against_the_regime():
    ch = _chooser()
    assert ch.switch_cost(OFF, 1, behind=False) == 0.0  # no catch-up measured yet: nothing to charge
    ch.record_catch_up(1, 0.012)
    ch.record_catch_up(8, 0.020)
    # batch 1, regime drafted: leaving it for an off step pays; returning to it, or staying, does not
    assert ch.switch_cost(OFF, 1, behind=False) == pytest.approx(0.012)
    assert ch.switch_cost(ONE, 1, behind=True) == 0.0
    assert ch.switch_cost(ONE, 1, behind=False) == 0.0 and ch.switch_cost(OFF, 1, behind=True) == 0.0
    # batch 8, regime off: a drafted step while behind pays; entering the off regime does not
    assert ch.switch_cost(ONE, 8, behind=True) == pytest.approx(0.020)
    assert ch.switch_cost(OFF, 8, behind=False) == 0.0
    assert ch.rate(OFF, 1, LOW, behind=False) == pytest.approx(1 / 0.042)
    assert ch.rate(OFF, 1, LOW, behind=None) == pytest.approx(1 / 0.030)  # no lag: no catch-up in any price
    assert ch.catch_up(1) == pytest.approx(0.012) and ch.catch_up(4) is None


def test_a_low_alpha_dip_that_cannot_pay_the_round_trip_stays_drafted():
    ch = _chooser()
    ch.record_catch_up(1, 0.012)
    assert ch.choose(1, LOW, behind=None) == OFF  # no lag: the dip is free, off wins the bin
    assert ch.choose(1, LOW, behind=False) == ONE  # 1 / 0.042 = 23.8 < 32.0
    assert ch.choose(1, HIGH, behind=False) == ONE
    ch.record_catch_up(1, 0.001)  # a catch-up that cheap: the dip pays again (low median of 0.012, 0.001)
    assert ch.catch_up(1) == pytest.approx(0.001)
    assert ch.choose(1, LOW, behind=False) == OFF


def test_behind_the_regime_decides_and_a_drafted_probe_pays_the_catch_up():
    ch = _chooser()
    ch.record_catch_up(8, 0.020)
    assert ch.choose(8, None, behind=True) == OFF
    assert ch.choose(1, None, behind=True) == ONE  # the batch shrank: back to drafting, the catch-up amortised
    assert ch.expected_tokens(ONE) == pytest.approx(1.98)  # 1, then 0.6 at smoothing 0.05
    assert ch.rate(ONE, 8, None, behind=True) == pytest.approx(8 * 1.98 / 0.160)


def _serve(priced: bool, steps: int = 4000, seed: int = 0) -> tuple[float, int]:
    """A batch-1 run whose alpha wanders between the bins, with a lagging draft: off steps leave it behind, and the
    drafted step after them runs a catch-up of 12 ms first.  Returns (tokens per second, catch-ups)."""
    ch = _chooser(probe_every=16)
    rng = random.Random(seed)
    behind, tokens, seconds, catch_ups = False, 0.0, 0.0, 0
    for _ in range(steps):
        low = rng.random() < 0.3
        alpha = None if behind else (LOW if low else HIGH)  # a lagging draft has no root distribution to read
        tier = ch.choose(1, alpha, behind=behind if priced else None)
        cost = COSTS[1][tier]
        if not tier.off and behind:
            ch.record_catch_up(1, 0.012)
            seconds += 0.012
            catch_ups += 1
        seconds += cost
        ch.record_cost(tier, 1, cost)
        accepted = 0 if tier.off else int(rng.random() < (0.6 if low else 1.0))
        ch.observe([accepted])
        tokens += 1 + accepted
        behind = tier.off
    return tokens / seconds, catch_ups


def test_pricing_the_catch_up_serves_faster_than_dipping_for_free():
    priced, unpriced = _serve(True), _serve(False)
    assert priced[1] < unpriced[1] / 10  # the dips stop
    assert priced[0] > unpriced[0] * 1.02  # 37.4 against 36.3 tokens/s
