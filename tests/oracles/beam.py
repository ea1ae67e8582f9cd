"""Naive reference of SAGE's selection inside a fixed draft beam (the oracle of :mod:`sage_plugin.core.beam_selection`)."""

from __future__ import annotations

from typing import Sequence

from tests.oracles.rules import Margin, RefCand, sage_level_ref, static_level_ref

__all__ = ["select_in_beam_ref"]


def select_in_beam_ref(
    cfg,
    joint: Sequence[float],
    parent: Sequence[int],
    rank: Sequence[int],
    depth: Sequence[int],
    d_plan: int,
    w_plan: int,
    n_select: int,
    static_first: bool = False,
    margin: Margin | None = None,
) -> tuple[list[int], int]:
    """One request's beam: ``(selected candidate indices ascending, number kept by the SAGE shape)``.

    Candidates ``c`` (level order) have path probability ``joint[c]``, parent candidate ``parent[c]`` (-1 = root),
    rank ``rank[c]`` among its siblings and level ``depth[c]``.  A candidate's own probability is
    ``joint[c] / joint[parent]``; its top-k one is renormalised over the siblings the beam holds.  Level by level the
    SAGE rule (:func:`~.rules.sage_level_ref`) keeps candidates whose parent was kept; a first-round request keeps
    the static tree's rank paths instead (:func:`~.rules.static_level_ref`).  The pool comes first, then the
    others, each by path probability (ties: lower index), and the first ``n_select`` are selected; the pool is the
    kept nodes (``rerank_pool`` kept, or a first round), the children of the root and of the kept nodes above the
    planned depth (``children``) or every candidate (``beam``).  The count returned is of the selected nodes that
    were kept.

    ``margin`` (optional) records the closest call float rounding could flip (a threshold met exactly, as
    ``theta0 * l / D`` = 0.3 / 3 against a top-k probability of 0.1); callers skip such cases.
    """
    m_ = Margin() if margin is None else margin
    m = len(joint)
    local = [joint[c] / (joint[parent[c]] if parent[c] >= 0 else 1.0) for c in range(m)]
    sums: dict[int, float] = {}
    for c in range(m):
        sums[parent[c]] = sums.get(parent[c], 0.0) + local[c]
    local_topk = [local[c] / sums[parent[c]] for c in range(m)]
    joint_topk = [0.0] * m
    ranks: list[tuple[int, ...]] = [()] * m
    for c in range(m):  # parents precede children
        p = parent[c]
        joint_topk[c] = (joint_topk[p] if p >= 0 else 1.0) * local_topk[c]
        ranks[c] = (ranks[p] if p >= 0 else ()) + (rank[c],)

    def cand(c: int) -> RefCand:
        p = parent[c]
        if p < 0:
            return RefCand(c, rank[c], local[c], local_topk[c], joint[c], joint_topk[c])
        return RefCand(
            c,
            rank[c],
            local[c],
            local_topk[c],
            joint[c],
            joint_topk[c],
            local[p],
            local_topk[p],
            joint[p],
            joint_topk[p],
        )

    kept: list[int] = []
    if static_first:
        kept = [c.position for c in static_level_ref([(ranks[c], cand(c)) for c in range(m)], cfg.static_tree)]
    else:
        for lvl in range(1, max(depth) + 1):
            level = [cand(c) for c in range(m) if depth[c] == lvl and (parent[c] < 0 or parent[c] in kept)]
            kept += [c.position for c in sage_level_ref(cfg, lvl, level, d_plan, w_plan, len(kept), m_)]
    if static_first or cfg.rerank_pool == "kept":
        pool = set(kept)
    elif cfg.rerank_pool == "children":
        pool = {c for c in range(m) if depth[c] <= d_plan and (parent[c] < 0 or parent[c] in kept)}
    else:  # beam: every candidate
        pool = set(range(m))
    order = sorted(range(m), key=lambda c: (c not in pool, -joint[c], c))
    chosen = sorted(order[:n_select])
    return chosen, sum(c in kept for c in chosen)
