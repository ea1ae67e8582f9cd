"""Which requests of a drafted step speculate: a request whose drafts keep failing stops, the rest of the batch goes on.

Every request keeps its own decaying mean of accepted drafts per drafted step (``memory`` of its steps), shrunk
toward the population's mean (the tier chooser's expected accepted drafts for the tier) by ``prior_weight``
pseudo-steps, so a new request starts at the population's mean:

    e_r = (accepted_r + w e_pop) / (steps_r + w)

and it speculates while even its optimistic estimate pays: ``e_r + z sqrt(e_r (D - e_r) / (steps_r + w)) >=
break_even`` (``D`` the tier's draft steps, the most a step can accept; the bound is Bhatia-Davis's on a request's
variance).  ``break_even`` is the chooser's (:meth:`~.tiers.TierChooser.request_break_even`): the accepted drafts a
request must add for its rows of the drafted step to pay for themselves.  So a request is stopped on evidence, not on
one bad step, and the batch-level choice of a tier stays the chooser's.

A stopped request comes back on a bounded budget: once it has gone ``gap`` of its steps without speculating it
speculates one step (a probe).  A probe that still does not pay doubles its gap, up to ``probe_backoff *
probe_every``; one that pays resets it to ``probe_every``.  A stopped request therefore drafts at most one step in
``probe_every``, and after repeated failures one in ``probe_backoff * probe_every``.

The mask is computed from host data only (request keys and accept counts the runtime already has on the host), so it
is the same on every tensor-parallel rank and costs the device nothing; a runtime applies it by giving the masked
requests' tree roots no children in the verify input.

Worked example (``w = 4``, ``z = 1``, ``memory = 16``, a 3-step tier, population 1.2 accepted drafts, break-even
0.6): a new request speculates; after 8 drafted steps accepting nothing (6.45 decayed steps), ``e = 4.8 / 10.45 =
0.46`` and its bound ``0.46 + sqrt(0.46 x 2.54 / 10.45) = 0.79`` still speculates; after 16 (10.3 decayed), ``e =
4.8 / 14.3 = 0.34``, bound ``0.34 + 0.25 = 0.59 < 0.6``: it stops, and probes again after 8 of its steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

__all__ = ["RequestGate"]


@dataclass
class _Request:
    accepted: float = 0.0  # decayed sum of accepted drafts over its drafted steps
    steps: float = 0.0  # decayed count of those steps
    idle: int = 0  # its steps since it last speculated
    gap: int = 0  # steps it waits before a probe while stopped


class RequestGate:
    """Per-request speculation from each request's own observed acceptance (module docstring).

    Args:
        memory: a request's drafted steps over which its counts decay by a factor ``e``.
        prior_weight: pseudo-steps of the population's mean in each request's estimate.
        z: standard errors of optimism a request keeps before it is stopped.
        probe_every: a stopped request's steps between probes, at first.
        probe_backoff: the longest probe gap, in multiples of ``probe_every``.
    """

    def __init__(
        self, memory: int = 16, prior_weight: float = 4.0, z: float = 1.0, probe_every: int = 8, probe_backoff: int = 8
    ) -> None:
        if memory < 1 or prior_weight <= 0 or z < 0 or probe_every < 1 or probe_backoff < 1:
            raise ValueError("memory >= 1, prior_weight > 0, z >= 0, probe_every >= 1, probe_backoff >= 1")
        self._decay = 1.0 - 1.0 / memory
        self.prior_weight, self.z = prior_weight, z
        self.probe_every, self.probe_backoff = probe_every, probe_backoff
        self._requests: dict[Hashable, _Request] = {}
        self.stopped_steps = 0  # request-steps that did not speculate in a drafted step (metrics)
        self.probes = 0  # probe steps of stopped requests

    def reset(self, keys: Iterable[Hashable]) -> None:
        """New requests in these slots (a prefill): they start from the population's mean."""
        for k in keys:
            self._requests.pop(k, None)

    def pays(self, key: Hashable, break_even: float, prior: float, depth: int) -> bool:
        """Whether request ``key``'s optimistic accepted drafts reach ``break_even`` (see the module docstring)."""
        r = self._requests.get(key)
        if r is None:
            return True
        w = self.prior_weight
        e = (r.accepted + w * prior) / (r.steps + w)
        return e + self.z * math.sqrt(max(e * (depth - e), 0.0) / (r.steps + w)) >= break_even

    def speculate(self, keys: Sequence[Hashable], break_even: float, prior: float, depth: int) -> list[bool]:
        """``[B]`` whether each request of the step speculates: it pays, or it is stopped and its probe is due.
        Reads state only (:meth:`observe` updates it)."""
        out = []
        for k in keys:
            r = self._requests.get(k)
            out.append(self.pays(k, break_even, prior, depth) or (r is not None and r.idle >= r.gap))
        return out

    def observe(
        self,
        keys: Sequence[Hashable],
        accepted: Sequence[int],
        mask: Sequence[bool] | None,
        break_even: float,
        prior: float,
        depth: int,
    ) -> None:
        """A step's feedback: ``mask`` None for a step that drafted nothing (every request idles), else the step's
        mask and each request's accepted drafts; a stopped request's probe is judged at ``break_even``."""
        for i, k in enumerate(keys):
            r = self._requests.setdefault(k, _Request(gap=self.probe_every))
            if mask is None or not mask[i]:
                r.idle += 1
                self.stopped_steps += int(mask is not None)
                continue
            probe = not self.pays(k, break_even, prior, depth)
            r.accepted = r.accepted * self._decay + accepted[i]
            r.steps = r.steps * self._decay + 1.0
            r.idle = 0
            if probe:
                self.probes += 1
                paid = self.pays(k, break_even, prior, depth)
                r.gap = self.probe_every if paid else min(2 * r.gap, self.probe_backoff * self.probe_every)

    def summary(self) -> dict[str, int]:
        """Counters for metrics: requests tracked, request-steps stopped in drafted steps, probes."""
        return {"requests": len(self._requests), "stopped_steps": self.stopped_steps, "probes": self.probes}
