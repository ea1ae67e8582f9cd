"""The naive oracle of SAGE's shape rules (Eq. 9-12 and the inclusion rule), one request, float64 Python.

Both fast paths are tested against these functions: the online tree policy (through
:func:`~tests.oracles.trees.build_tree_ref`) and the selection inside a fixed beam (through
:func:`~tests.oracles.beam.select_in_beam_ref`).  They are written as literally as possible, a loop
over candidates, independently of :mod:`sage_plugin.core.shape`.

:class:`Margin` records the smallest relative gap met in a decision that a float32-vs-float64 difference could
flip (a threshold comparison, a budget cut, a rounding; an exact tie in a top-k order), so a test can skip cases
whose outcome is numerically ambiguous.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from tests.oracles.layout import topk_confidence_ref

__all__ = ["Margin", "RefCand", "plan_ref", "round_ref", "sage_level_ref", "static_level_ref"]

_EPS_INT = 1e-6


def round_ref(x: float, mode: str) -> int:
    """``half_up``: floor(x + 0.5); ``ceil``/``floor`` with values within 1e-6 of an integer exact.

    >>> round_ref(2.5, "half_up"), round_ref(2.0000001, "ceil"), round_ref(1.9999999, "floor")
    (3, 2, 2)
    """
    if mode == "half_up":
        return math.floor(x + 0.5)
    nearest = round(x)
    if abs(x - nearest) < _EPS_INT:
        return int(nearest)
    return math.ceil(x) if mode == "ceil" else math.floor(x)


class Margin:
    """Smallest relative gap met by a decision that float rounding could flip."""

    def __init__(self) -> None:
        self.value = math.inf
        self.where = ""

    def note(self, gap: float, where: str) -> None:
        if gap < self.value:
            self.value, self.where = gap, where

    def ratio(self, a: float, b: float, where: str) -> None:
        """``a`` vs ``b`` (positive reals) compared or ordered: log-gap."""
        if a > 0.0 and b > 0.0:
            self.note(abs(math.log(a) - math.log(b)), where)

    def rounding(self, x: float, mode: str, where: str) -> None:
        """Distance of ``x`` to the value where ``round_ref(x, mode)`` jumps (exact hits are exact)."""
        boundary_frac = 0.5 if mode == "half_up" else 0.0
        y = x - boundary_frac
        dist = abs(y - round(y))
        if dist != 0.0:  # exactly on a boundary means both sides computed it exactly
            self.note(dist, where)


@dataclass(frozen=True)
class RefCand:
    """One candidate of a level, as the SAGE rule sees it (probabilities, not logs).

    Attributes:
        position: its place among the level's candidates (frontier slot, then rank): parent order, tie-break.
        rank: rank among its parent's children (0 = most likely).
        prob, prob_topk: its conditional draft probability (full softmax / top-k renormalised).
        joint, joint_topk: its path probability in either space.
        parent_prob, parent_prob_topk, parent_joint, parent_joint_topk: the same of its parent (root: 1).
    """

    position: int
    rank: int
    prob: float
    prob_topk: float
    joint: float
    joint_topk: float
    parent_prob: float = 1.0
    parent_prob_topk: float = 1.0
    parent_joint: float = 1.0
    parent_joint_topk: float = 1.0


def plan_ref(cfg, carried_alpha: float, root_probs: Sequence[float], d_max_cur: int, m: Margin, k: int | None = None):
    """SAGE's plan of one round: ``(depth, width, alpha, root_alpha)`` (Eq. 9-11 and open point 1).

    ``k`` (default ``cfg.k``) is the top-k of the confidence: a serving runtime that sees only its beam's ``t``
    root probabilities uses ``min(cfg.k, t)``.
    """
    root_alpha = topk_confidence_ref([root_probs], k or cfg.k)[0]
    if not cfg.use_entropy:
        alpha = cfg.alpha_init
    elif cfg.alpha_source == "fresh":
        alpha = root_alpha
    else:
        alpha = carried_alpha
    d_max = d_max_cur if cfg.use_history else cfg.d_max
    x_depth = cfg.d_min + alpha * (d_max - cfg.d_min)  # Eq. 10
    x_width = cfg.w_min + (1.0 - alpha) * (cfg.w_max - cfg.w_min)  # Eq. 11
    m.rounding(x_depth, cfg.rounding, "D rounding")
    m.rounding(x_width, cfg.rounding, "W rounding")
    depth = max(1, round_ref(x_depth, cfg.rounding))
    width = min(cfg.k, max(1, round_ref(x_width, cfg.rounding)))
    return depth, width, alpha, root_alpha


def sage_level_ref(cfg, level: int, cands: Sequence[RefCand], depth: int, width: int, num_kept: int, m: Margin):
    """The candidates SAGE keeps at ``level`` (those whose parent was kept and expanded), in priority order.

    A candidate of rank r is eligible iff ``r < W_l`` (``W`` at level 1, else ``round(W (0.5 + P_parent) / l)``,
    clamped to >= 1 if ``cfg.clamp_level_width``), its probability (its own, or its path's with
    ``threshold_on=joint``; full or top-k space) is ``> theta0 * l / D``, and ``l <= D``; with ``keep_top1`` the
    level-1 rank-0 child is always eligible.  Eligible candidates are kept best-first by (full) path probability
    (ties: earlier position), or in position order, while fewer than ``n_max`` draft nodes exist.

    Returns:
        the kept candidates (a list of :class:`RefCand`), highest priority first.
    """
    topk_space = cfg.prob_space == "topk"
    theta = cfg.theta0 * level / depth
    eligible = []
    for c in cands:
        if level == 1:
            w_l = width
        else:
            if cfg.parent_prob == "joint":
                p_parent = c.parent_joint_topk if topk_space else c.parent_joint
            else:
                p_parent = c.parent_prob_topk if topk_space else c.parent_prob
            x = width * (0.5 + p_parent) / level  # Eq. 12
            m.rounding(x, cfg.rounding, f"W_{level} rounding")
            w_l = round_ref(x, cfg.rounding)
            if cfg.clamp_level_width:
                w_l = max(1, w_l)
        if cfg.threshold_on == "joint":
            score = c.joint_topk if topk_space else c.joint
        else:
            score = c.prob_topk if topk_space else c.prob
        forced = cfg.keep_top1 and level == 1 and c.rank == 0
        if c.rank < w_l and not forced and theta > 0.0:
            m.ratio(score, theta, f"theta_{level} comparison")
        if (c.rank < w_l and score > theta and level <= depth) or forced:
            eligible.append(c)
    if cfg.budget_order == "best_first":
        eligible.sort(key=lambda c: (-c.joint, c.position))
    else:
        eligible.sort(key=lambda c: c.position)
    budget = cfg.n_max - num_kept
    if cfg.budget_order == "best_first" and 0 < budget < len(eligible):
        m.ratio(eligible[budget - 1].joint, eligible[budget].joint, "N_max budget cut")
    return eligible[: max(budget, 0)]


def static_level_ref(cands: Sequence[tuple[tuple[int, ...], RefCand]], static_tree) -> list[RefCand]:
    """The candidates whose rank path (first item of each pair) is in ``static_tree``, best-first by path
    probability (ties: earlier position)."""
    paths = {tuple(p) for p in static_tree}
    kept = [c for ranks, c in cands if ranks in paths]
    return sorted(kept, key=lambda c: (-c.joint, c.position))
