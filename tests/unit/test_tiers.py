"""Serving tiers: the config field, SGLang's sizes for a tier list, and the host-side tier choice (serving/tiers.py).

The chooser is driven the way a runtime drives it (choose at step start, cost when timed, observe when the accept
counts reach the host) with a simulated device whose per-tier costs and acceptance are known, so the expected choice
can be computed by hand; the overlap scheduler's one-step feedback lag is simulated by observing late.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.config import ConfigError, SageConfig
from sage_plugin.runtimes.sglang.args import spec_sizes
from sage_plugin.serving.tiers import Tier, TierChooser, parse_tiers

OFF, SMALL, BIG = Tier(0, 1), Tier(2, 4), Tier(4, 8)


# -- config -----------------------------------------------------------------------------------------------
def test_config_tiers_round_trip_and_yaml_lists():
    cfg = SageConfig.from_mapping({"tiers": [[0, 1], [3, 5]]})
    assert cfg.serving.tiers == ((0, 1), (3, 5))
    assert cfg.to_dict()["tiers"] == [[0, 1], [3, 5]]
    assert SageConfig.from_mapping(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "tiers, needle",
    [
        ([[0, 2]], "[0, 1] for speculation off"),
        ([[1, 1]], "draft_tokens in [2, 1025]"),
        ([[65, 8]], "steps in [1, 64]"),
        ([[2, 4, 1]], "[steps, draft_tokens]"),
        ([[2, 4], [2, 4]], "distinct"),
        ([[1, 2]] * 17, "1-16"),
        ([[True, 2]], "[steps, draft_tokens]"),
        ("0:1", "list of [steps, draft_tokens] pairs"),
    ],
)
def test_config_rejects_bad_tiers(tiers, needle):
    with pytest.raises(ConfigError, match="tiers") as err:
        SageConfig.from_mapping({"tiers": tiers})
    assert needle in str(err.value)


def test_probe_interval_range():
    with pytest.raises(ConfigError, match="tier_probe_every"):
        SageConfig(tier_probe_every=-1)
    with pytest.raises(ConfigError, match=r"tier_probe_backoff.*\[1, 1024\]"):
        SageConfig(tier_probe_backoff=0)


# -- SGLang sizes ---------------------------------------------------------------------------------------------
def test_spec_sizes_take_the_largest_tier_and_bound_the_kv_reservation():
    cfg = SageConfig(k=4, w_max=4, tiers=((0, 1), (1, 2), (4, 8), (6, 11)))
    sizes = spec_sizes(cfg)
    assert (sizes.topk, sizes.num_steps, sizes.num_draft_tokens) == (4, 6, 11)
    assert sizes.tiers == parse_tiers(cfg.serving.tiers)
    # the deepest tier drafts 6 x 4 tokens into the KV pool: more than any tier verifies
    assert sizes.max_alloc_per_decode == 24


@pytest.mark.parametrize(
    "tiers, kwargs, needle",
    [
        (((1, 6),), {}, "scores only 4 in 1 steps"),  # topk 4: one step scores 4 candidates
        (((0, 1),), {}, "at least one tier must speculate"),
        (((2, 9), (3, 5)), {}, "must also verify the most tokens"),
        (((3, 5),), {"num_steps": 3}, "leave --speculative-num-steps"),
        (((3, 5),), {"num_draft_tokens": 5}, "leave --speculative-num-steps"),
    ],
)
def test_spec_sizes_refuse_tiers_sglang_cannot_run(tiers, kwargs, needle):
    with pytest.raises(ConfigError, match="--sage-tiers") as err:
        spec_sizes(SageConfig(k=4, w_max=4, tiers=tiers), **kwargs)
    assert needle in str(err.value)


# -- the chooser ------------------------------------------------------------------------------------------------
class SimDevice:
    """Per-tier step cost (seconds, linear in the batch) and accepted drafts per request (deterministic)."""

    def __init__(self, cost: dict[Tier, tuple[float, float]], accepted: dict[Tier, int]) -> None:
        self.cost, self.accepted = cost, accepted

    def step(self, tier: Tier, bs: int) -> tuple[float, list[int]]:
        base, per = self.cost[tier]
        return base + per * bs, [self.accepted.get(tier, 0)] * bs


def _run(chooser: TierChooser, dev: SimDevice, bs: int, steps: int, lag: int = 0) -> list[Tier]:
    """Drive ``steps`` decode steps; accept counts reach the chooser ``lag`` steps late."""
    chosen, backlog = [], []
    for _ in range(steps):
        tier = chooser.choose(bs)
        seconds, acc = dev.step(tier, bs)
        chooser.record_cost(tier, bs, seconds)
        backlog.append(acc)
        if len(backlog) > lag:
            chooser.observe(backlog.pop(0))
        chosen.append(tier)
    return chosen


def test_each_tier_is_measured_first_then_the_best_rate_wins():
    dev = SimDevice({OFF: (0.060, 0.0), SMALL: (0.080, 0.0), BIG: (0.100, 0.0)}, {SMALL: 1, BIG: 2})
    chooser = TierChooser([OFF, SMALL, BIG], probe_every=0)
    chosen = _run(chooser, dev, bs=1, steps=20)
    # start-up: acceptance first (largest first), then each tier's cost, cheapest first; a tier's first step ever
    # is its warm-up (not priced), so it runs twice
    assert chosen[:6] == [BIG, SMALL, OFF, OFF, SMALL, BIG]
    # rates: off 1/0.06 = 16.7, small 2/0.08 = 25, big 3/0.10 = 30 tokens/s
    assert set(chosen[6:]) == {BIG}
    assert chooser.rate(BIG, 1) == pytest.approx(30.0)


def test_speculation_off_wins_when_the_draft_is_useless():
    dev = SimDevice({OFF: (0.060, 0.0), SMALL: (0.080, 0.0), BIG: (0.100, 0.0)}, {SMALL: 0, BIG: 0})
    chooser = TierChooser([OFF, SMALL, BIG], probe_every=0)
    assert set(_run(chooser, dev, bs=1, steps=30)[6:]) == {OFF}


def test_the_choice_depends_on_the_batch_size():
    # a wide verify is cheap at batch 1 and expensive at batch 8 (compute-bound)
    dev = SimDevice({OFF: (0.050, 0.010), BIG: (0.060, 0.040)}, {BIG: 1})
    chooser = TierChooser([OFF, BIG], probe_every=0)
    _run(chooser, dev, bs=1, steps=10)
    _run(chooser, dev, bs=8, steps=10)
    assert chooser.best(1) == BIG  # 2 / 0.10 = 20  > 1 / 0.06 = 16.7
    assert chooser.best(8) == OFF  # 16 / 0.38 = 42 < 8 / 0.13 = 61.5


def test_overhead_counts_once_per_step_for_every_tier():
    # without overhead: off 1/0.05 = 20 > small 1.5/0.08 = 18.75; with 40 ms per step: 11.1 < 12.5
    chooser = TierChooser([OFF, SMALL], probe_every=0, unpriced_first=0)
    chooser.record_cost(OFF, 1, 0.05)
    chooser.record_cost(SMALL, 1, 0.08)
    chooser.choose(1)
    chooser.observe([0, 1])  # SMALL was measured first: mean 0.5 accepted
    assert chooser.best(1) == OFF
    chooser.record_overhead(0.04)
    assert chooser.best(1) == SMALL


def test_probing_follows_a_change_in_acceptance():
    dev = SimDevice({OFF: (0.060, 0.0), BIG: (0.100, 0.0)}, {BIG: 2})
    chooser = TierChooser([OFF, BIG], probe_every=4, smoothing=0.5)
    assert _run(chooser, dev, bs=1, steps=12)[-8:].count(BIG) >= 6
    dev.accepted[BIG] = 0  # the traffic turns unpredictable
    chosen = _run(chooser, dev, bs=1, steps=40)
    assert chosen[-8:].count(OFF) >= 6  # off, apart from the periodic probe of BIG
    dev.accepted[BIG] = 3
    chosen = _run(chooser, dev, bs=1, steps=40)
    assert chosen[-8:].count(BIG) >= 6


def _naive_probe_steps(steps: int, every: int, backoff: int, first: int) -> list[int]:
    """Oracle: the steps at which a tier that loses every probe is re-measured, from its last run at ``first``
    (one other tier, so it is always the stalest; feedback without lag)."""
    out, last, gap = [], first, every
    for step in range(first + 1, first + steps + 1):
        if step - last >= gap:
            out.append(step)
            last, gap = step, min(2 * gap, backoff * every)
    return out


@pytest.mark.parametrize("backoff", [1, 2, 8])
def test_a_tier_that_loses_its_probes_is_probed_ever_less_often(backoff):
    """BIG never pays (0 accepted at 100 ms against off's 60): its probe gap doubles per lost probe, up to
    ``backoff * probe_every``; backoff 1 keeps the fixed gap."""
    dev = SimDevice({OFF: (0.060, 0.0), BIG: (0.100, 0.0)}, {BIG: 0})
    chooser = TierChooser([OFF, BIG], probe_every=4, probe_backoff=backoff)
    chosen = _run(chooser, dev, bs=1, steps=300)
    assert chosen[:4] == [BIG, OFF, OFF, BIG]  # start-up: warm-up and measured step of each
    probes = [i + 1 for i, t in enumerate(chosen) if t == BIG][2:]  # step numbers of BIG's later runs
    assert probes == _naive_probe_steps(296, 4, backoff, first=4)
    assert chooser.probe_gap(BIG) == 4 * backoff


def test_a_backed_off_tier_is_found_again_within_the_longest_gap():
    dev = SimDevice({OFF: (0.060, 0.0), BIG: (0.100, 0.0)}, {BIG: 0})
    chooser = TierChooser([OFF, BIG], probe_every=4, probe_backoff=8, smoothing=0.5)
    _run(chooser, dev, bs=1, steps=200)
    assert chooser.probe_gap(BIG) == 32
    dev.accepted[BIG] = 3  # the traffic turns predictable: BIG now rates 4 / 0.1 = 40 > 16.7
    chosen = _run(chooser, dev, bs=1, steps=32 + 8)
    first = chosen.index(BIG)
    assert first < 32
    assert chosen[first + 1 :].count(OFF) <= 2  # from now on OFF is the loser probed at 4, then 8 steps
    assert chooser.probe_gap(BIG) == 4  # a winner is back to the short gap


def test_a_probe_is_judged_only_once_its_feedback_is_in():
    """Under a feedback lag the gap doubles when the probe's accept counts arrive, not before."""
    chooser = TierChooser([OFF, BIG], probe_every=2, probe_backoff=8, unpriced_first=0)
    for tier, secs in ((OFF, 0.06), (BIG, 0.1)):
        chooser.record_cost(tier, 1, secs)
    assert chooser.choose(1) == BIG  # measured cost, acceptance unknown: start-up run
    chooser.observe([0])
    assert [chooser.choose(1) for _ in range(2)] == [OFF, BIG]  # BIG due after 2 steps: probed, feedback pending
    assert chooser.probe_gap(BIG) == 2
    assert chooser.choose(1) == OFF  # still pending: no verdict, no second probe
    assert chooser.probe_gap(BIG) == 2
    chooser.observe([0])  # the OFF step's feedback
    chooser.observe([0])  # the probe's
    assert chooser.choose(1) == OFF and chooser.probe_gap(BIG) == 4


def _alpha_run(alpha_bins: int, steps: int = 400) -> tuple[dict[bool, list[Tier]], float]:
    """Batch 1, half the steps confident (alpha 0.9: BIG accepts 3 drafts), half not (alpha 0.1: none).
    Returns the tiers chosen after 100 steps, by confidence, and the tokens per second of the whole run."""
    chooser = TierChooser([OFF, BIG], probe_every=4, alpha_bins=alpha_bins)
    rng = random.Random(0)
    chosen: dict[bool, list[Tier]] = {True: [], False: []}
    tokens = seconds = 0.0
    for step in range(steps):
        confident = rng.random() < 0.5
        tier = chooser.choose(1, 0.9 if confident else 0.1)
        secs, accepted = (0.06, 0) if tier.off else (0.1, 3 if confident else 0)
        chooser.record_cost(tier, 1, secs)
        chooser.observe([accepted])
        tokens, seconds = tokens + 1 + accepted, seconds + secs
        if step >= 100:
            chosen[confident].append(tier)
    return chosen, tokens / seconds


def test_alpha_bins_speculate_when_the_draft_is_confident():
    """Per alpha bin, BIG rates 4 / 0.1 = 40 tok/s (confident) or 1 / 0.1 = 10 (not) against off's 16.7: the chooser
    follows the draft's confidence step by step; one average per tier (about 1.5 accepted) cannot tell the steps
    apart."""
    by_alpha, rate = _alpha_run(alpha_bins=4)
    assert by_alpha[True].count(BIG) >= 0.9 * len(by_alpha[True])
    assert by_alpha[False].count(OFF) >= 0.9 * len(by_alpha[False])
    flat, flat_rate = _alpha_run(alpha_bins=0)
    share = {c: flat[c].count(BIG) / len(flat[c]) for c in (True, False)}
    assert abs(share[True] - share[False]) < 0.2
    assert rate > 1.2 * flat_rate  # 29.6 against 23.2 tok/s here


def test_alpha_feedback_is_credited_to_the_bin_its_step_ran_in():
    chooser = TierChooser([OFF, BIG], probe_every=0, alpha_bins=2, unpriced_first=0)
    chooser.record_cost(BIG, 1, 0.1)
    chooser.record_cost(OFF, 1, 0.06)
    assert chooser.choose(1, 0.9) == BIG and chooser.choose(1, 0.1) == BIG  # unmeasured: run until observed
    chooser.observe([3])  # the first step's (alpha 0.9), arriving late
    chooser.observe([1])
    assert chooser.expected_tokens(BIG, 0.95) == 4.0 and chooser.expected_tokens(BIG, 0.2) == 2.0
    assert chooser.expected_tokens(BIG) == pytest.approx(1 + 3 + 0.2 * (1 - 3))  # the overall average
    assert chooser.expected_tokens(BIG, None) == chooser.expected_tokens(BIG, float("nan"))
    assert chooser.summary()["4:8"]["tokens@a0"] == 2.0 and chooser.summary()["4:8"]["tokens@a1"] == 4.0


def test_host_scalar_on_cpu_is_read_at_once():
    from sage_plugin.serving.clock import HostScalar

    h = HostScalar("cpu")
    assert h.latest() is None
    h.push(torch.tensor(0.25))
    assert h.latest() == 0.25


@settings(max_examples=40, deadline=None)
@given(lag=st.integers(0, 3), seed=st.integers(0, 10_000))
def test_lagged_feedback_credits_each_step_to_its_own_tier(lag, seed):
    """Observations arrive ``lag`` steps late (overlap scheduling): the estimates equal the no-lag run's."""
    rng = random.Random(seed)
    acc = {SMALL: rng.randint(0, 1), BIG: rng.randint(0, 4)}
    cost = {OFF: (0.05, 0.0), SMALL: (rng.uniform(0.05, 0.1), 0.0), BIG: (rng.uniform(0.06, 0.2), 0.0)}
    runs = []
    for lg in (0, lag):
        chooser = TierChooser([OFF, SMALL, BIG], probe_every=5)
        _run(chooser, SimDevice(cost, acc), bs=2, steps=40, lag=lg)
        runs.append({t: chooser.expected_tokens(t) for t in chooser.tiers})
    assert runs[0] == runs[1]
    assert runs[0][BIG] == pytest.approx(1 + acc[BIG])
    assert runs[0][OFF] == 1.0


def test_feedback_without_a_pending_step_is_ignored():
    chooser = TierChooser([OFF, BIG])
    assert chooser.observe([3, 3]) is None
    assert chooser.expected_tokens(BIG) is None


def test_summary_reports_steps_tokens_and_costs():
    chooser = TierChooser([OFF, BIG], probe_every=0)
    _run(chooser, SimDevice({OFF: (0.05, 0.0), BIG: (0.1, 0.0)}, {BIG: 1}), bs=1, steps=4)
    summary = chooser.summary()
    big = 4 - summary["0:1"]["steps"]
    assert summary["4:8"] == {"tokens": 2.0, "steps": big, "mean_tokens": 2.0, "ms@1": 100.0, "steps@1": big,
                              "expected@1": 2.0, "served@1": 2.0}  # fmt: skip
    assert summary["0:1"]["tokens"] == 1.0 and summary["0:1"]["mean_tokens"] == 1.0
    _run(chooser, SimDevice({OFF: (0.05, 0.0), BIG: (0.1, 0.0)}, {BIG: 1}), bs=3, steps=5)
    summary = chooser.summary()
    assert sum(summary[t].get("steps@3", 0) for t in ("0:1", "4:8")) == 5
    assert summary["4:8"]["steps"] == summary["4:8"]["steps@1"] + summary["4:8"].get("steps@3", 0)


def test_mean_tokens_is_the_lifetime_mean_per_request_not_the_estimate():
    """``tokens`` is the chooser's smoothed estimate (it follows the latest steps); ``mean_tokens`` weighs every
    request of every credited step alike."""
    chooser = TierChooser([OFF, BIG], probe_every=0, alpha_bins=0)
    assert chooser.summary()["4:8"]["mean_tokens"] is None
    feedback = [[3, 3, 3, 3], [3, 3], [0], [0]]
    for acc in feedback:
        chooser._pending.append((0, BIG, None, None, None))
        chooser.observe(acc)
    naive = sum(1 + a for acc in feedback for a in acc) / sum(len(acc) for acc in feedback)
    summary = chooser.summary()["4:8"]
    assert summary["mean_tokens"] == pytest.approx(naive, abs=1e-3)  # 3.25
    assert summary["tokens"] == pytest.approx(1 + 3 * 0.8**2, abs=1e-3)  # moved towards the last steps' 1 token


def test_summary_sets_the_tokens_expected_at_each_choice_beside_the_tokens_served():
    """Per drafted tier and size class, ``expected@B`` is the mean over requests of the chooser's expected tokens when
    it chose their step (alpha and batch size of that step), ``served@B`` the mean tokens those requests got; a step
    chosen before its tier had any estimate counts in neither."""
    chooser = TierChooser([OFF, SMALL, BIG], probe_every=4, alpha_bins=4, acceptance="width",
                          prior_weight=8.0, change_z=4.0, doubt=1.0)  # fmt: skip
    rng = random.Random(3)
    sums: dict[tuple[Tier, int], list[float]] = {}
    for _ in range(300):
        bs, alpha = rng.choice([1, 3, 8]), rng.random()
        tier = chooser.choose(bs, alpha)
        want = chooser.expected_tokens(tier, alpha, batch_size=bs)  # choose() leaves the estimates as they are
        chooser.record_cost(tier, bs, 0.05 + 0.01 * tier.steps * bs)
        acc = [sum(rng.random() < alpha for _ in range(tier.steps)) for _ in range(bs)]
        chooser.observe(acc)
        if not tier.off and want is not None:  # a tier chosen to be measured before any estimate: no pair
            s = sums.setdefault((tier, bs), [0.0, 0.0, 0])
            s[0], s[1], s[2] = s[0] + want * bs, s[1] + sum(acc) + bs, s[2] + bs
    summary = chooser.summary()
    assert len(sums) >= 4  # both drafted tiers at more than one batch size
    for (tier, bs), (expected, served, n) in sums.items():
        row = summary[f"{tier.steps}:{tier.draft_tokens}"]
        assert row[f"expected@{bs}"] == pytest.approx(expected / n, abs=1e-3)
        assert row[f"served@{bs}"] == pytest.approx(served / n, abs=1e-3)
    assert not any(key.startswith(("expected@", "served@")) for key in summary["0:1"])


def test_a_cold_first_step_does_not_price_a_tier_out():
    """A tier's first step ever is its warm-up (allocations, first-shape kernels: 3.4 s against 139 ms warm for
    SGLang's first [6, 11] step here): not priced, at any batch size; later slow steps fall to the low median."""
    chooser = TierChooser([OFF, BIG], probe_every=0)
    chooser.record_cost(BIG, 2, 3.4)  # cold
    assert chooser.cost(BIG, 2) is None
    chooser.record_cost(BIG, 1, 0.14)  # the next step, at another batch size, is priced
    assert chooser.cost(BIG, 1) == 0.14
    chooser.record_cost(BIG, 2, 1.5)  # a slow step now and then
    assert chooser.cost(BIG, 2) == 1.5
    chooser.record_cost(BIG, 2, 0.1)
    assert chooser.cost(BIG, 2) == 0.1
    for s in (0.12, 0.09, 0.11, 0.1):
        chooser.record_cost(BIG, 2, s)
    assert chooser.cost(BIG, 2) == 0.1
    for _ in range(9):  # the window moves on: a slower regime replaces the old samples
        chooser.record_cost(BIG, 2, 0.2)
    assert chooser.cost(BIG, 2) == 0.2
    two = TierChooser([OFF, BIG], unpriced_first=2)
    for secs in (3.4, 0.5, 0.14):
        two.record_cost(BIG, 1, secs)
    assert two.cost(BIG, 1) == 0.14


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 3, 5, 8, 13, 16]), st.floats(0.01, 1.0)), min_size=1, max_size=40),
       st.sampled_from([(), (4, 16)]))  # fmt: skip
