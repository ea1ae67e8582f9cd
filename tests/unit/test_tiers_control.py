"""The acceptance-calibrated tier control (``docs/design/serving-control.md``), piece by piece, by hand.

* the level model's calibrated estimates (the draft's confidence as the prior, shrinkage per batch-size class and
  alpha bin) and its change detection (a window of recent requests replaces the long memory);
* speculation off under doubt, the batch priced with only some requests drafting, the per-request break-even;
* the admission price per token of each regime;
* the per-request gate: a request stopped on evidence, its probes on a bounded, backed-off budget.

The end-to-end behaviour (acceptance collapsing mid-run and recovering, through SGLang's adaptive controller) is
``tests/integration/sglang/test_tiers_control.py``.
"""

from __future__ import annotations

import random

import pytest

from sage_plugin.config import ConfigError, SageConfig
from sage_plugin.serving.admission import AdmissionPrice
from sage_plugin.serving.request_gate import RequestGate
from sage_plugin.serving.tier_levels import LevelModel
from sage_plugin.serving.tiers import TIER_CONTROLS, Tier, TierChooser

OFF, ONE, THREE = Tier(0, 1), Tier(1, 2), Tier(3, 4)


# -- the level model ------------------------------------------------------------------------------------------
def test_measured_levels_by_hand():
    """One step of a 3-step tier at batch 2 accepting 0 and 2 drafts (the module docstring's example)."""
    m = LevelModel()
    assert m.tokens(None, 3, None, None) is None and not m.has(None)
    m.count(None, 3, [0, 2], size=2, b=None)
    assert [m.level(None, j, None, None)[0] for j in (1, 2, 3)] == [0.5, 0.75, 0.25]
    assert m.tokens(None, 3, None, None) == pytest.approx(1 + 0.5 + 0.375 + 0.09375)


def test_calibrated_levels_shrink_toward_the_broader_estimate_from_the_drafts_confidence():
    m = LevelModel(prior_weight=4.0, alpha_bins=4)
    m.count(None, 3, [0, 2], size=2, b=3)
    h_all = (1 + 0.875) / 3  # the bin's centre, 0.875, as one pseudo-request
    h_size = (1 + 4 * h_all) / 6
    h_bin = (1 + 4 * h_size) / 6
    assert (h_all, h_size, h_bin) == pytest.approx((0.625, 0.5833, 0.5556), abs=1e-4)
    assert m.level(None, 1, 2, 3) == pytest.approx((h_bin, 6.0))
    assert m.level(None, 1, None, None)[0] == pytest.approx((1 + 0.5) / 3)  # no bin: the prior is 0.5
    # a size class and a bin never seen rest on the broader counts alone
    assert m.level(None, 1, 16, 0)[0] == pytest.approx((1 + 0.125) / 3)
    # many requests of one class make its estimate its own
    for _ in range(40):
        m.count(None, 3, [0] * 8, size=16, b=0)
    assert m.level(None, 1, 16, 0)[0] < 0.05 < m.level(None, 1, 2, 3)[0]


def test_a_collapse_of_acceptance_replaces_the_long_memory_within_a_step_of_a_large_batch():
    m = LevelModel(prior_weight=8.0, change_z=4.0, alpha_bins=4)
    rng = random.Random(0)
    for _ in range(200):  # steady: level 1 passes 70% of the time
        m.count(2, 1, [int(rng.random() < 0.7) for _ in range(16)], size=16, b=3)
    assert m.changes == 0  # steady traffic keeps its long memory
    assert m.tokens(2, 1, 16, 3) == pytest.approx(1.7, abs=0.03)
    m.count(2, 1, [0] * 15 + [1], size=16, b=3)  # one step of a collapsed draft
    assert m.changes == 1
    assert m.tokens(2, 1, 16, 3) < 1.2  # the window's 1 in 16, not 70% any more
    for _ in range(3):
        m.count(2, 1, [int(rng.random() < 0.7) for _ in range(16)], size=16, b=3)
    assert m.tokens(2, 1, 16, 3) > 1.5  # and back on recovery: the collapse left only 16 requests to outweigh


