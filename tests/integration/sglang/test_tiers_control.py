"""The acceptance-calibrated tier control inside SGLang's adaptive machinery, with a recorded-acceptance stand-in draft.

A :class:`SageTierController` (SGLang's ``AdaptiveController`` keyed by SAGE tier) over the recording worker of
``test_tiers_capture.py`` is driven the way the SAGE worker drives it (request keys and ``activate_step_by_batch`` at
the step's start, the step's time through ``record_times``, ``on_verify_complete`` with the accept counts), with a
stand-in draft whose acceptance was recorded before the run: each request's drafts agree with the target for a
recorded number of tokens, so a tier of ``s`` steps accepts ``min(agreement, s)`` drafts and a request the gate
stops accepts none (its root is verified alone).  Step costs are the 2-core CPU's (``docs/design/sglang-internals.md``: batch 16 off
145 ms, ``[1, 2]`` 202 ms, ``[3, 4]`` 368 ms; batch 4 between batch 1's and batch 16's).

* the draft's acceptance collapses mid-run (level 1 from 75% to 5%): the calibrated control is at the off tier
  within a bounded number of steps, drafts little while it stays collapsed, and is back to speculation within the
  probe back-off once acceptance recovers; the measured control (``tier_control: measured``) takes far longer;
* with the per-request gate, two requests whose drafts collapse stop speculating while the other six go on;
* one request at a time, each priced at its own acceptance: requests whose drafts fail go off after a few steps while
  requests whose drafts pass keep drafting;
* a batch carried by one request whose drafts pass goes off where its median request would serve slower than off;
* two tensor-parallel ranks timing their steps and prefill passes differently choose the same tiers and masks.
"""

from __future__ import annotations

import random
import statistics

import pytest

pytest.importorskip("sglang")

from sage_plugin.config import SageConfig  # noqa: E402
from sage_plugin.runtimes.sglang.tiers import (  # noqa: E402
    RankZeroTimes,
    SageTierController,
    request_acceptance,
    request_gate,
    tier_chooser,
)
from sage_plugin.serving.tiers import Tier  # noqa: E402

from .test_tiers_capture import RecordingWorker  # noqa: E402

TIERS = ((0, 1), (1, 2), (3, 4))
#: seconds a step, by batch size and the tier's draft steps
COSTS = {1: {0: 0.031, 1: 0.034, 3: 0.044}, 4: {0: 0.100, 1: 0.112, 3: 0.170}, 16: {0: 0.145, 1: 0.202, 3: 0.368}}
GOOD, BAD = (0.75, 0.6, 0.5), (0.05, 0.3, 0.3)  # level pass rates: in-domain, and a draft confident and wrong