def test_a_measured_cost_is_held_to_the_larger_sizes_measured(samples, classes):
    """A step of fewer requests never costs more: a size class's cost is its low median of the last ``cost_window``
    timings, or a larger class's if that is lower (naive oracle: every class at or above the size, its own list)."""
    chooser = TierChooser([OFF, BIG], unpriced_first=0, cost_window=5)
    chooser.set_size_classes(classes)
    kept: dict[int, list[float]] = {}
    for bs, secs in samples:
        chooser.record_cost(BIG, bs, secs)
        kept.setdefault(chooser.size_class(bs), []).append(secs)

    def oracle(bs: int) -> float | None:
        own = chooser.size_class(bs)
        if own not in kept:
            return None
        return min(sorted(v[-5:])[(len(v[-5:]) - 1) // 2] for c, v in kept.items() if c >= own)

    for bs in range(1, 18):
        assert chooser.cost(BIG, bs) == oracle(bs)
    assert chooser.cost(OFF, 1) is None


def test_a_slow_spell_at_a_smaller_size_is_priced_at_the_larger_cost():
    """Measured on a 2-core CPU: the off tier timed 46 ms at 16 requests and 52 ms at 13 (a slow spell); 13 is priced
    46 ms, and a tier only measured at the smaller size keeps its own cost."""
    chooser = TierChooser([OFF, BIG], unpriced_first=0)
    for _ in range(3):
        chooser.record_cost(OFF, 16, 0.046)
        chooser.record_cost(OFF, 13, 0.052)
        chooser.record_cost(BIG, 13, 0.065)
    assert chooser.cost(OFF, 13) == 0.046 and chooser.cost(OFF, 16) == 0.046
    assert chooser.cost(BIG, 13) == 0.065 and chooser.cost(BIG, 16) is None


# -- the start-up measurement at a new batch size is skipped for a tier that cannot win there ----------------------
def _true_rate(dev: SimDevice, tier: Tier, bs: int) -> float:
    """The oracle: tokens per second of one step of ``tier`` at ``bs`` on ``dev`` (real requests over its seconds)."""
    seconds, acc = dev.step(tier, bs)
    return sum(1 + a for a in acc) / seconds


def _ramp(chooser: TierChooser, dev: SimDevice, sizes: list[int], steps: int = 12) -> tuple[float, dict[int, list]]:
    """Serve ``steps`` steps at each batch size in turn; the device seconds spent and the tiers run per size."""
    seconds, chosen = 0.0, {}
    for bs in sizes:
        before = len(chosen)
        chosen[bs] = _run(chooser, dev, bs=bs, steps=steps)
        assert len(chosen) == before + 1
        seconds += sum(dev.step(t, bs)[0] for t in chosen[bs])
    return seconds, chosen


def _bounded_and_unbounded(dev: SimDevice, sizes: list[int]) -> tuple[tuple, tuple]:
    """The same sizes served by a chooser of OFF and BIG with the cost bound (slack 0.1) and without it (slack 1: every
    tier measured at every size): ``(seconds, tiers run per size, chooser)`` of each."""
    runs = []
    for slack in (0.1, 1.0):
        chooser = TierChooser([OFF, BIG], probe_every=0, bound_slack=slack)
        runs.append((*_ramp(chooser, dev, sizes), chooser))
    return runs[0], runs[1]


def test_a_deep_tier_that_cannot_pay_at_larger_batches_is_not_measured_at_each_one():
    """BIG pays at batch 1 (3 tokens in 100 ms against 1 in 60) and falls behind as the batch grows (its cost grows
    four times as fast): once it loses by more than the bound's slack, the sizes above are not paid for at its price."""
    dev = SimDevice({OFF: (0.050, 0.005), BIG: (0.080, 0.030)}, {BIG: 2})
    sizes = list(range(1, 13))
    (t_bound, chosen, bounded), (t_all, chosen_all, measured_all) = _bounded_and_unbounded(dev, sizes)
    big_sizes = [bs for bs in sizes if BIG in chosen[bs]]
    assert [bs for bs in sizes if BIG in chosen_all[bs]] == sizes  # slack 1: measured at every size
    # rates: BIG 3 bs / (0.08 + 0.03 bs), OFF bs / (0.05 + 0.005 bs): BIG wins up to batch 4 (60 vs 57 tok/s)
    assert [bs for bs in sizes if measured_all.best(bs) == BIG] == [1, 2, 3, 4]
    # measured where it wins, then while the bound (90% of its cost ratio to OFF at the last size) could still win
    assert big_sizes == [1, 2, 3, 4, 5, 6, 7]
    for bs in sizes:  # the same choice wherever both know the rates, and no size loses its best tier
        assert bounded.best(bs) == measured_all.best(bs)
    assert t_bound < t_all


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 100_000), slack=st.sampled_from([0.0, 0.1, 0.5]), ramp=st.booleans())
def test_skipping_never_hides_the_best_tier_of_a_batch_size(seed, slack, ramp):
    """On a device where both bounds' premises hold (each tier's cost grows with the batch, relatively no slower than
    the smallest tier's, and a request never costs less in a smaller batch), the chooser's choice at every batch size
    is the true best tier (oracle: the device's own rates), whichever tiers it skipped measuring, whether the sizes
    come as a ramp or in any order (a drain, arrivals and finishes mixed)."""
    rng = random.Random(seed)
    tiers = [OFF, SMALL, BIG]
    base = {t: rng.uniform(0.02, 0.2) for t in tiers}
    growth = sorted(rng.uniform(0.0, 0.3) for _ in tiers)  # per request, relative to the tier's base cost
    dev = SimDevice({t: (base[t], g * base[t]) for t, g in zip(tiers, growth)},
                    {SMALL: rng.randint(0, 2), BIG: rng.randint(0, 4)})  # fmt: skip
    sizes = rng.sample(range(1, 17), rng.randint(2, 8))
    sizes = sorted(sizes) if ramp else sizes
    chooser = TierChooser(tiers, probe_every=0, bound_slack=slack)
    _ramp(chooser, dev, sizes, steps=10)
    for bs in sizes:
        assert chooser.best(bs) == max(tiers, key=lambda t: _true_rate(dev, t, bs)), bs


