"""A bound on how long a min-free-slots delayer holds queued requests while request slots are free.

SGLang's ``--min-free-slots-delay N`` admits no new request while fewer than ``N`` request slots are free and other
requests run, so that refills are prefilled together (on a CPU a prefill pass costs about as much for one request as
for four).  Its premise is that slots free up in groups: requests decoded without speculation advance in lockstep,
and those of one length finish in the same step.  Speculative requests accept different numbers of tokens a step and
finish one or two at a time, so each freed slot idles until ``N - 1`` more requests finish, and at the end of a burst
of traffic the last requests wait, with slots free, for completions that may be seconds away
(``docs/benchmarks.md``, "Sixteen clients: staggered finishes").

:class:`HoldBound` lets the delayer hold for at most ``steps`` consecutive scheduler passes; the next pass admits
what is queued.  It counts passes, not seconds: every tensor-parallel rank runs the same passes, so all ranks admit in
the same one (a wall clock would differ by rank and split their batches).

Worked example, ``steps = 2``, the delayer's verdicts over five passes ``[hold, hold, hold, admit, hold]``: the bound
gives ``[hold, hold, admit, admit, hold]`` (the third consecutive hold is released; the delayer's own admit ends the
run, and the next hold starts a new one).
"""

from __future__ import annotations

__all__ = ["HoldBound"]


class HoldBound:
    """At most ``steps`` consecutive holds (0: no bound, every verdict stands).

    Attributes:
        held: consecutive passes held so far.
        released: holds the bound ended (the passes that admitted though the delayer would have held).
    """

    def __init__(self, steps: int) -> None:
        if steps < 0:
            raise ValueError(f"steps >= 0, got {steps}")
        self.steps = steps
        self.held = 0
        self.released = 0

    def delay(self, delayer_holds: bool) -> bool:
        """Whether this pass holds the queue, given the delayer's own verdict for it."""
        if not delayer_holds or not self.steps:
            self.held = 0
            return delayer_holds
        if self.held < self.steps:
            self.held += 1
            return True
        self.held = 0
        self.released += 1
        return False