class RecordedDraft:
    """Per step and request, the tokens the draft agrees with the target for, recorded (seeded) before the run from
    per-phase level pass rates; ``phases`` is ``[(steps, rates for every request or per key)]``."""

    def __init__(self, phases: list[tuple[int, object]], batch: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.records: list[list[int]] = []
        for steps, rates in phases:
            for _ in range(steps):
                row = []
                for i in range(batch):
                    h = rates[i] if isinstance(rates, dict) else rates
                    n = 0
                    while n < len(h) and rng.random() < h[n]:
                        n += 1
                    row.append(n)
                self.records.append(row)

    def accepted(self, step: int, tier: Tier, mask: list[bool] | None) -> list[int]:
        return [0 if mask is not None and not mask[i] else min(a, tier.steps) for i, a in enumerate(self.records[step])]


def _controller(control: str, gate: bool = False, shared_rank: int | None = None, broadcast=None, **serving):
    """The controller a SAGE server builds from its config (``serving``: other serving fields)."""
    cfg = SageConfig(k=4, w_max=4, tiers=TIERS, tier_control=control, tier_request_gate=gate, **serving)
    chooser = tier_chooser(cfg.serving)
    shared = None if broadcast is None else RankZeroTimes(chooser, shared_rank, broadcast, every=8)
    gate_, acceptance = request_gate(cfg.serving), request_acceptance(cfg.serving)
    ctl = SageTierController(RecordingWorker(3, 4), chooser, shared, gate_, acceptance, cfg.serving.tier_median_request)
    ctl.init_states()
    return ctl


def _drive(
    ctl: SageTierController, draft: RecordedDraft, bs: int, seed: int = 0, rank_noise: float = 0.0, lag: float = 0.0
):
    """Every recorded step through the controller; returns the tier and mask of each step.  ``lag`` > 0: a lagging
    draft (``tier_off_lag``) whose catch-up takes ``lag`` seconds inside the first drafted step after off steps, as
    the worker times it."""
    rng = random.Random(seed)
    out = []
    behind = False
    for step in range(len(draft.records)):
        ctl.keys = list(range(bs))
        ctl.behind = behind if lag else None
        ctl.activate_step_by_batch(bs)
        tier, mask = ctl.active, ctl.mask
        caught = lag if behind and not tier.off else 0.0
        seconds = COSTS[bs][tier.steps] * (1 + 0.05 * rng.random() + rank_noise) + caught
        admitted = list(range(bs)) if step % 32 == 31 else None  # a prefill pass now and then (admissions)
        times = [((tier, bs), seconds)] + ([((None, 0), 0.08 * (1 + rank_noise))] if admitted else [])
        ctl.record_times(times, None, caught)
        ctl.end_step()
        ctl.on_verify_complete(draft.accepted(step, tier, mask), bs)
        out.append((tier, mask))
        behind = bool(lag) and tier.off
    return out


def _in_process_broadcast(messages: list):
    """``broadcast(rank)``: a stand-in for the tensor-parallel host broadcast in one process, rank 0 run first (its
    sends queue in ``messages``, rank 1's receives take them in order)."""

    def broadcast(rank: int):
        def send(t):
            if rank == 0:
                messages.append(t.clone())
            else:
                t.copy_(messages.pop(0))

        return send

    return broadcast


def _first_settled(tiers: list[Tier], start: int, off: bool, run: int = 8) -> int | None:
    """Steps after ``start`` until ``run`` steps in a row are all off (``off``) or all drafted."""
    for i in range(start, len(tiers) - run):
        if all(t.off == off for t in tiers[i : i + run]):
            return i - start
    return None


@pytest.mark.parametrize("lag", [0.0, 0.03], ids=["current", "lagging"])
@pytest.mark.parametrize("bs, off_within", [(4, 24), (16, 4)])
def test_a_collapse_of_acceptance_turns_speculation_off_and_its_recovery_back_on(bs, off_within, lag):
    """Also with a lagging draft whose catch-up costs as much as a third of a step: the switches with the regime
    (off on the collapse, back on the recovery) are not held up by the catch-up they bring."""
    draft = RecordedDraft([(300, GOOD), (300, BAD), (400, GOOD)], bs)
    tiers = [t for t, _ in _drive(_controller("calibrated"), draft, bs, lag=lag)]
    assert sum(not t.off for t in tiers[200:300]) >= 95  # in-domain: speculating
    assert _first_settled(tiers, 300, off=True) <= off_within
    assert sum(not t.off for t in tiers[300 + off_within + 8 : 600]) <= 0.12 * (300 - off_within - 8)  # probes only
    # back within the probe back-off (probe_every 16 x probe_backoff 8 = 128 steps) and a few steps to settle
    assert _first_settled(tiers, 600, off=False) <= 128 + 16
    assert sum(not t.off for t in tiers[800:]) >= 0.95 * 200
    # the measured control, whose long memory holds the in-domain acceptance, leaves speculation on far longer
    measured = [t for t, _ in _drive(_controller("measured"), draft, bs)]
    assert sum(not t.off for t in measured[300:600]) > 2 * sum(not t.off for t in tiers[300:600])


def test_the_gate_stops_only_the_requests_whose_drafts_fail():
    bs = 16
    collapsed = {i: (BAD if i < 4 else GOOD) for i in range(bs)}
    draft = RecordedDraft([(100, GOOD), (300, collapsed)], bs, seed=1)
    steps = _drive(_controller("calibrated", gate=True), draft, bs)
    tail = steps[200:]
    assert sum(not t.off for t, _ in tail) >= 0.9 * len(tail)  # the batch goes on speculating
    masked = [m for t, m in tail if not t.off and m is not None]
    assert len(masked) >= 0.9 * len(tail)
    share = [sum(m[i] for m in masked) / len(masked) for i in range(bs)]
    assert max(share[:4]) <= 0.15  # the four collapsed requests speculate only on their probes
    assert min(share[4:]) == 1.0  # the others every drafted step


def _serve_one_at_a_time(ctl: SageTierController, kinds: list[tuple], steps: int, seed: int = 0) -> list[list]:
    """Requests one after another at batch 1 (a client at concurrency 1), request ``j`` with level pass rates
    ``kinds[j % len(kinds)]`` for ``steps`` decode steps in request slot ``j % 4``, each admitted by a prefill pass;
    returns each request's ``(tier, accepted drafts)`` per step."""
    rng = random.Random(seed)
    out = []
    for j in range(len(kinds) * 12):
        key, rates, run = j % 4, kinds[j % len(kinds)], []
        ctl.record_times([((None, 0), 0.06)], [key])  # the prefill pass that admits it
        for _ in range(steps):
            ctl.keys = [key]
            ctl.activate_step_by_batch(1)
            tier = ctl.active
            n = 0
            while n < tier.steps and rng.random() < rates[n]:
                n += 1
            ctl.record_times([((tier, 1), COSTS[1][tier.steps] * (1 + 0.05 * rng.random()))], None)
            ctl.end_step()
            ctl.on_verify_complete([n], 1)
            run.append((tier, n))
        out.append(run)
    return out


def test_each_request_is_priced_at_its_own_acceptance():
    """One request at a time, alternating requests whose drafts pass (in-domain) and requests whose drafts almost
    never do (a draft confident and wrong), 48 steps each.  Priced at the population's rate (``tier_request_prior:
    0``) the control follows whichever kind ran last (its change detection sees each switch of kind as a change of
    traffic): some failing requests draft most of their steps and some passing ones are held off.  Each at its own
    rate, every failing request is off after a few steps (probes aside) and serves within a few percent of the off
    tier's time a token, every passing one keeps drafting, and the rate over both kinds rises."""
    dead = (0.02, 0.3, 0.3)

    def figures(ctl):
        runs = _serve_one_at_a_time(ctl, [GOOD, dead], 48)
        drafted = [sum(not t.off for t, _ in run[12:]) / len(run[12:]) for run in runs]
        per_token = [sum(COSTS[1][t.steps] for t, _ in run) / sum(1 + n for _, n in run) for run in runs]
        rate = sum(sum(1 + n for _, n in run) for run in runs) / sum(COSTS[1][t.steps] for run in runs for t, _ in run)
        return drafted[0::2], drafted[1::2], per_token[0::2], per_token[1::2], rate

    good, bad, good_t, bad_t, rate = figures(_controller("calibrated"))
    good0, bad0, _, _, rate0 = figures(_controller("calibrated", tier_request_prior=0.0))
    assert max(bad0[2:]) >= 0.8 and min(good0[2:]) <= 0.5  # the population's rate: the last kind's regime
    assert max(bad[2:]) <= 0.15  # their own: off but for the probes
    assert max(bad_t[2:]) <= 1.06 * COSTS[1][0]
    assert min(good[2:]) >= 0.9 and max(good_t[2:]) < 0.8 * COSTS[1][0]  # the passing requests keep drafting
    assert rate > rate0


def test_a_drafted_step_must_pay_for_the_median_request():
    """Four requests, one whose drafts almost always pass and three whose drafts almost never do.  Priced by the
    batch's tokens alone (``tier_median_request: false``) the first request carries the batch: most steps draft
    ``[1, 2]`` and the three others wait longer for each of their tokens than an off step would keep them.  With the
    median request priced the steps are off but for probes, and the median request's time a token is within a few
    percent of the off step's; the batch gives up the tokens the first request's drafts returned."""
    bs, dead = 4, (0.02, 0.3, 0.3)
    draft = RecordedDraft([(400, {0: (0.95, 0.9, 0.9), 1: dead, 2: dead, 3: dead})], bs, seed=3)

    def figures(ctl):
        steps = _drive(ctl, draft, bs)[100:]
        drafted = sum(not t.off for t, _ in steps) / len(steps)
        seconds = sum(COSTS[bs][t.steps] for t, _ in steps)
        tokens = [0] * bs
        for i, (tier, mask) in enumerate(steps, start=100):
            for r, a in enumerate(draft.accepted(i, tier, mask)):
                tokens[r] += 1 + a
        per_token = sorted(seconds / n for n in tokens)
        return drafted, statistics.median(per_token), sum(tokens) / seconds

    ctl, ctl0 = _controller("calibrated"), _controller("calibrated", tier_median_request=False)
    drafted, median_t, rate = figures(ctl)
    drafted0, median_t0, rate0 = figures(ctl0)
    offs, offs0 = ctl.chooser.median_offs, ctl0.chooser.median_offs  # the steps the median request turned off
    assert offs >= 0.8 * 300 and offs0 == 0
    assert drafted0 >= 0.8 and median_t0 >= 1.08 * COSTS[bs][0]  # the batch's rate alone: the median request loses
    assert rate0 > 1.05 * bs / COSTS[bs][0]  # ... while the batch gains
    assert drafted <= 0.15  # probes only
    assert median_t <= 1.03 * COSTS[bs][0]  # the probes of the drafted tiers aside, off steps
    assert rate < rate0


def test_tensor_parallel_ranks_choose_the_same_tiers_and_masks():
    """Rank 1 times its steps and prefill passes 20% slower; through ``RankZeroTimes`` both ranks price with rank 0's
    timings, so they choose the same tiers and masks at every step (the accept counts are the same on both)."""
    bs = 16
    collapsed = {i: (BAD if i < 4 else GOOD) for i in range(bs)}
    draft = RecordedDraft([(60, GOOD), (200, collapsed), (60, BAD)], bs, seed=2)
    messages: list = []
    broadcast = _in_process_broadcast(messages)
    ctls = [_controller("calibrated", True, r, broadcast(r)) for r in (0, 1)]
    runs = [[], []]
    rngs = [random.Random(0), random.Random(0)]
    for step in range(len(draft.records)):
        for r, ctl in enumerate(ctls):  # rank 0 first: its share is what rank 1 receives
            ctl.keys = list(range(bs))
            ctl.activate_step_by_batch(bs)
            tier, mask = ctl.active, ctl.mask
            noise = 0.05 * rngs[r].random() + 0.2 * r
            times = [((tier, bs), COSTS[bs][tier.steps] * (1 + noise))]
            if step % 16 == 15:
                times.append(((None, 0), 0.08 * (1 + noise)))
            ctl.record_times(times, list(range(4)) if step % 50 == 49 else None)
            ctl.end_step()
            ctl.on_verify_complete(draft.accepted(step, tier, mask), bs)
            runs[r].append((tier, mask))
    assert runs[0] == runs[1]
    assert ctls[0].chooser.summary() == ctls[1].chooser.summary()
    assert any(t.off for t, _ in runs[0]) and any(m is not None for _, m in runs[0])  # both choices were exercised


def test_a_catch_up_is_priced_apart_from_the_drafted_step_it_preceded_on_every_rank():
    """The worker hands the controller a drafted step's time with a lagging draft's catch-up inside it: the step is
    priced without it, the catch-up on its own (``TierChooser.catch_up``), and under tensor parallelism both are
    rank 0's (rank 1 times everything twice as slow)."""
    messages: list = []
    broadcast = _in_process_broadcast(messages)
    one = Tier(1, 2)
    ctls = [_controller("calibrated", False, r, broadcast(r)) for r in (0, 1)]
    for r, ctl in enumerate(ctls):  # rank 0 first: its shares are what rank 1 receives
        for _ in range(16):
            ctl.record_times([((one, 4), 0.130 * (1 + r))], None, catch_up=0.018 * (1 + r))
            ctl.end_step()
    for ctl in ctls:
        assert ctl.chooser.catch_up(4) == pytest.approx(0.018)
        assert ctl.chooser.cost(one, 4) == pytest.approx(0.112)
        assert ctl.chooser.summary()["overhead"]["catch_up_ms@4"] == pytest.approx(18.0)
    assert not messages
    # the controller hands the chooser whether the draft is behind
    ctl = _controller("calibrated")
    seen = []
    choose = ctl.chooser.choose
    ctl.chooser.choose = lambda *a: seen.append(a[3]) or choose(*a)
    for behind in (None, False, True):
        ctl.behind = behind
        ctl.activate_step_by_batch(4)
    assert seen == [None, False, True]


def test_speculate_mask_is_a_device_tensor_of_the_host_mask():
    ctl = _controller("calibrated", gate=True)
    assert ctl.speculate_mask("cpu") is None  # every request speculates
    ctl.mask = [True, False, True]
    mask = ctl.speculate_mask("cpu")
    assert mask.dtype.is_floating_point is False and mask.tolist() == [True, False, True]


def test_request_keys_are_sglangs_request_slots():
    """The worker keys each request by its slot in SGLang's request pool, read from SGLang's own ``Req`` record."""
    import types

    from sglang.srt.managers.schedule_batch import ReqKvInfo

    from sage_plugin.runtimes.sglang.tiers import request_keys

    batch = types.SimpleNamespace(reqs=[types.SimpleNamespace(kv=ReqKvInfo(req_pool_idx=i)) for i in (5, 2, 9)])
    assert request_keys(batch) == [5, 2, 9]
    batch.reqs.append(types.SimpleNamespace(kv=ReqKvInfo()))  # a request without a slot yet: no keys, no gating
    assert request_keys(batch) is None and request_keys(types.SimpleNamespace()) is None