def test_a_draining_batch_does_not_measure_a_deep_tier_again_at_each_size():
    """Closed-loop clients start a full batch that then drains as requests finish: BIG, measured at batch 16 where it
    loses (2 tokens in 244 ms against 1 in 51), is not paid for again at 15, 14 and 13: its cost per request at 16
    bounds its cost there from below."""
    dev = SimDevice({OFF: (0.030, 0.0013), BIG: (0.020, 0.014)}, {BIG: 1})
    sizes = [16, 15, 14, 13]
    (t_bound, chosen, bounded), (t_all, chosen_all, measured_all) = _bounded_and_unbounded(dev, sizes)
    assert [bs for bs in sizes if BIG in chosen_all[bs]] == sizes  # slack 1: measured at every size
    assert [bs for bs in sizes if BIG in chosen[bs]] == [16]
    for bs in sizes:
        assert bounded.best(bs) == measured_all.best(bs) == OFF
    assert t_bound < t_all


class PaddedDevice(SimDevice):
    """A graph-replaying device: a batch runs padded to its next captured size (eager, at its own size, above the
    largest), so a step costs what the padded batch costs."""

    def __init__(self, cost, accepted, captured: list[int]) -> None:
        super().__init__(cost, accepted)
        self.captured = captured

    def step(self, tier: Tier, bs: int) -> tuple[float, list[int]]:
        padded = min([c for c in self.captured if c >= bs], default=bs)
        seconds, _ = super().step(tier, padded)
        return seconds, [self.accepted.get(tier, 0)] * bs


