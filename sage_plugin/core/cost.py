"""Hardware-aware node budget: cut a round's draft tree to the size that maximises expected tokens per second.

One round costs ``(draft_ms + level_ms) * forwards + verify_ms[q]`` when ``q`` draft nodes (plus the root) are verified, and
yields ``1 + sum of the acceptance probabilities of the verified nodes`` tokens (the bonus token always counts).
With a calibrated draft the probability that greedy verification accepts a node is about its path probability
``p = exp(joint log-probability)`` (EAGLE-2's observation), so the expected yield of the ``q`` most
probable nodes is ``1 + sum of their p``.  Joint probability never increases along a path, so "the ``q`` most
probable nodes" (:func:`~sage_plugin.core.level_expansion.budget_top_n`, ties to the earlier, parent-first index) is an
ancestor-closed tree.

``verify_ms`` is the target's forward time as a function of the verified token count, measured once on the device
(:class:`RoundCost`).  Measured curves need not be monotone: on a CPU whose BLAS is slow at a few rows a forward of
3 tokens can cost more than one of 8.  With padding on (``pad_forwards``) a forward of ``q`` runs at the cheapest
measured size ``q' >= q`` (the extra rows are masked padding, as in a ragged batch), so a count is priced at the
suffix minimum of the curve (:func:`cheapest_at_least`), which is non-decreasing by construction; without padding the
curve is made non-decreasing by its running maximum (a forward is never priced below a smaller one).  On a GPU at small batch it is nearly flat and the cut keeps the whole tree (SAGE's own
``N_max`` stays the bound); on a CPU every verified token costs, and the best tree is small.  EAGLE picks its
``total_token`` by profiling and Sequoia its tree size and depth from measured timings in the same spirit; the
cost model is in ``docs/design/algorithm.md`` ("sizing trees to the device").

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

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .level_expansion import NEG_INF, DraftPool, node_values, rank_desc

__all__ = [
    "RoundCost",
    "best_count",
    "cheapest_at_least",
    "cost_cut",
    "expected_yield",
    "interpolate",
    "level_pays",
    "next_level_can_pay",
    "RankedNodes",
]


def cheapest_at_least(ms: Sequence[float]) -> tuple[list[float], list[int]]:
    """Suffix minimum of a measured cost curve: what a forward of each size costs when it may be padded.

    Host-side (a start-up curve, not a per-step path).

    Args:
        ms: ``Q`` measured (or interpolated) costs of a forward of size ``q = 0..Q-1``.

    Returns:
        ``(price, run)``, each of length ``Q``: ``run[q] >= q`` is the size to run instead of ``q`` (the smallest
        of the cheapest), ``price[q] = ms[run[q]]``; ``price`` is non-decreasing.

    >>> cheapest_at_least([60.0, 100.0, 119.0, 87.0, 91.0, 84.0, 84.0])
    ([60.0, 84.0, 84.0, 84.0, 84.0, 84.0, 84.0], [0, 5, 5, 5, 5, 5, 6])
    """
    price, run = list(ms), list(range(len(ms)))
    for q in range(len(ms) - 2, -1, -1):  # strict <: the smaller size on ties
        if price[q + 1] < price[q]:
            price[q], run[q] = price[q + 1], run[q + 1]
    return price, run


@dataclass(frozen=True, slots=True)
class RoundCost:
    """Measured cost of a round's parts on one device, for one batch size.

    Attributes:
        verify_ms: ``[Q]`` float32, non-decreasing; ``verify_ms[q]`` is one target forward over ``q`` draft nodes
            plus the root per request (``q = 0`` is a plain decoding step).  Counts past ``Q - 1`` cost
            ``verify_ms[-1]`` (callers measure up to the largest tree they build).
        draft_ms: one draft forward (a level of the tree, or the catch-up).
        verify_run: host tuple, ``verify_run[q] >= q``: the node count to run a verify of ``q`` nodes at (padding
            ``verify_run[q] - q`` nodes); empty: no padding.
        draft_run: host tuple, ``draft_run[w] >= w``: the width to run a draft level of width ``w`` at; empty: no
            padding.
        level_ms: host time of one drafted level besides its forward (the policy's step and cut, the runtime's
            bookkeeping; measured by the runtime in its loop, ``price_level_host``), priced with each forward.
    """

    verify_ms: torch.Tensor
    draft_ms: float
    verify_run: tuple[int, ...] = ()
    draft_run: tuple[int, ...] = ()
    level_ms: float = 0.0

    def round_ms(self, forwards: int, nodes: int) -> torch.Tensor:
        """``[nodes + 1]`` cost of a round with ``forwards`` draft forwards (each with its level's host time) and
        ``q = 0..nodes`` verified nodes."""
        head = self.verify_ms[: nodes + 1]
        if head.shape[0] < nodes + 1:  # constant past the measured curve
            head = torch.cat([head, head[-1:].expand(nodes + 1 - head.shape[0])])
        return head + (self.draft_ms + self.level_ms) * forwards

    def verify_nodes(self, q: int) -> int:
        """The node count to run a verify of ``q`` draft nodes at (``q`` itself without padding)."""
        return self.verify_run[q] if q < len(self.verify_run) else q

    def draft_width(self, w: int) -> int:
        """The width to run a draft level of ``w`` tokens per request at (``w`` itself without padding)."""
        return self.draft_run[w] if w < len(self.draft_run) else w

    @staticmethod
    def from_samples(
        counts: list[int], ms: list[float], draft_ms: float, max_nodes: int, pad: bool = False,
        draft_widths: list[int] | None = None, draft_width_ms: list[float] | None = None,
    ) -> "RoundCost":  # fmt: skip
        """Interpolate timings measured at some node counts (sorted, starting at 0) to every ``q <= max_nodes``.

        Linear between samples, constant past the last one.  ``pad=False``: then made non-decreasing by its running
        maximum (timing noise otherwise makes the cut jump around).  ``pad=True``: priced by
        :func:`cheapest_at_least`, with the sizes to run kept in ``verify_run``; ``draft_widths`` /
        ``draft_width_ms`` (widths ``1..W`` measured, dense) give ``draft_run`` the same way.
        """
        curve = interpolate(counts, ms, max_nodes)
        if not pad:
            return RoundCost(torch.tensor(list(itertools.accumulate(curve, max)), dtype=torch.float32), float(draft_ms))
        price, run = cheapest_at_least(curve)
        draft_run: tuple[int, ...] = ()
        if draft_widths:
            wcurve = interpolate([0, *draft_widths], [0.0, *draft_width_ms], max(draft_widths))
            draft_run = tuple(cheapest_at_least(wcurve)[1])
        return RoundCost(torch.tensor(price, dtype=torch.float32), float(draft_ms), tuple(run), draft_run)


def interpolate(counts: list[int], ms: list[float], max_nodes: int) -> list[float]:
    """``ms`` at ``counts`` (sorted, starting at 0) for every ``q = 0..max_nodes``: linear between them, constant
    past the last."""
    out = []
    for q in range(max_nodes + 1):
        i = bisect.bisect_right(counts, q)
        if i >= len(counts):
            out.append(float(ms[-1]))
        else:
            x0, x1, y0, y1 = counts[i - 1], counts[i], ms[i - 1], ms[i]
            out.append(y0 + (q - x0) / (x1 - x0) * (y1 - y0))
    return out


def expected_yield(node_logp: torch.Tensor) -> torch.Tensor:
    """Expected tokens of a round (summed over the batch) if each request verifies its ``q`` most probable nodes.

    Args:
        node_logp: ``[B, N]`` joint draft log-probability of each draft node (root excluded), ``-inf`` where a
            request has no node.

    Returns:
        ``[N + 1]`` float32: ``B + sum_r sum_{i<q} p_r,(i)`` for ``q = 0..N``.
    """
    return _yield_of_sorted(torch.sort(node_logp.float(), dim=1, descending=True).values)


def _yield_of_sorted(ordered: torch.Tensor) -> torch.Tensor:
    """:func:`expected_yield` of ``ordered [B, N]``, each row already sorted in descending order."""
    per_q = torch.cumsum(ordered.float().exp(), 1).sum(0)  # exp(-inf) = 0
    return torch.cat([per_q.new_zeros(1), per_q]) + ordered.shape[0]


def _rates(ordered: torch.Tensor, round_ms: torch.Tensor) -> torch.Tensor:
    """``[M + 1]`` expected tokens per millisecond when every request verifies its ``q`` best nodes, ``q = 0..M``,
    from ``ordered [B, N]`` (rows sorted in descending order), ``M = min(N, len(round_ms) - 1)`` (a shorter
    ``round_ms`` prices no larger tree)."""
    m = min(ordered.shape[1], round_ms.shape[0] - 1)
    return _yield_of_sorted(ordered[:, :m]) / round_ms[: m + 1]


def best_count(node_logp: torch.Tensor, round_ms: torch.Tensor) -> torch.Tensor:
    """0-dim int64 ``q*``: the node count (per request) with the highest expected tokens per millisecond.

    Args:
        node_logp: ``[B, N]`` as in :func:`expected_yield`.
        round_ms: ``[N + 1]`` round cost for ``q = 0..N`` (:meth:`RoundCost.round_ms`).
    """
    ordered = torch.sort(node_logp.float(), dim=1, descending=True).values
    return torch.argmax(_rates(ordered, round_ms))  # first maximum: the smaller tree on ties


@dataclass(frozen=True, slots=True)
class RankedNodes:
    """A pool's draft nodes ranked by path value (one stable sort, shared by the cut and the look-ahead).

    Attributes (``[B, N]`` over the pool's draft nodes, root and trash column dropped):
        filled: bool, the slot holds a node.
        value: float32 path value ``joint`` (-inf where empty).
        ordered: each request's values in descending order.
        place: int64 each node's place in that order (0 = the most valuable; ties: the earlier node first), so
            ``filled & (place < q)`` is :func:`~sage_plugin.core.level_expansion.budget_top_n`'s ``q`` best (both rank with
            :func:`~sage_plugin.core.level_expansion.rank_desc`).
    """

    filled: torch.Tensor
    value: torch.Tensor
    ordered: torch.Tensor
    place: torch.Tensor

    @staticmethod
    def of(pool: DraftPool) -> RankedNodes:
        filled, value = node_values(pool)
        return RankedNodes(filled, value, *rank_desc(value))

    def cut(self, round_ms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cut [B, N] bool, rates [M + 1])``: each request's ``q*`` most valuable nodes, ``q*`` the first maximum
        of the rates (:func:`best_count`: the smaller tree on ties; one ``q*`` for the batch)."""
        rates = _rates(self.ordered, round_ms)
        return self.filled & (self.place < torch.argmax(rates)), rates

    def level_bound(self, at_level: torch.Tensor, next_round_ms: torch.Tensor) -> torch.Tensor:
        """0-dim: the best rate one more level could reach (:func:`next_level_can_pay`), ``at_level [B, N]`` the
        nodes of the deepest level drafted so far."""
        m = min(self.value.shape[1], next_round_ms.shape[0] - 1)
        virtual = torch.where(at_level, self.value, NEG_INF)
        # E'(q) for q <= m needs only the m largest values (sorted): a top-m instead of sorting all 2N
        top = torch.topk(torch.cat([self.value, virtual], 1), m, dim=1).values
        return _rates(top, next_round_ms).max()


def cost_cut(pool: DraftPool, round_ms: torch.Tensor) -> torch.Tensor:
    """``[B, P-1]`` bool over the pool's draft nodes (root and trash column dropped): the cost-optimal cut, i.e.
    each request's ``q*`` most probable nodes (:func:`best_count`; one ``q*`` for the batch)."""
    return RankedNodes.of(pool).cut(round_ms)[0]


def _at_level(pool: DraftPool, ranked: RankedNodes, level: int) -> torch.Tensor:
    return ranked.filled & (pool.depths[:, 1:-1] == level)


def next_level_can_pay(
    pool: DraftPool, level: int, round_ms: torch.Tensor, next_round_ms: torch.Tensor
) -> torch.Tensor:  # fmt: skip
    """0-dim bool: could one more draft level raise the best expected tokens per millisecond?

    The best rate now is ``max_q E(q) / round_ms[q]`` over the pool's nodes.  The next level's children of a node
    together have at most the node's own path probability, so the most the level can add is one virtual child per
    node of ``level`` carrying its parent's probability; with them the best rate is at most
    ``max_q E'(q) / next_round_ms[q]`` (``next_round_ms``: the round with one more draft forward).  When even that
    bound does not beat the rate now, the level cannot pay and drafting stops.

    Args:
        pool: the round's pool after ``level``'s step.
        level: the deepest level drafted so far.
        round_ms, next_round_ms: ``[N + 1]`` round cost for ``q = 0..N`` nodes with the forwards run so far and with
            one more (:meth:`RoundCost.round_ms`).

    Worked example (one request, 70 ms a round, a level 5 ms; nodes at levels 1-2 with probabilities .8, .5; the
    verify cost flat): now ``2.3 / 70 = .0329``; bound ``(2.3 + .5) / 75 = .0373``: the level may pay.  With the
    level-2 node at .04: now ``1.84 / 70 = .0263``, bound ``1.88 / 75 = .0251``: stop.
    """
    ranked = RankedNodes.of(pool)
    return ranked.level_bound(_at_level(pool, ranked, level), next_round_ms) > _rates(ranked.ordered, round_ms).max()


def level_pays(
    pool: DraftPool, level: int, round_ms: torch.Tensor, next_round_ms: torch.Tensor | None = None
) -> torch.Tensor:  # fmt: skip
    """0-dim bool: does the cost-optimal cut (:func:`cost_cut`) use a node of ``level``, and (``next_round_ms``
    given) could the next level's forward pay for itself (:func:`next_level_can_pay`)?  Both from one ranking of
    the pool: this runs once per drafted level, and its host time is part of that level's cost."""
    ranked = RankedNodes.of(pool)
    cut, rates = ranked.cut(round_ms)
    at_level = _at_level(pool, ranked, level)
    keep = (cut & at_level).any()
    if next_round_ms is None:
        return keep
    return keep & (ranked.level_bound(at_level, next_round_ms) > rates.max())