def test_one_request_at_a_time_a_collapse_is_seen_within_its_window():
    m = LevelModel(prior_weight=8.0, change_z=4.0, window=16)
    rng = random.Random(1)
    for _ in range(400):
        m.count(2, 1, [int(rng.random() < 0.7)], size=1, b=None)
    before = m.changes
    steps = next(i for i in range(1, 40) if (m.count(2, 1, [0], size=1, b=None), m.changes > before)[1])
    assert steps <= 16  # detected once the window of 16 requests is mostly the new regime


def test_change_detection_rarely_fires_on_steady_noise():
    for bs in (1, 4, 16):
        m = LevelModel(prior_weight=8.0, change_z=4.0)
        rng = random.Random(2)
        for _ in range(1000):
            m.count(4, 3, [min(3, int(rng.expovariate(1.0))) for _ in range(bs)], size=bs, b=None)
        assert m.changes <= 1, bs  # 1000 steps at a constant rate


def test_tier_controls_are_the_config_choices():
    assert set(TIER_CONTROLS) == {"calibrated", "measured"}
    assert SageConfig().serving.tier_control == "calibrated" and SageConfig().serving.tier_request_gate is False
    with pytest.raises(ConfigError, match="tier_control"):
        SageConfig(tier_control="adaptive")


# -- the choice -------------------------------------------------------------------------------------------------
def _priced(doubt: float = 0.0, admission: AdmissionPrice | None = None) -> TierChooser:
    """OFF at 100 ms and ONE at 130 ms a step (batch 4), ONE's acceptance from 4 requests of one step: 3 passed."""
    chooser = TierChooser(
        [OFF, ONE], probe_every=0, unpriced_first=0, acceptance="width", doubt=doubt, admission=admission
    )
    chooser.choose(4)
    chooser.record_cost(ONE, 4, 0.130)
    chooser.observe([1, 1, 1, 0])
    chooser.choose(4)
    chooser.record_cost(OFF, 4, 0.100)
    chooser.observe([0] * 4)
    return chooser


def test_speculation_off_is_the_default_under_doubt():
    chooser = _priced()
    h = (3 + 0.5) / (4 + 1)  # 0.7 from 4 requests
    assert chooser.expected_tokens(ONE) == pytest.approx(1 + h)
    assert chooser.rate(ONE, 4) == pytest.approx(4 * 1.7 / 0.13) and chooser.rate(OFF, 4) == pytest.approx(40.0)
    assert chooser.best(4) == ONE  # 52.3 tokens/s against 40 on the point estimates
    doubtful = _priced(doubt=2.0)
    low = 1 + h - 2 * (h * (1 - h) / 5) ** 0.5  # two standard errors low: 1.29
    assert doubtful.rate(ONE, 4, z=-2.0) == pytest.approx(4 * low / 0.13)  # 39.7
    assert doubtful.best(4) == OFF and doubtful.choose(4) == OFF  # 4 requests are too few to leave off
    assert doubtful.best(4, drafted=True) == ONE  # the best drafted tier, for the per-request gate


def test_a_batch_where_few_requests_speculate_is_priced_as_such():
    chooser = _priced()
    assert chooser.rate(ONE, 4, speculating=1) == pytest.approx((1.7 + 3) / 0.13)  # one at 1.7, three at 1
    assert chooser.rate(OFF, 4, speculating=1) == pytest.approx(40.0)  # the off tier: every request one token
    assert chooser.best(4, speculating=1) == OFF and chooser.best(4, speculating=4) == ONE
    assert chooser.choose(4, speculating=0) == OFF  # nobody speculates: off, no probe, nothing measured