def test_size_classes_are_the_next_captured_size_or_the_batch_itself():
    chooser = TierChooser([OFF, BIG])
    assert [chooser.size_class(b) for b in (1, 3, 16, 40)] == [1, 3, 16, 40]  # no captured sizes: each its own
    chooser.set_size_classes([8, 1, 2, 4, 16, 4])
    assert [chooser.size_class(b) for b in (1, 2, 3, 5, 8, 9, 16, 17, 40)] == [1, 2, 4, 8, 8, 16, 16, 17, 40]
    chooser.set_size_classes(None)
    assert chooser.size_class(3) == 3


def test_batch_sizes_padded_to_one_graph_share_its_measured_cost():
    """With captured sizes every batch of a class is priced by the class's steps: measured once per class (not once
    per batch size), the rate still counting the batch's real requests."""
    captured = [1, 2, 4, 8, 16]
    dev = PaddedDevice({OFF: (0.050, 0.005), BIG: (0.080, 0.012)}, {BIG: 1}, captured)
    sizes = list(range(1, 17))
    runs = {}
    for classes in (None, captured):
        chooser = TierChooser([OFF, BIG], probe_every=0, bound_slack=1.0)  # slack 1: every tier at every new class
        chooser.set_size_classes(classes)
        runs[classes is None] = (chooser, _ramp(chooser, dev, sizes, steps=6))
    bucketed, (t_bucketed, _) = runs[False]
    exact, (t_exact, _) = runs[True]
    assert {bs for (_, bs) in bucketed._cost} == set(captured)
    assert {bs for (_, bs) in exact._cost} == set(sizes)
    assert bucketed.cost(BIG, 13) == bucketed.cost(BIG, 16) == pytest.approx(0.080 + 0.012 * 16)
    assert bucketed.rate(BIG, 13) == pytest.approx(13 * 2 / (0.080 + 0.012 * 16))
    for bs in sizes:  # the same choice at every size, from a fraction of the measuring steps
        assert bucketed.best(bs) == exact.best(bs)
    assert t_bucketed < t_exact


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 100_000), slack=st.sampled_from([0.0, 0.1, 1.0]))
def test_with_captured_sizes_the_choice_is_the_padded_devices_best(seed, slack):
    """Oracle: on a device that pads to its captured sizes, the chooser told those sizes picks, at every batch size of
    a random ramp, the tier with the highest true rate (real requests' tokens over the padded step's seconds)."""
    rng = random.Random(seed)
    tiers = [OFF, SMALL, BIG]
    captured = sorted(rng.sample([1, 2, 3, 4, 6, 8, 12, 16, 24, 32], rng.randint(1, 6)))
    base = {t: rng.uniform(0.02, 0.2) for t in tiers}
    growth = sorted(rng.uniform(0.0, 0.3) for _ in tiers)
    dev = PaddedDevice({t: (base[t], g * base[t]) for t, g in zip(tiers, growth)},
                       {SMALL: rng.randint(0, 2), BIG: rng.randint(0, 4)}, captured)  # fmt: skip
    sizes = sorted(rng.sample(range(1, 33), rng.randint(2, 8)))
    chooser = TierChooser(tiers, probe_every=0, bound_slack=slack)  # with slack < 1 some classes skip some tiers
    chooser.set_size_classes(captured)
    _ramp(chooser, dev, sizes, steps=10)
    for bs in sizes:
        assert chooser.best(bs) == max(tiers, key=lambda t: (_true_rate(dev, t, bs), -t.steps)), bs


