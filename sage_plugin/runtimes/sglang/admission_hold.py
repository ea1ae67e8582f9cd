"""SGLang's min-free-slots delayer under a SAGE server: its hold bounded (``--sage-admission-hold-steps``).

SGLang 0.5.23's ``MinFreeSlotsDelayer`` (``--min-free-slots-delay N``) holds the waiting queue while fewer than ``N``
request slots are free, for as long as that lasts.  Speculative requests finish one or two at a time, so the hold leaves
slots empty until ``N - 1`` more finish, and the last requests of a burst wait for the drain
(:mod:`sage_plugin.serving.admission_hold`).  With ``admission_hold_steps = S > 0`` the hook lets the delayer hold
until ``S`` drafted decode steps ran (off steps do not count: there the server decodes as plain decoding does), then
admits what is queued; 0 keeps SGLang's unbounded hold.  The SAGE worker reports each decode step
(:func:`note_step`).  Outputs do not depend on it (admission order and timing only).

The SAGE worker sets the bound for its process (:func:`configure`, from ``_init_sage``, which runs before SGLang builds
the delayer); a process without a SAGE worker keeps 0, so plain and other speculative servers are untouched.
``GET /server_info`` reports ``sage.admission_hold``: the bound and the holds it released (:func:`hold_section`).
"""

from __future__ import annotations

from typing import Any, Callable

from sage_plugin.serving.admission_hold import HoldBound

__all__ = ["ADMISSION_HOOKS", "SHOULD_DELAY", "configure", "hold_section", "note_step", "should_delay"]

SHOULD_DELAY = "sglang.srt.managers.min_free_slots_delayer.MinFreeSlotsDelayer.should_delay"

_STEPS = [0]  # this process's bound (one scheduler a process)
_BOUNDS: list[HoldBound] = []  # the bounds this process's delayers hold, fed by note_step


def configure(steps: int) -> None:
    """The bound of every delayer in this process: at most ``steps`` drafted steps a hold (0: SGLang's)."""
    _STEPS[0] = steps
    _BOUNDS.clear()


def note_step(drafted: bool) -> None:
    """A decode step of this process ran, drafted (True) or at the off tier (False)."""
    for bound in _BOUNDS:
        bound.step(drafted)


def _bound(delayer: Any) -> HoldBound | None:
    bound = getattr(delayer, "_sage_hold", None)
    if bound is None and _STEPS[0]:
        bound = delayer._sage_hold = HoldBound(_STEPS[0])
        _BOUNDS.append(bound)
    return bound


def should_delay(original: Callable[..., bool], self: Any, *, running_bs: int, num_allocatable_reqs: int) -> bool:
    """AROUND ``MinFreeSlotsDelayer.should_delay``: upstream's verdict, a hold ended after the configured passes."""
    holds = original(self, running_bs=running_bs, num_allocatable_reqs=num_allocatable_reqs)
    bound = _bound(self)
    return holds if bound is None else bound.delay(holds)


def hold_section(scheduler: Any) -> dict[str, dict[str, int]]:
    """``{"admission_hold": {"steps", "released"}}`` for ``GET /server_info`` when a bound applies, else ``{}``."""
    delayer = getattr(scheduler, "min_free_slots_delayer", None)
    bound = None if delayer is None else _bound(delayer)
    return {} if bound is None else {"admission_hold": {"steps": bound.steps, "released": bound.released}}


#: ``(target, hook)`` of this module, in :data:`.hooks.HOOKS`
ADMISSION_HOOKS = ((SHOULD_DELAY, should_delay),)
