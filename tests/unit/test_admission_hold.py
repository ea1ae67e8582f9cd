"""The bound on the min-free-slots delayer's hold (``serving/admission_hold.py``, ``runtimes/sglang/admission_hold.py``)
against a naive oracle: a pass the delayer would hold admits once ``steps`` drafted decode steps ran since the hold
began; off steps do not count."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sage_plugin.config import ConfigError, SageConfig
from sage_plugin.runtimes.sglang import admission_hold as hook
from sage_plugin.serving.admission_hold import HoldBound


def naive_bounded(passes: list[tuple[bool, bool | None]], steps: int) -> list[bool]:
    """Each pass's outcome from the passes before it: ``passes`` are ``(the delayer holds, the decode step after the
    pass: drafted True, off False, none None)``.  A held pass looks back to the first pass of its hold (the earliest
    of the unbroken run of held outcomes before it) and holds while fewer than ``steps`` drafted steps ran since;
    ``steps`` 0 changes nothing."""
    out: list[bool] = []
    for i, (holds, _) in enumerate(passes):
        if not holds or not steps:
            out.append(holds)
            continue
        first = i
        while first > 0 and out[first - 1]:
            first -= 1
        drafted = sum(1 for _, step in passes[first:i] if step)
        out.append(drafted < steps)
    return out


def _run(bound: HoldBound, passes: list[tuple[bool, bool | None]]) -> list[bool]:
    out = []
    for holds, step in passes:
        out.append(bound.delay(holds))
        if step is not None:
            bound.step(step)
    return out


_PASSES = st.lists(st.tuples(st.booleans(), st.sampled_from([True, False, None])), max_size=60)


@given(_PASSES, st.integers(0, 6))
def test_the_bound_matches_the_naive_oracle(passes: list[tuple[bool, bool | None]], steps: int) -> None:
    bound = HoldBound(steps)
    expected = naive_bounded(passes, steps)
    assert _run(bound, passes) == expected
    assert bound.released == sum(holds and not o for (holds, _), o in zip(passes, expected))


@given(st.lists(st.booleans(), max_size=60), st.integers(0, 6))
def test_off_steps_leave_the_delayer_in_charge(verdicts: list[bool], steps: int) -> None:
    """A server at the off tier decodes as plain decoding does: its holds are SGLang's, however long."""
    bound = HoldBound(steps)
    assert _run(bound, [(v, False) for v in verdicts]) == verdicts
    assert bound.released == 0


def test_the_worked_example() -> None:
    bound = HoldBound(2)
    assert _run(bound, [(True, True), (True, False), (True, True), (True, None)]) == [True, True, True, False]
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


def _passes(delayer: _Delayer, free: list[int], drafted: bool = True) -> list[bool]:
    """One scheduler pass per entry of ``free`` (slots free), each followed by a decode step, ``drafted`` or off."""
    out = []
    for f in free:
        out.append(hook.should_delay(_Delayer.should_delay, delayer, running_bs=16 - f, num_allocatable_reqs=f))
        hook.note_step(drafted)
    return out


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


def test_the_hook_counts_only_drafted_steps(bound_of) -> None:
    bound_of(3)
    delayer = _Delayer(4)
    assert _passes(delayer, [2] * 40, drafted=False) == [True] * 40  # off steps: SGLang's hold
    assert _passes(delayer, [2] * 4) == [True, True, True, False]  # the same hold: three drafted steps, then admits
    scheduler = type("Scheduler", (), {"min_free_slots_delayer": delayer})()
    assert hook.hold_section(scheduler) == {"admission_hold": {"steps": 3, "released": 1}}


def test_without_a_bound_the_delayer_decides(bound_of) -> None:
    delayer = _Delayer(4)
    assert _passes(delayer, [2] * 40 + [4]) == [True] * 40 + [False]
    assert hook.hold_section(type("Scheduler", (), {"min_free_slots_delayer": delayer})()) == {}
    assert hook.hold_section(type("Scheduler", (), {"min_free_slots_delayer": None})()) == {}