class _FakeEvent:
    """A CUDA event stand-in: completes when the test says so; times are set by the test (ms)."""

    clock = 0.0
    waits = 0

    def __init__(self, enable_timing: bool = False) -> None:
        self.done, self.t = False, None

    def record(self) -> None:
        self.t = _FakeEvent.clock

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: "_FakeEvent") -> float:
        return end.t - self.t

    def synchronize(self) -> None:
        _FakeEvent.waits += 1
        self.done = True


def test_step_clock_on_cuda_reports_steps_in_launch_order_once_their_events_completed(monkeypatch):
    """The CUDA path never waits: a step's time comes back once its end event completed, and never ahead of an
    earlier step's."""
    from sage_plugin.serving.clock import StepClock

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    clock = StepClock("cuda")
    events = []
    for i in range(3):
        _FakeEvent.clock = 100.0 * i
        start = clock.start()
        _FakeEvent.clock = 100.0 * i + 10 * (i + 1)
        assert clock.stop(start, f"s{i}") == []  # nothing has completed yet
        events.append(clock._open._open[-1][1])
    events[1].done = True  # the second step's end completed before the first's: held back
    _FakeEvent.clock = 1000.0
    assert clock.stop(clock.start(), "s3") == []
    events[0].done = True
    assert clock.stop(clock.start(), "s4") == [("s0", 0.01), ("s1", 0.02)]


