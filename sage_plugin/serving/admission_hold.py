"""A bound on how long a min-free-slots delayer holds queued requests while request slots are free.

SGLang's ``--min-free-slots-delay N`` admits no new request while fewer than ``N`` request slots are free and other
requests run, so that refills are prefilled together (on a CPU a prefill pass costs about as much for one request as
for four).  Its premise is that slots free up in groups: requests decoded without speculation advance in lockstep,
and those of one length finish in the same step.  Speculative requests accept different numbers of tokens a step and
finish one or two at a time, so each freed slot idles until ``N - 1`` more requests finish, and at the end of a burst
of traffic the last requests wait, with slots free, for completions that may be seconds away
(``docs/benchmarks.md``, "Sixteen clients: staggered finishes").

:class:`HoldBound` lets the delayer hold for at most ``steps`` of the decode steps SAGE drafted meanwhile; the next
pass admits what is queued.  Only drafted steps count: they set requests apart, while at the off tier the server decodes
as plain decoding does, in lockstep, and holds as SGLang does (an all-off server admits exactly as a plain one).  It
counts steps, not seconds: every tensor-parallel rank runs the same steps at the same tier, so all ranks admit in the
same pass (a wall clock would differ by rank and split their batches).

Worked example, ``steps = 2``: the delayer holds at four passes, and the decode steps between them are drafted, off,
drafted: the bound gives ``[hold, hold, hold, admit]`` (the fourth pass follows the hold's second drafted step; the
off step did not count).  The delayer's own admit ends a hold, and the next hold counts afresh.
"""

from __future__ import annotations

__all__ = ["HoldBound"]


class HoldBound:
    """At most ``steps`` drafted decode steps a hold (0: no bound, every verdict stands).

    Attributes:
        held: drafted decode steps run since the current hold began.
        released: holds the bound ended (the passes that admitted though the delayer would have held).
    """

    def __init__(self, steps: int) -> None:
        if steps < 0:
            raise ValueError(f"steps >= 0, got {steps}")
        self.steps = steps
        self.held = 0
        self.released = 0
        self._holding = False

    def delay(self, delayer_holds: bool) -> bool:
        """Whether this pass holds the queue, given the delayer's own verdict for it."""
        if not delayer_holds or not self.steps:
            self.held, self._holding = 0, False
            return delayer_holds
        if self.held < self.steps:
            self._holding = True
            return True
        self.held, self._holding = 0, False
        self.released += 1
        return False

    def step(self, drafted: bool) -> None:
        """A decode step ran, drafted or at the off tier: a drafted one counts toward the current hold's bound."""
        if drafted and self._holding:
            self.held += 1
