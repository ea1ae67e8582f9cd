"""Each request's acceptance against the tier chooser's expectation: the weight its drafts carry in a step's price.

The chooser's expected tokens for a tier (:meth:`~.tiers.TierChooser.expected_tokens`) are the population's: every
request of the tier group, batch-size class and alpha bin.  Requests differ far more than that mean shows, and each
keeps its own rate: out of domain a translation whose drafts almost never pass and a word problem accepting a draft
most steps share one alpha bin (docs/benchmarks.md, "Each request's own acceptance").  Priced at the population's
mean, a request of the first kind drafts at every step and serves slower than plain decoding while the second kind
serves faster: the mean rate holds, the median request loses.

So each request keeps, over its drafted steps (decayed by a factor ``e`` over ``memory`` of them), the drafts it had
accepted ``A`` and the drafts the chooser expected of those steps ``E`` (the tier's expected tokens less one when the
step was chosen), and its *factor*

    m_r = (A_r + c) / (E_r + c)

the posterior mean of a Gamma(c, c) prior on the ratio of its accepted drafts to the expected ones under Poisson
counts: 1 for a new request, moved by evidence once the request was expected to accept about ``c`` drafts.  Because
``E`` is the expectation each step was priced with (its tier, alpha bin and batch-size class), the factor is what the
population's estimate leaves unexplained, whatever tiers the request ran at.  The chooser prices a step with the
drafting requests weighted by their factors (:meth:`weight`, ``TierChooser.choose(speculating=...)``): a batch of
``B`` requests at a tier of ``tau`` expected tokens returns ``B + (tau - 1) sum m_r`` tokens.  At sixteen requests
of one population the factors average about 1 and the price is the population's; at one or a few requests the tier
follows the requests in the batch.  A request held off this way is re-measured by the chooser's probes.  The batch's
median factor (:meth:`median`) prices its median request too (``BreakEven.median_pays``): a drafted step must pay
for it as well as for the batch.

Worked example (``c = 2``, ``memory = 16``): a request alone in its batch, ``[3, 4]`` expected to accept 0.8 drafts a
step. After 4 drafted steps accepting none, ``E = 0.8 (1 + d + d^2 + d^3) = 2.91`` (``d = 1 - 1/16``), ``m = 2 / 4.91 =
0.41``: the step is priced at ``1 + 0.8 x 0.41 = 1.33`` tokens instead of 1.8. A request that accepted 2 drafts in each
of those steps: ``A = 7.28``, ``m = 9.28 / 4.91 = 1.89``.

Host data only (request keys and the accept counts the runtime already copies to the host), so every
tensor-parallel rank computes the same weights.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

__all__ = ["RequestAcceptance"]


@dataclass
class _Counts:
    accepted: float = 0.0  # decayed sum of the request's accepted drafts over its drafted steps
    expected: float = 0.0  # decayed sum of the drafts the chooser expected of those steps


class RequestAcceptance:
    """Per-request factors on the chooser's expected accepted drafts (module docstring).

    Args:
        prior: ``c``, the expected drafts of evidence a request's own counts need to weigh as much as the population
            (> 0).
        memory: a request's drafted steps over which its counts decay by a factor ``e`` (>= 1).
    """

    def __init__(self, prior: float = 2.0, memory: int = 16) -> None:
        if prior <= 0 or memory < 1:
            raise ValueError(f"prior > 0 and memory >= 1, got {prior} and {memory}")
        self.prior = prior
        self._decay = 1.0 - 1.0 / memory
        self._requests: dict[Hashable, _Counts] = {}

    def reset(self, keys: Iterable[Hashable]) -> None:
        """New requests in these slots (a prefill): they start at the population's rate."""
        for k in keys:
            self._requests.pop(k, None)

    def factor(self, key: Hashable) -> float:
        """``m_r`` of request ``key`` (1 for a request never drafted)."""
        r = self._requests.get(key)
        return 1.0 if r is None else (r.accepted + self.prior) / (r.expected + self.prior)

    def weight(self, keys: Sequence[Hashable], mask: Sequence[bool] | None = None) -> float:
        """The drafting requests' summed factors: the chooser's ``speculating`` for a batch of ``keys`` of which those
        with ``mask`` True draft (None: all)."""
        return sum(self.factor(k) for i, k in enumerate(keys) if mask is None or mask[i])

    def median(self, keys: Sequence[Hashable], mask: Sequence[bool] | None = None) -> float:
        """The median request's factor in a batch of ``keys`` (those with ``mask`` False draft nothing: 0), the
        chooser's ``median`` (``TierChooser.choose``).  Factors 0.2, 0.3, 0.5 and 3.0: 0.4."""
        return statistics.median(self.factor(k) if mask is None or mask[i] else 0.0 for i, k in enumerate(keys))

    def observe(
        self, keys: Sequence[Hashable], accepted: Sequence[int], expected: float, mask: Sequence[bool] | None = None
    ) -> None:
        """A drafted step's feedback: each request's accepted drafts, ``expected`` the accepted drafts the chooser
        expected of a request at the step's tier; requests with ``mask`` False did not draft and are left alone."""
        for i, k in enumerate(keys):
            if mask is not None and not mask[i]:
                continue
            r = self._requests.setdefault(k, _Counts())
            r.accepted = r.accepted * self._decay + accepted[i]
            r.expected = r.expected * self._decay + expected

    def summary(self) -> dict[str, float]:
        """For metrics: requests tracked and their factors' mean (1.0 when none)."""
        n = len(self._requests)
        mean = sum(self.factor(k) for k in self._requests) / n if n else 1.0
        return {"requests": n, "mean_factor": round(mean, 3)}