def test_request_break_even_by_hand():
    """Batch 16, ``[1, 2]`` at 139.8 ms, off 95.7 ms, 1.46 tokens (the docstring's example): 0.46."""
    chooser = TierChooser([OFF, ONE], probe_every=0, unpriced_first=0, acceptance="per_tier")
    assert chooser.request_break_even(ONE, 16) == 0.0  # nothing measured
    chooser.choose(16)
    chooser.record_cost(ONE, 16, 0.1398)
    chooser.observe([1] * 46 + [0] * 54)  # 0.46 accepted drafts a request
    chooser.choose(16)
    chooser.record_cost(OFF, 16, 0.0957)
    chooser.observe([0] * 16)
    assert chooser.request_break_even(ONE, 16) == pytest.approx(1.46 * (0.1398 - 0.0957) / 0.1398)
    assert chooser.request_break_even(ONE, 16) == pytest.approx(0.46, abs=0.005)
    assert chooser.request_break_even(OFF, 16) == 0.0


# -- admissions ---------------------------------------------------------------------------------------------------
def _regime(price: AdmissionPrice, drafted: bool, windows: int, prefill_s: float, tokens: int) -> None:
    """``windows`` windows of 4 steps of one regime, each with one prefill pass of ``prefill_s`` and ``tokens``."""
    for _ in range(windows):
        price.prefill(prefill_s)
        for _ in range(4):
            price.step(drafted, tokens // 4)


def test_admission_price_by_hand_and_only_once_both_regimes_are_seen():
    """The module docstring's example: off 0.16 s of prefill per 1024 tokens, drafted 0.48 s per 1024."""
    price = AdmissionPrice(window=4, memory=16, min_windows=2)
    _regime(price, True, 3, 0.48, 1024)
    assert price.per_token(True) == 0.0  # the off regime not seen yet: nothing priced
    _regime(price, False, 1, 0.16, 1024)
    assert price.per_token(False) == 0.0
    _regime(price, False, 2, 0.16, 1024)
    assert price.per_token(True) == pytest.approx(0.48 / 1024) and price.per_token(False) == pytest.approx(0.16 / 1024)
    for _ in range(4):  # a mixed window counts for neither
        price.prefill(5.0)
        price.step(True, 100)
        price.step(False, 100)
    assert price.per_token(True) == pytest.approx(0.48 / 1024)
    assert price.summary()["admission_ms_per_token_off@0"] == pytest.approx(0.1562, abs=1e-4)  # one load: sizes unknown


def test_the_chooser_prices_admissions_per_token():
    price = AdmissionPrice(window=4, min_windows=1)
    _regime(price, True, 1, 0.48, 1024)
    _regime(price, False, 1, 0.16, 1024)
    chooser = _priced(admission=price)
    a1, a0 = 0.48 / 1024, 0.16 / 1024
    assert chooser.rate(ONE, 4) == pytest.approx(4 * 1.7 / (0.13 + 4 * 1.7 * a1))
    assert chooser.rate(OFF, 4) == pytest.approx(4 / (0.1 + 4 * a0))
    chooser.record_prefill(1.0)  # the chooser passes prefill passes to its price
    assert price._pending == pytest.approx(1.0)


def _serve(price: AdmissionPrice, sizes: list[int], drafted: bool, prefill_s: float = 0.0) -> None:
    """Decode steps at ``sizes`` (one token a request), a prefill pass of ``prefill_s`` before each size change."""
    for i, size in enumerate(sizes):
        if i and size != sizes[i - 1] and prefill_s:
            price.prefill(prefill_s)
        price.step(drafted, size, size)


def _charged(price: AdmissionPrice, drafted: bool) -> float:
    """The prefill seconds charged to a regime, every load together."""
    return sum(v[0] for (r, _), v in price._sums.items() if r == drafted)


def test_only_refills_are_charged_not_the_initial_fill():
    """Passes that grow the batch past its last refilled size (the initial fill) are the load's, not the regime's;
    a pass that refills finished requests' slots is charged, in the share of its admissions that refill."""
    price = AdmissionPrice(window=4, memory=10**9, min_windows=0)  # no decay in this example
    price.prefill(1.0)
    _serve(price, [4] * 4, False)
    price.prefill(1.0)
    _serve(price, [16] * 4, False)
    assert _charged(price, False) == 0.0  # 4 then 12 admitted, none refilling
    _serve(price, [12] * 3, True)  # 4 requests finished
    price.prefill(0.5)
    _serve(price, [16] * 5, True)
    assert _charged(price, True) == pytest.approx(0.5)  # 4 admitted after 4 finished: all of it
    _serve(price, [14] * 4, True)  # 2 finished
    price.prefill(0.8)
    _serve(price, [18] * 4, True)  # 4 admitted: 2 refill, 2 grow the batch
    assert _charged(price, True) == pytest.approx(0.5 + 0.4)
    price.prefill(2.0)  # a runtime that does not report batch sizes: charged whole
    price.step(True, 10)
    assert price._open[2] == pytest.approx(2.0)


def test_an_initial_fill_in_off_windows_does_not_price_the_off_regime_up():
    """A server's first batch sizes are new to the chooser, which measures the off tier there first, so the initial
    fill (16 prompts admitted 4 at a time) lands in off windows.  Both regimes then refill alike (4 finished, a 0.2 s
    pass, every 32 steps of 16 tokens): their prices must come out equal, where charging the fill would price off
    several times higher."""

    def run(sizes: bool) -> tuple[float, float]:
        price = AdmissionPrice()  # windows of 32 steps
        for n in (4, 8, 12, 16):  # the initial fill: a 1.5 s pass per 4 admitted, 8 off steps each
            price.prefill(1.5)
            for _ in range(8):
                price.step(False, n, n if sizes else None)
        for drafted in [False, True] * 4:
            for _ in range(3):  # steady state: 4 finish, a pass refills them, 32 steps a cycle
                for n in [16] * 28 + [12] * 4:
                    price.step(drafted, n, n if sizes else None)
                price.prefill(0.2)
            price.step(drafted, 16, 16 if sizes else None)
            for _ in range(31):  # the rest of the window, no admission
                price.step(drafted, 16, 16 if sizes else None)
        return price.per_token(False), price.per_token(True)

    off, drafted = run(sizes=True)
    assert off == pytest.approx(drafted, rel=0.05) and off > 0.0
    off_old, drafted_old = run(sizes=False)
    assert off_old > 2.0 * drafted_old  # the bias the refill share removes


# -- the per-request gate -------------------------------------------------------------------------------------------
def test_a_request_is_stopped_on_evidence_not_on_one_bad_step():
    """The module docstring's example: prior 1.2 accepted drafts, break-even 0.6, a 3-step tier."""
    gate = RequestGate(memory=16, prior_weight=4.0, z=1.0, probe_every=8, probe_backoff=8)
    terms = {"break_even": 0.6, "prior": 1.2, "depth": 3}
    keys = ["bad", "good"]
    assert gate.speculate(keys, **terms) == [True, True]  # new requests start at the population's mean
    for step in range(1, 17):
        gate.observe(keys, [0, 2], [True, True], **terms)
        if step == 8:
            assert gate.speculate(keys, **terms) == [True, True]  # 0.79 >= 0.6
    assert gate.speculate(keys, **terms) == [False, True]  # 0.59 < 0.6
    gate.reset(["bad"])  # a new request in that slot starts over
    assert gate.speculate(keys, **terms) == [True, True]


def test_a_stopped_request_probes_on_a_backed_off_budget():
    gate = RequestGate(memory=16, prior_weight=4.0, z=1.0, probe_every=4, probe_backoff=4)
    terms = {"break_even": 0.6, "prior": 1.2, "depth": 3}
    drafted = []
    for _ in range(200):
        mask = gate.speculate(["r"], **terms)
        gate.observe(["r"], [0], mask, **terms)  # its drafts always fail
        drafted.append(mask[0])
    stop = drafted.index(False)
    probes = [i for i in range(stop, 200) if drafted[i]]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[:3] == [9, 17, 17] and set(gaps[3:]) == {17}  # 4, 8, 16 steps idle (at most 4 x 4), then the probe
    assert gate.summary()["probes"] == len(probes) and gate.summary()["stopped_steps"] == 200 - stop - len(probes)
    # an off step drafts nothing: the request idles (its probe comes due) without being judged
    gate.observe(["r"], [0], None, **terms)
    assert gate.summary()["stopped_steps"] == 200 - stop - len(probes)


def test_a_probe_that_pays_brings_the_request_back():
    gate = RequestGate(memory=4, prior_weight=1.0, z=0.0, probe_every=2, probe_backoff=8)
    terms = {"break_even": 0.5, "prior": 1.0, "depth": 2}
    while gate.speculate(["r"], **terms) == [True]:
        gate.observe(["r"], [0], [True], **terms)  # its drafts fail until it is stopped
    gate.observe(["r"], [0], [False], **terms)
    gate.observe(["r"], [0], [False], **terms)
    assert gate.speculate(["r"], **terms) == [True]  # the probe is due
    gate.observe(["r"], [2], [True], **terms)  # and its drafts pass
    assert gate.speculate(["r"], **terms) == [True]


def test_admissions_are_priced_per_load():
    """A server that drafted at one client and went off at sixteen compares regimes at four clients with what each
    paid at four, not with its one-client and sixteen-client prices (measured, pooled over loads: drafted 1.45 ms a
    token, off 0.19)."""
    price = AdmissionPrice(window=4, memory=10**9, min_windows=1)  # no decay in this example
    _serve(price, [1] * 4, True)
    for _ in range(4):
        price.prefill(0.0058)  # one-client refills, drafted only: a pass per 4 tokens
        _serve(price, [1] * 4, True)
    for _ in range(4):  # sixteen clients, off only: 4 finish, a pass refills them
        _serve(price, [12] * 3, False)
        price.prefill(0.0122)
        _serve(price, [16], False)
    assert price.load(1) is None and price.per_token(True, 1) == 0.0 == price.per_token(False, 16)
    for drafted in (True, False, True, False):  # both regimes at four clients, 0.5 ms a token (13 tokens a window)
        _serve(price, [3] * 3, drafted)
        price.prefill(0.0065)
        _serve(price, [4], drafted)
    assert price.load(1) == 4 == price.load(4) and price.load(5) is None
    assert price.per_token(True, 1) == pytest.approx(0.0005) and price.per_token(False, 4) == pytest.approx(0.0005)
    summary = price.summary()
    assert summary["admission_ms_per_token_drafted@1"] == pytest.approx(1000 * 4 * 0.0058 / 20)
    # the first of the four passes grows the batch from one request: not charged
    assert summary["admission_ms_per_token_off@16"] == pytest.approx(1000 * 3 * 0.0122 / (4 * 52), abs=1e-4)


def test_a_load_one_regime_never_ran_at_is_not_priced_even_without_a_window_minimum():
    """``min_windows=0`` prices a load as soon as both regimes have a window there, and not before: a load only
    the drafted regime ran at prices no step (rather than reading the off regime's missing sums)."""
    price = AdmissionPrice(window=4, min_windows=0)
    _serve(price, [4] * 3, True)
    price.prefill(0.01)
    _serve(price, [4] * 5, True)
    assert price.load(4) is None and price.per_token(True, 4) == 0.0 == price.per_token(False, 4)
    _serve(price, [4] * 4, False)
    assert price.load(4) == 4 and price.per_token(False, 4) == 0.0 and price.per_token(True, 4) > 0.0
