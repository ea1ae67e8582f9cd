"""Start-up cost timing (engines/profile.py) on a device whose speed drifts while it is timed: interleaved sweeps
keep the curve's shape (which size is cheapest, where padding pays), timing each size's repeats back to back does
not."""

from __future__ import annotations

import math
import types

import pytest
import torch

from sage_plugin.core.cost import cheapest_at_least
from sage_plugin.engines import cost_samples, profile


class _State:
    """What ``_forward_ms`` reads of a SeqState: one request."""

    next_pos = torch.zeros(1, dtype=torch.int64)

    def attention_mask(self, causal, valid):
        return causal

    def compact(self, slack):
        pass


def _true_ms(tokens: int) -> float:
    """A rows-kernel-like verify curve: a step per group of 4 rows, 3 rows of a group dearer than 4, 12 rows a dip
    (3 and 7 tokens pad to 4 and 8, 9-11 to 12)."""
    return 40.0 + 0.8 * tokens + 6.0 * math.ceil(tokens / 4) + 2.0 * (tokens % 4 == 3) - 6.0 * (tokens == 12)


@pytest.fixture
def drifting(monkeypatch):
    """A fake clock: every forward of ``tokens`` rows costs ``_true_ms(tokens)`` times a factor that grows 1.5% per
    forward (a VM slowing down); a draft forward of w rows 2 + 0.1 w ms times the same factor."""
    now, calls = [0.0], [0]
    monkeypatch.setattr(cost_samples, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))  # timed_ms

    def fwd(base):
        def forward(state, ids, pos, mask):
            calls[0] += 1
            now[0] += base(ids.shape[1]) * (1 + 0.015 * calls[0]) / 1e3

        return forward

    return fwd(_true_ms), fwd(lambda w: 2.0 + 0.1 * w)


def _measure(target_fwd, draft_fwd, **kw):
    target = types.SimpleNamespace(forward=target_fwd)
    return profile.measure_cost_samples(target, draft_fwd, _State(), _State(), 15, 1, pad=True, **kw).cost()


def test_interleaved_sweeps_cancel_a_linear_drift():
    t = [0]

    def time_one(size):
        t[0] += 1
        return size * (1 + 0.1 * t[0])

    got = profile.interleaved_ms(time_one, [1, 2, 3], 4)
    assert [len(v) for v in got.values()] == [4, 4, 4]
    assert [v[0] for v in got.values()] == pytest.approx([1.1, 2.4, 3.9])  # ascending, then descending
    med = {s: sorted(v)[1:3] for s, v in got.items()}  # the two middle values of 4: the same times for every size
    assert {round(sum(m) / s, 9) for s, m in med.items()} == {round(sum(med[1]), 9)}


def test_the_start_up_curve_keeps_its_shape_under_drift(drifting):
    target_fwd, draft_fwd = drifting
    cost = _measure(target_fwd, draft_fwd, max_width=4)
    true_price, true_run = cheapest_at_least([_true_ms(q + 1) for q in range(16)])
    assert list(cost.verify_run) == true_run  # every padding target found
    scale = float(cost.verify_ms[0]) / true_price[0]
    assert cost.verify_ms.tolist() == pytest.approx([p * scale for p in true_price], rel=1e-6)  # one factor (float32)
    assert cost.draft_run == (0, 1, 2, 3, 4)  # a rising draft curve: every width its own


def test_back_to_back_repeats_lose_the_shape_under_the_same_drift(drifting, monkeypatch):
    """The control: sweeps that all run in ascending order (each size later in every sweep than the one before it)
    put the drift between sizes, and the 12-row dip is lost."""
    target_fwd, draft_fwd = drifting

    def ascending(time_one, sizes, sweeps):
        return {s: [time_one(s) for _ in range(sweeps)] for s in sizes}

    monkeypatch.setattr(profile, "interleaved_ms", ascending)
    cost = _measure(target_fwd, draft_fwd, max_width=4)
    assert list(cost.verify_run) != cheapest_at_least([_true_ms(q + 1) for q in range(16)])[1]


@pytest.mark.parametrize(("pad", "max_width", "typical", "widths"), [(False, 4, 3, [3]), (True, 4, 3, [1, 2, 3, 4]),
                                                                      (True, 2, 3, [1, 2, 3]), (True, 0, 2, [2])])  # fmt: skip
def test_draft_widths_timed(drifting, pad, max_width, typical, widths):
    """Padded: every width up to ``max_width``; a typical width past them (or unpadded, the typical alone) is timed
    at its own size too, in the same sweeps, ``repeats`` times each."""
    target_fwd, draft_fwd = drifting
    target = types.SimpleNamespace(forward=target_fwd)
    s = profile.measure_cost_samples(target, draft_fwd, _State(), _State(), 3, typical, pad=pad, max_width=max_width)
    assert sorted(s.draft) == widths and all(len(d) == 4 for d in s.draft.values())
