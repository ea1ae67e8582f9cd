"""In-loop cost samples (engines/cost_samples.py): medians, drift of unused sizes, refresh period, against naive
re-computations."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.core.cost import RoundCost, best_count
from sage_plugin.engines.cost_samples import WINDOW, CostSamples


def _startup(verify: dict[int, list[float]], draft: dict[int, list[float]] | None = None, **kw) -> CostSamples:
    s = CostSamples(max_nodes=kw.pop("max_nodes", max(verify)), limit=kw.pop("limit", max(verify)), **kw)
    for q, ms in verify.items():
        for m in ms:
            s.add_verify(q, m)
    for w, ms in (draft or {1: [2.0]}).items():
        for m in ms:
            s.add_draft(w, m)
    return s.start()


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _line(xs, ys, q):
    """The piecewise-linear value at ``q`` through the points ``(xs, ys)`` (``xs`` sorted, ``q`` inside)."""
    for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]):
        if x0 <= q <= x1:
            return y0 + (q - x0) * (y1 - y0) / (x1 - x0)
    return ys[-1]


def test_drift_is_against_the_startup_medians_not_the_lifted_curve():
    """A start-up dip (3 nodes cheaper than 1) must not shrink the drift: 3 ran at twice its start-up median."""
    s = _startup({0: [10.0], 1: [30.0], 3: [20.0], 8: [40.0]})
    for _ in range(5):
        s.add_verify(3, 40.0)
    v = s.cost().verify_ms
    assert float(v[8]) == pytest.approx(80.0), "drift 40 / 20 = 2 (the running-max curve would say 40 / 30)"


def test_docstring_example():
    s = _startup({0: [35, 36], 4: [48, 47], 8: [56, 55]})
    assert s.cost().verify_ms[[0, 4, 8]].tolist() == pytest.approx([35.5, 47.5, 55.5])
    for ms in (60, 61, 59):
        s.add_verify(4, ms)
    v = s.cost().verify_ms
    drift = 59 / 47.5
    assert v[4] == pytest.approx(59.0)
    assert v[0] == pytest.approx(35.5 * drift) and v[8] == pytest.approx(55.5 * drift)


def test_startup_cost_is_the_median_curve_with_padding_and_limit():
    verify = {0: [10.0, 12.0], 1: [30.0, 31.0], 3: [20.0, 22.0], 7: [40.0, 44.0]}
    draft = {1: [3.0, 3.2], 2: [5.0, 5.0], 3: [4.0, 4.2]}
    s = _startup(verify, draft, max_nodes=9, limit=7, pad=True, typical_width=2)
    got = s.cost()
    ref = RoundCost.from_samples([0, 1, 3, 7], [11.0, 30.5, 21.0, 42.0], 0.0, 9, True, [1, 2, 3], [3.1, 5.0, 4.1])
    assert got.verify_ms[:8].tolist() == pytest.approx(ref.verify_ms[:8].tolist())
    assert math.isinf(float(got.verify_ms[8])) and math.isinf(float(got.verify_ms[9])), "past the limit: never"
    assert got.verify_run[:8] == ref.verify_run[:8] and got.draft_run == ref.draft_run
    assert got.draft_ms == pytest.approx(4.1), "typical width 2 runs padded at 3"


def test_in_loop_timings_push_out_the_startup_ones():
    s = _startup({0: [10.0, 10.0], 4: [20.0, 20.0]})
    for i in range(WINDOW):
        s.add_verify(4, 50.0 + i)
    assert list(s.verify[4]) == [50.0 + i for i in range(WINDOW)], "the start-up samples are gone"
    assert float(s.cost().verify_ms[4]) == pytest.approx(_median([50.0 + i for i in range(WINDOW)]))


def test_a_slower_device_cuts_trees_at_sizes_never_run():
    """Verify forwards of 1-8 nodes start at 20-27 ms against 10 for the root alone; the run then sees 4 nodes
    cost 200 ms.  Without drift the cut would move to the untouched sizes; with it every node prices out."""
    s = _startup({q: [10.0 if q == 0 else 20.0 + q] * 2 for q in range(9)})
    node_logp = torch.log(torch.tensor([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]]))
    assert int(best_count(node_logp, s.cost().round_ms(1, 8))) == 8
    for _ in range(3):
        s.add_verify(4, 200.0)
        s.add_verify(0, 10.0)
    assert int(best_count(node_logp, s.cost().round_ms(1, 8))) == 0


def test_refresh_period():
    s = _startup({0: [1.0]}, refresh=3)
    assert [s.end_round() for _ in range(7)] == [False, False, True, False, False, True, False]
    never = _startup({0: [1.0]}, refresh=0)
    assert not any(never.end_round() for _ in range(10))


@settings(max_examples=60, deadline=None)
@given(
    start=st.lists(st.floats(1.0, 100.0), min_size=5, max_size=5),
    loop=st.lists(st.tuples(st.sampled_from([0, 2, 3, 6]), st.floats(1.0, 300.0)), max_size=40),
)
def test_cost_matches_naive(start, loop):
    """Naive: per size the median of its last WINDOW timings if the loop used it, else start-up median x the
    median over used sizes of (current median / start-up median there, linear between start-up sizes); then the
    unpadded monotone curve."""
    counts = [0, 1, 2, 4, 8]
    s = _startup({q: [m] for q, m in zip(counts, start)})
    history = {q: [m] for q, m in zip(counts, start)}
    for q, m in loop:
        s.add_verify(q, m)
        history.setdefault(q, []).append(m)
    used = {q for q, _ in loop}
    base = [_line(counts, start, q) for q in range(9)]
    cur = {q: _median(h[-WINDOW:]) for q, h in history.items()}
    drift = _median([cur[q] / base[q] for q in used]) if used else 1.0
    sizes = sorted(history)
    ms = [cur[q] if q in used else dict(zip(counts, start))[q] * drift for q in sizes]
    ref = RoundCost.from_samples(sizes, ms, 0.0, 8)
    assert s.cost().verify_ms.tolist() == pytest.approx(ref.verify_ms.tolist(), rel=1e-5)
