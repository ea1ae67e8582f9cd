"""The bound on the min-free-slots delayer's hold (``serving/admission_hold.py``, ``runtimes/sglang/admission_hold.py``)
against a naive oracle: within each run of consecutive holds of the delayer, every ``steps + 1``-th pass admits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sage_plugin.config import ConfigError, SageConfig
from sage_plugin.runtimes.sglang import admission_hold as hook
from sage_plugin.serving.admission_hold import HoldBound


def naive_bounded(verdicts: list[bool], steps: int) -> list[bool]:
    """Each verdict's outcome from its place in its run of holds: the ``(steps + 1)``-th, ``2 (steps + 1)``-th, ...
    hold of a run admits (the run goes on, counted afresh); ``steps`` 0 changes nothing."""
    out, run = [], 0
    for holds in verdicts:
        run = run + 1 if holds else 0
        out.append(holds and not (steps and run % (steps + 1) == 0))
    return out


@given(st.lists(st.booleans(), max_size=60), st.integers(0, 6))
def test_the_bound_matches_the_naive_oracle(verdicts: list[bool], steps: int) -> None:
    bound = HoldBound(steps)
    assert [bound.delay(v) for v in verdicts] == naive_bounded(verdicts, steps)
    assert bound.released == sum(v and not o for v, o in zip(verdicts, naive_bounded(verdicts, steps)))


def test_the_worked_example() -> None:
    bound = HoldBound(2)
    assert [bound.delay(v) for v in [True, True, True, False, True]] == [True, True, False, False, True]
    assert bound.released == 1


def test_steps_are_validated() -> None:
    with pytest.raises(ValueError):
        HoldBound(-1)
    with pytest.raises(ConfigError, match="admission_hold_steps"):
        SageConfig(admission_hold_steps=-1)
    assert SageConfig().serving.admission_hold_steps == 0


class _Delayer:
    """SGLang's ``MinFreeSlotsDelayer.should_delay`` rule (0.5.23): hold while others run and fewer slots are free."""

    def __init__(self, min_free_slots: int) -> None:
        self.min_free_slots = min_free_slots

    def should_delay(self, *, running_bs: int, num_allocatable_reqs: int) -> bool:
        return running_bs > 0 and num_allocatable_reqs < self.min_free_slots


def _passes(delayer: _Delayer, free: list[int]) -> list[bool]:
    return [hook.should_delay(_Delayer.should_delay, delayer, running_bs=16 - f, num_allocatable_reqs=f) for f in free]


@pytest.fixture
def bound_of() -> object:
    yield hook.configure
    hook.configure(0)


def test_the_hook_bounds_the_delayers_hold(bound_of) -> None:
    bound_of(3)
    delayer = _Delayer(4)
    # two slots free for six passes, then four: the hold ends at the fourth pass, starts afresh, the delayer admits
    assert _passes(delayer, [2, 2, 2, 2, 2, 2, 4]) == [True, True, True, False, True, True, False]
    scheduler = type("Scheduler", (), {"min_free_slots_delayer": delayer})()
    assert hook.hold_section(scheduler) == {"admission_hold": {"steps": 3, "released": 1}}


def test_without_a_bound_the_delayer_decides(bound_of) -> None:
    delayer = _Delayer(4)
    assert _passes(delayer, [2] * 40 + [4]) == [True] * 40 + [False]
    assert hook.hold_section(type("Scheduler", (), {"min_free_slots_delayer": delayer})()) == {}
    assert hook.hold_section(type("Scheduler", (), {"min_free_slots_delayer": None})()) == {}
