"""Hardware-aware node budget: cut a round's draft tree to the size that maximises expected tokens per second.

One round costs ``draft_ms * forwards + verify_ms[q]`` when ``q`` draft nodes (plus the root) are verified, and
yields ``1 + sum of the acceptance probabilities of the verified nodes`` tokens (the bonus token always counts).
With a calibrated draft the probability that greedy verification accepts a node is about its path probability
``p = exp(joint log-probability)`` (EAGLE-2's observation), so the expected yield of the ``q`` most
probable nodes is ``1 + sum of their p``.  Joint probability never increases along a path, so "the ``q`` most
probable nodes" (:func:`~sage_plugin.core.expand.budget_top_n`, ties to the earlier, parent-first index) is an
ancestor-closed tree.

``verify_ms`` is the target's forward time as a function of the verified token count, measured once on the device
(:class:`RoundCost`).  On a GPU at small batch it is nearly flat and the cut keeps the whole tree (SAGE's own
``N_max`` stays the bound); on a CPU every verified token costs, and the best tree is small.  EAGLE picks its
``total_token`` by profiling and Sequoia its tree size and depth from measured timings in the same spirit; the
cost model is in ``docs/algorithm.md`` ("sizing trees to the device").

Batched: the reference engine pads the batch's trees to the largest, so one count ``q`` is chosen per batch::

    q* = argmax_q  sum_r (1 + sum_{i<q} p_r,(i))  /  (draft_ms * forwards + verify_ms[q])

with ``p_r,(i)`` the ``i``-th largest node probability of request ``r`` (0 past its last node); ties go to the
smaller ``q``.

Worked example (one request; 2 draft forwards of 3 ms spent; verify_ms = [35, 37, 45, 53] for q = 0..3)::

    node probabilities (root excluded): .8, .5, .1
    q = 0: 1.0 / 41 = .0244    q = 1: 1.8 / 43 = .0419    q = 2: 2.3 / 51 = .0451    q = 3: 2.4 / 59 = .0407
    -> q* = 2: verify the root and the nodes with p .8 and .5
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .expand import NEG_INF, DraftPool, budget_top_n

__all__ = ["RoundCost", "best_count", "cost_cut", "expected_yield"]


@dataclass(frozen=True, slots=True)
class RoundCost:
    """Measured cost of a round's parts on one device, for one batch size.

    Attributes:
        verify_ms: ``[Q]`` float32, non-decreasing; ``verify_ms[q]`` is one target forward over ``q`` draft nodes
            plus the root per request (``q = 0`` is a plain decoding step).  Counts past ``Q - 1`` cost
            ``verify_ms[-1]`` (callers measure up to the largest tree they build).
        draft_ms: one draft forward (a level of the tree, or the catch-up).
    """

    verify_ms: torch.Tensor
    draft_ms: float

    def round_ms(self, forwards: int, nodes: int) -> torch.Tensor:
        """``[nodes + 1]`` cost of a round with ``forwards`` draft forwards and ``q = 0..nodes`` verified nodes."""
        q = torch.arange(nodes + 1, device=self.verify_ms.device).clamp(max=self.verify_ms.shape[0] - 1)
        return self.draft_ms * forwards + self.verify_ms[q]

    @staticmethod
    def from_samples(counts: list[int], ms: list[float], draft_ms: float, max_nodes: int) -> "RoundCost":
        """Interpolate timings measured at some node counts (sorted, starting at 0) to every ``q <= max_nodes``.

        Linear between samples, constant past the last one, then made non-decreasing (a larger forward never
        costs less; timing noise otherwise makes the cut jump around).
        """
        x = torch.tensor(counts, dtype=torch.float32)
        y = torch.tensor(ms, dtype=torch.float32)
        q = torch.arange(max_nodes + 1, dtype=torch.float32).clamp(max=float(x[-1]))
        hi = torch.searchsorted(x, q).clamp(1, len(counts) - 1)
        lo = hi - 1
        w = ((q - x[lo]) / (x[hi] - x[lo])).clamp(0.0, 1.0) if len(counts) > 1 else torch.zeros_like(q)
        curve = y[lo] + w * (y[hi] - y[lo]) if len(counts) > 1 else y.expand_as(q).clone()
        return RoundCost(torch.cummax(curve, 0).values, float(draft_ms))


def expected_yield(node_logp: torch.Tensor) -> torch.Tensor:
    """Expected tokens of a round (summed over the batch) if each request verifies its ``q`` most probable nodes.

    Args:
        node_logp: ``[B, N]`` joint draft log-probability of each draft node (root excluded), ``-inf`` where a
            request has no node.

    Returns:
        ``[N + 1]`` float32: ``B + sum_r sum_{i<q} p_r,(i)`` for ``q = 0..N``.
    """
    bsz, n = node_logp.shape
    p = torch.sort(node_logp.float(), dim=1, descending=True).values.exp()  # exp(-inf) = 0
    per_q = torch.cumsum(p, 1).sum(0)
    return torch.cat([per_q.new_zeros(1), per_q]) + bsz


def best_count(node_logp: torch.Tensor, round_ms: torch.Tensor) -> torch.Tensor:
    """0-dim int64 ``q*``: the node count (per request) with the highest expected tokens per millisecond.

    Args:
        node_logp: ``[B, N]`` as in :func:`expected_yield`.
        round_ms: ``[N + 1]`` round cost for ``q = 0..N`` (:meth:`RoundCost.round_ms`).
    """
    rate = expected_yield(node_logp) / round_ms[: node_logp.shape[1] + 1]
    return torch.argmax(rate)  # first maximum: the smaller tree on ties


def cost_cut(pool: DraftPool, round_ms: torch.Tensor) -> torch.Tensor:
    """``[B, P-1]`` bool over the pool's draft nodes (root and trash column dropped): the cost-optimal cut, i.e.
    each request's ``q*`` most probable nodes (:func:`best_count`; one ``q*`` for the batch)."""
    filled = torch.arange(1, pool.capacity, device=pool.count.device) < pool.count[:, None]
    node_logp = torch.where(filled, pool.joint[:, 1:-1], NEG_INF)
    q = best_count(node_logp, round_ms)
    return budget_top_n(filled, node_logp, q.expand(pool.count.shape[0]))