def _fake_cuda_host_scalar(monkeypatch, fixed_lag):
    from sage_plugin.serving.clock import HostScalar

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(HostScalar, "_pinned", staticmethod(lambda: torch.zeros(())))
    _FakeEvent.waits = 0
    return HostScalar("cuda", fixed_lag=fixed_lag)


def test_host_scalar_on_cuda_reads_the_newest_completed_copy_without_waiting(monkeypatch):
    h = _fake_cuda_host_scalar(monkeypatch, None)
    h.push(torch.tensor(1.0))
    h.push(torch.tensor(2.0))
    assert h.latest() is None  # nothing completed: no wait, no value yet
    h._open._open[1][1].done = True  # the newer completed first: held back behind the older
    assert h.latest() is None
    h._open._open[0][1].done = True
    assert h.latest() == 2.0 and _FakeEvent.waits == 0


@pytest.mark.parametrize("lag", [1, 2, 3])
def test_host_scalar_at_a_fixed_lag_reads_the_value_pushed_lag_pushes_ago(monkeypatch, lag):
    """Tensor parallelism on CUDA: every rank reads the same value at the same step, whatever its events did."""
    h = _fake_cuda_host_scalar(monkeypatch, lag)
    seen = []
    for k in range(10):
        h.push(torch.tensor(float(k)))
        if k % 3 == 0 and h._lagged:
            h._lagged[0][1].done = True  # some copies done by themselves, the others waited for
        seen.append(h.latest())
    assert seen == [None] * lag + [float(k - lag) for k in range(lag, 10)]
    assert 0 < _FakeEvent.waits < 10 - lag


