"""SAGE node selection inside a fixed draft beam and verify budget (SGLang's EAGLE v2 worker and alike).

A serving runtime with CUDA graphs drafts a fixed *beam*: ``steps`` draft forwards of ``topk`` nodes each, every
node proposing its ``topk`` most likely children, and verifies a fixed number ``n_select = N - 1`` of draft nodes
per request.  The draft compute is then fixed; what SAGE decides is **which** candidates form the verified tree.
:func:`select_shaped` applies the SAGE shape (the rules of :mod:`sage_plugin.core.shape`, the same functions the
online policy calls) to the candidates level by level, then fills the remaining budget with the most probable
other candidates (the nodes are verified at no extra cost: the shape is fixed):

1. level 1: keep the root's children with rank ``< W`` and probability ``> theta_1``;
2. level ``l <= D``: keep children of kept nodes with rank ``< W_l = round(W (0.5 + p_parent) / l)`` and
   probability ``> theta_l = theta0 * l / D`` (the node's own; its path's with ``threshold_on=joint``), at most
   ``n_max`` kept nodes in all (best-first or parent order);
3. a request in its first round (``static_first``, with ``first_round_static``) keeps instead the candidates whose
   rank path is in ``static_tree`` (the static tree's nodes the beam holds);
4. selection = the *pool* (``rerank_pool``), then the others, each by joint probability (depth breaks ties), first
   ``n_select``.  ``beam`` (default): every candidate is pooled, so the ``n_select`` most probable paths of the
   beam are verified (the reference engine's default rerank of SAGE's beam; in a fixed beam SAGE's W(alpha) cannot
   save draft forwards, so the whole beam is the pool, and SAGE's plan acts through the tier choice of
   :mod:`sage_plugin.serving.tiers` and the static first round); ``children``: the children of the root and of the kept
   nodes above the planned depth (Eq. 10-12 choose which nodes grow, to D(alpha)); ``kept``: the kept nodes (the
   paper's tree), then fill.  A first-round request (3.) pools the static tree's nodes whatever ``rerank_pool`` says.

Both groups are ancestor-closed (a pooled node's parent is pooled, or the root; a child's joint probability never
exceeds its parent's), so the selection is a tree.  Returned indices are ascending (parents first), as runtimes
expect.  The naive oracle is ``tests.oracles.beam.select_in_beam_ref``.

Candidate layout of EAGLE's beam (:func:`eagle_beam_candidates`), ``t = topk``, per request::

    index:   0 .. t-1           | t + (i-1) t^2 + j t + m   (step i >= 1, beam node j, child rank m)
    parent:  root               | parent_list[1 + (i-1) t + j]  (a candidate index, -1 = root)
    depth:   1                  | i + 1

Worked example (t = 2, steps = 2; the beam at step 1 is both root children)::

    candidates 0 (a, p .6)  1 (b, p .3)  |  2 (a->c .6*.9)  3 (a->d .6*.05)  4 (b->e .3*.5)  5 (b->f .3*.4)
    confident (alpha high: D = 2, W = 1, W_2 = round(1 * (0.5 + .6) / 2) = 1): kept {0, 2};
    rerank_pool kept, n_select = 3: fills with 1 (the best remaining)  ->  [0, 1, 2]
    rerank_pool beam, n_select = 3: the three best paths .6, .54, .3   ->  [0, 1, 2]
    rerank_pool beam, n_select = 2: .6, .54                            ->  [0, 2]  (kept 2 alike)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .params import SageParams
from .shape import LevelProbs, budget_key, in_prob_space, level_keep
from .tree import codes_of_choices, path_code

__all__ = ["BeamCandidates", "ShapedSelection", "eagle_beam_candidates", "select_shaped"]


@dataclass(frozen=True, slots=True)
class BeamCandidates:
    """Draft candidates of a fixed beam, ``M`` per request, in level order.

    Attributes:
        joint: ``[B, M]`` float, path probability (product of draft probabilities from the root).
        parent: ``[B, M]`` int64, candidate index of the parent, -1 for the root.
        rank: ``[B, M]`` int64, rank among its siblings (0 = the parent's most likely child).
        depth: ``[M]`` int64, level (1 = child of the root), non-decreasing.
        levels: number of levels (``depth[-1]``, kept as a Python int: no device sync).
        topk: the beam width ``t`` (children per beam node; host int).
    """

    joint: torch.Tensor
    parent: torch.Tensor
    rank: torch.Tensor
    depth: torch.Tensor
    levels: int
    topk: int


@dataclass(frozen=True, slots=True)
class ShapedSelection:
    """Result of :func:`select_shaped`.

    Attributes:
        index: ``[B, n_select]`` int64 candidate indices, ascending.
        shaped: ``[B]`` int64 number of selected candidates the SAGE shape kept (the static tree's in a first
            round).
    """

    index: torch.Tensor
    shaped: torch.Tensor


def eagle_beam_candidates(scores: torch.Tensor, parent_list: torch.Tensor, topk: int) -> BeamCandidates:
    """The candidates of EAGLE's beam from its flattened ``score_list`` and ``parent_list``.

    Args:
        scores: ``[B, M]``, ``M = t + (steps - 1) t^2``: the concatenated, flattened per-step joint scores.
        parent_list: ``[B, 1 + (steps - 1) t]``: ``-1`` then the candidate index of each step's beam node
            (``parent_list[c // t]`` is the parent of candidate ``c``).
        topk: ``t``.

    >>> c = eagle_beam_candidates(torch.tensor([[.6, .3, .54, .03, .15, .12]]), torch.tensor([[-1, 0, 1]]), 2)
    >>> c.parent.tolist(), c.rank.tolist(), c.depth.tolist()
    ([[-1, -1, 0, 0, 1, 1]], [[0, 1, 0, 1, 0, 1]], [1, 1, 2, 2, 2, 2])
    """
    m = scores.shape[1]
    idx = torch.arange(m, device=scores.device)
    parent = parent_list.index_select(1, idx // topk)
    rank = (idx % topk).expand_as(parent)
    depth = torch.where(idx < topk, 1, 2 + (idx - topk) // (topk * topk))
    return BeamCandidates(scores, parent, rank, depth, 1 + (m - topk) // (topk * topk), topk)


def select_shaped(
    cands: BeamCandidates,
    depth: torch.Tensor,
    width: torch.Tensor,
    n_select: int,
    cfg: SageParams,
    static_first: torch.Tensor | None = None,
) -> ShapedSelection:
    """Choose ``n_select`` candidates per request: the SAGE shape first, then the most probable others.

    Args:
        cands: the beam's candidates.
        depth: ``[B]`` int64 planned depth ``D`` (Eq. 10).
        width: ``[B]`` int64 planned width ``W`` (Eq. 11).
        n_select: nodes to verify per request (``<= M``).
        cfg: ``parent_prob``, ``threshold_on``, ``prob_space``, ``rounding``, ``clamp_level_width``,
            ``keep_top1``, ``budget_order``, ``theta0`` and ``n_max`` apply as in the online SAGE policy;
            ``rerank_pool`` (module docstring, 4.); ``static_tree`` for first-round requests.
        static_first: ``[B]`` bool, the request's first round keeps the static tree's nodes (None: no request).

    Returns:
        :class:`ShapedSelection`.
    """
    joint, parent = cands.joint.float(), cands.parent
    bsz, m = joint.shape
    has_parent = parent >= 0
    pidx = parent.clamp(min=0)
    parent_joint = torch.where(has_parent, joint.gather(1, pidx), torch.ones_like(joint))
    full = joint / parent_joint.clamp(min=1e-30)
    # top-k space: renormalise over the siblings the beam holds
    sib = torch.zeros(bsz, m + 1, device=joint.device).scatter_add_(1, parent + 1, full)
    local = in_prob_space(cfg, full, full / sib.gather(1, parent + 1).clamp(min=1e-30))
    key = budget_key(cfg, joint)
    par_local = torch.where(has_parent, local.gather(1, pidx), torch.ones_like(local))
    static = _static_mask(cands, cfg) if static_first is not None else None

    kept = torch.zeros(bsz, m, dtype=torch.bool, device=joint.device)
    joint_s = torch.ones_like(local)  # joint probability in the configured space, filled level by level
    for lvl in range(1, cands.levels + 1):
        at = (cands.depth == lvl)[None].expand(bsz, m)
        par_js = torch.where(has_parent, joint_s.gather(1, pidx), torch.ones_like(local))
        joint_s = torch.where(at, par_js * local, joint_s)
        parent_ok = torch.ones_like(kept) if lvl == 1 else has_parent & kept.gather(1, pidx)
        probs = LevelProbs(local, joint_s, par_local, par_js)
        kept |= level_keep(cfg, lvl, at & parent_ok, cands.rank, probs, key, depth, width, kept.sum(1))
    first = _pool(cfg.rerank_pool, kept, has_parent, pidx, cands.depth[None] <= depth[:, None])
    if static is not None:
        kept = torch.where(static_first[:, None], static, kept)
        first = torch.where(static_first[:, None], static, first)

    # selection order: the pool first, then joint probability (desc), then index (= depth order): parents first
    order = torch.sort(joint, dim=1, descending=True, stable=True).indices
    order = order.gather(
        1, torch.sort(first.gather(1, order).to(torch.int8), dim=1, descending=True, stable=True).indices
    )
    index = torch.sort(order[:, :n_select], dim=1).values
    return ShapedSelection(index, kept.gather(1, index).sum(1))


def _pool(
    rerank_pool: str, kept: torch.Tensor, has_parent: torch.Tensor, pidx: torch.Tensor, planned: torch.Tensor
) -> torch.Tensor:
    """``[B, M]`` bool: the candidates ranked before the others (``rerank_pool``): ``kept`` the SAGE shape's nodes;
    ``children`` the children of the nodes the shape grows (the root, and kept nodes above the planned depth D:
    ``planned`` is ``[B, M]`` depth <= D); ``beam`` every candidate (the beam is the pool)."""
    if rerank_pool == "kept":
        return kept
    if rerank_pool == "children":
        return planned & (~has_parent | kept.gather(1, pidx))
    return torch.ones_like(kept)


def _static_mask(cands: BeamCandidates, cfg: SageParams) -> torch.Tensor:
    """``[B, M]`` bool: candidates whose rank path is in ``cfg.static_tree`` (ancestor-closed: a candidate's parent
    is a beam node, itself a candidate, and the static tree is closed under prefixes)."""
    base = max(cfg.k, cands.topk)  # a code base above every rank keeps codes unique
    codes = torch.zeros_like(cands.rank)
    has_parent = cands.parent >= 0
    for lvl in range(1, cands.levels + 1):  # parents are one level up: their codes are final
        par = torch.where(has_parent, codes.gather(1, cands.parent.clamp(min=0)), 0)
        codes = torch.where((cands.depth == lvl)[None], path_code(par, cands.rank, base), codes)
    # one compare per static path with a host int: a tensor of the codes would be a host -> device copy every step,
    # which CUDA graph capture refuses (SGLang captures this selection in its draft step)
    return torch.stack([codes == c for c in codes_of_choices(cfg.static_tree, base)]).any(0)
