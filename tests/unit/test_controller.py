"""Adaptive-history controller (batched) against the per-request reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.core.controller import HistoryState, history_init, history_update
from tests.oracles import history_init_ref, history_update_ref


@st.composite
def controller_cases(draw):
    window = draw(st.integers(1, 5))
    d_min = draw(st.integers(1, 4))
    d_max = draw(st.integers(d_min, d_min + 4))
    d_cap = draw(st.integers(d_max, d_max + 4))
    relative = draw(st.booleans())  # thresholds as ratios to the running mean (dyadic: exact comparisons)
    lo = draw(st.sampled_from([0.5, 0.75, 1.0] if relative else [0.5, 1.0, 1.5, 2.0, 2.5]))
    hi = lo + draw(st.sampled_from([0.0, 0.25, 0.5] if relative else [0.0, 0.5, 1.0, 1.5]))
    step = draw(st.integers(1, 3))
    cooldown = draw(st.booleans())
    bsz = draw(st.integers(1, 4))
    rounds = draw(st.integers(1, 30))
    # per-request tau sequences: integers and halves (drafts or drafts + bonus), phases of
    # high and low acceptance so that D_max moves both ways
    half = st.sampled_from([0.0, 0.0, 0.5])
    taus = [[float(draw(st.integers(0, 8))) + draw(half) for _ in range(rounds)] for _ in range(bsz)]
    return dict(
        window=window,
        d_min=d_min,
        d_max=d_max,
        d_cap=d_cap,
        lo=lo,
        hi=hi,
        step=step,
        cooldown=cooldown,
        taus=taus,
        relative=relative,
    )


@settings(max_examples=120, deadline=None)
@given(controller_cases())
def test_history_update_matches_reference(case):
    w, taus = case["window"], case["taus"]
    bsz, rounds = len(taus), len(taus[0])
    kw = dict(
        lo=case["lo"],
        hi=case["hi"],
        step=case["step"],
        d_min=case["d_min"],
        d_cap=case["d_cap"],
        full_window_cooldown=case["cooldown"],
        relative=case["relative"],
    )
    state = history_init(bsz, w, case["d_max"])
    refs = [history_init_ref(case["d_max"]) for _ in range(bsz)]
    last_change = [None] * bsz
    for t in range(rounds):
        before = state.d_max.clone()
        state = history_update(state, torch.tensor([taus[b][t] for b in range(bsz)]), **kw)
        refs = [history_update_ref(refs[b], taus[b][t], window=w, **kw) for b in range(bsz)]
        for b in range(bsz):
            d = int(state.d_max[b])
            assert d == refs[b].d_max, (b, t)
            assert int(state.since_change[b]) == refs[b].since_change
            held = min(int(state.seen[b]), w)
            assert held == len(refs[b].window)
            assert state.window[b, w - held :].tolist() == refs[b].window
            # invariants
            assert case["d_min"] <= d <= case["d_cap"]
            if d != int(before[b]):
                assert abs(d - int(before[b])) <= case["step"]
                assert t + 1 >= w  # the window must be full
                if case["cooldown"] and last_change[b] is not None:
                    assert t - last_change[b] >= w  # cool-down: a full new window between changes
                last_change[b] = t


def test_docstring_trace():
    s = history_init(1, 2, 8)
    out = []
    for t in (4, 4, 4, 4, 1, 1):
        s = history_update(
            s, torch.tensor([float(t)]), lo=2, hi=3, step=1, d_min=3, d_cap=10, full_window_cooldown=True
        )
        out.append(int(s.d_max))
    assert out == [8, 9, 9, 10, 10, 9]


@pytest.mark.parametrize("cooldown", [True, False])
def test_cap_and_floor_hold_under_extreme_tau(cooldown):
    kw = dict(lo=2.0, hi=3.0, step=2, d_min=3, d_cap=9, full_window_cooldown=cooldown)
    s = history_init(2, 3, 8)
    for _ in range(40):
        s = history_update(s, torch.tensor([100.0, 0.0]), **kw)
        assert 3 <= int(s.d_max.min()) and int(s.d_max.max()) <= 9
    assert s.d_max.tolist() == [9, 3]


def test_index_and_cat_round_trip():
    s = history_init(3, 4, 8)
    for t in range(6):
        s = history_update(
            s, torch.tensor([5.0, 1.0, float(t)]), lo=2, hi=3, step=1, d_min=3, d_cap=10, full_window_cooldown=True
        )
    parts = [s.index(torch.tensor([i])) for i in range(3)]
    back = HistoryState.cat(parts)
    for f in ("window", "seen", "since_change", "d_max"):
        assert torch.equal(getattr(back, f), getattr(s, f))