def test_host_scalar_lag_range():
    from sage_plugin.serving.clock import HostScalar

    with pytest.raises(ValueError, match="fixed_lag"):
        HostScalar("cpu", fixed_lag=4)


def test_row_threshold_is_the_break_even_acceptance_of_one_more_verified_node():
    chooser = TierChooser([OFF, SMALL], probe_every=0, unpriced_first=0)
    assert chooser.row_threshold(SMALL, 16) == 0.0  # nothing measured: verify every node
    chooser.record_cost(OFF, 16, 0.100)
    chooser.record_cost(SMALL, 16, 0.160)
    assert chooser.row_threshold(SMALL, 16) == 0.0  # no acceptance yet
    chooser.choose(16)
    chooser.observe([1, 0])  # SMALL measured first: 1.5 tokens a request
    # one node of the 3 each request verifies costs (0.160 - 0.100) / (16 * 3) s; the batch earns 16 * 1.5 / 0.160
    # tokens a second: a node pays at p >= 0.06 * 1.5 / (3 * 0.16)
    assert chooser.row_threshold(SMALL, 16) == pytest.approx(0.06 * 1.5 / (3 * 0.16))
    assert chooser.row_threshold(OFF, 16) == 0.0 and chooser.row_threshold(SMALL, 8) == 0.0
    chooser.record_cost(SMALL, 4, 0.09)
    chooser.record_cost(OFF, 4, 0.10)
    assert chooser.row_threshold(SMALL, 4) == 0.0  # cheaper than the off step: every node is free
