"""Naive per-request tree building for every registered policy (the oracle of :mod:`sage_plugin.core.policies`).

Level-synchronous, like the batched policies: at level ``l`` every frontier node (in insertion order) proposes its
top-k children; the policy keeps some (inserted into the tree in decreasing priority) and expands some (the next
frontier, in insertion order).  Only the "online" topology is modelled (``cfg.topology`` is not read).

* **sage** (non-static rounds): :func:`~.rules.sage_level_ref`, kept nodes expanded while ``l < D``; the first
  round uses ``cfg.static_tree`` when ``cfg.first_round_static``; with ``rerank_nodes`` N, finally the N best
  nodes by joint (as eagle2's rerank).  With ``rerank_pool`` ``children`` / ``beam`` (non-static rounds) every
  candidate is kept, in priority order; ``children`` expands those SAGE's rule keeps (``n_max`` counting the nodes
  drafted so far), ``beam`` the ``W`` best by joint down to the deepest level; in every round the frontier is then
  cut to its nodes among the N best drafted so far (ties: earlier node), at most ``max(k, static width)``
  (N = ``rerank_nodes``, or ``n_max`` when 0);
* **static**: :func:`~.rules.static_level_ref`, expanding a node iff its rank path is a proper prefix of one;
* **chain**: keep rank 0, expand while ``l < chain_depth``;
* **eagle2**: keep every candidate; expand the k best by joint among the level's candidates while
  ``l < eagle_depth``; finally keep the ``eagle_total_tokens`` best nodes by joint (ties: earlier node), in their
  original order.
* **topn**: if ``l >= 2`` and the sum of the ``N`` largest node joints over levels ``< l`` exceeds the same sum over
  levels ``< l - 1`` by no more than ``topn_threshold``, keep nothing; else keep (and expand while
  ``l < topn_max_depth``) the ``N = topn_nodes`` best candidates by joint; finally keep the ``N`` best nodes.

:data:`SELECTORS` maps each policy name to its level selection; a test checks it covers the policy registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from tests.oracles.layout import as_list, topk_confidence_ref
from tests.oracles.rules import Margin, RefCand, plan_ref, sage_level_ref, static_level_ref

__all__ = ["SELECTORS", "RefNode", "RefTree", "build_tree_ref"]


@dataclass
class RefNode:
    """One node of a reference tree.

    Attributes:
        path: draft tokens from the root's child down to this node (root: ``()``).
        ranks: rank path (root: ``()``).
        token: token id.
        parent: index of the parent in :attr:`RefTree.nodes` (-1 root).
        depth: root 0.
        prob: full-softmax conditional draft probability given the parent (root 1).
        prob_topk: top-k renormalised conditional probability (root 1).
        joint: product of ``prob`` along the path (root 1).
        joint_topk: product of ``prob_topk`` along the path.
        conf: confidence alpha of the node's own draft distribution, None if never drafted.
    """

    path: tuple[int, ...]
    ranks: tuple[int, ...]
    token: int
    parent: int
    depth: int
    prob: float = 1.0
    prob_topk: float = 1.0
    joint: float = 1.0
    joint_topk: float = 1.0
    conf: float | None = None

    @property
    def rank(self) -> int:
        return self.ranks[-1] if self.ranks else -1


@dataclass
class RefTree:
    """A reference tree (level order) plus the round's plan and the decision margin."""

    nodes: list[RefNode]
    depth: int
    width: int
    alpha: float
    root_alpha: float
    first_round: bool
    margin: float = math.inf
    margin_where: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def paths(self) -> frozenset[tuple[int, ...]]:
        """Token paths of the draft nodes (root excluded): an order-independent view."""
        return frozenset(n.path for n in self.nodes[1:])

    @property
    def tokens(self) -> list[int]:
        return [n.token for n in self.nodes]

    @property
    def parents(self) -> list[int]:
        return [n.parent for n in self.nodes]

    @property
    def depths(self) -> list[int]:
        return [n.depth for n in self.nodes]

    def triples(self) -> frozenset[tuple[tuple[int, ...], int, int]]:
        """``(parent path, token, depth)`` of every draft node."""
        return frozenset((n.path[:-1], n.token, n.depth) for n in self.nodes[1:])

    def ambiguous(self, tol: float = 1e-4) -> bool:
        """True when some decision was within ``tol`` (relative) of flipping."""
        return self.margin < tol


@dataclass
class _Level:
    """One level's proposals: ``(position, node)`` pairs in frontier order, and the round's plan."""

    cands: list[tuple[int, RefNode]]
    nodes: list[RefNode]
    level: int
    depth: int
    width: int


#: ``(cfg, level, m) -> [(node, expand)]`` in priority order
Selector = Callable[..., list[tuple[RefNode, bool]]]


def _as_cand(pos: int, c: RefNode, parent: RefNode) -> RefCand:
    return RefCand(
        pos, c.rank, c.prob, c.prob_topk, c.joint, c.joint_topk,
        parent.prob, parent.prob_topk, parent.joint, parent.joint_topk,
    )  # fmt: skip


def _select_sage(cfg, lv: _Level, m: Margin) -> list[tuple[RefNode, bool]]:
    by_pos = {pos: c for pos, c in lv.cands}
    refs = [_as_cand(pos, c, lv.nodes[c.parent]) for pos, c in lv.cands]
    kept = sage_level_ref(cfg, lv.level, refs, lv.depth, lv.width, len(lv.nodes) - 1, m)
    return [(by_pos[c.position], lv.level < lv.depth) for c in kept]


def _pool(cfg) -> str:
    """The pool SAGE builds: the planned replay keeps its planned tree whatever ``rerank_pool`` says."""
    return "kept" if cfg.topology == "planned" else cfg.rerank_pool


def _select_sage_pool(cfg, lv: _Level, m: Margin) -> list[tuple[RefNode, bool]]:
    """``rerank_pool`` children / beam: every candidate, in priority order, with SAGE's or the beam's expansion."""
    if cfg.budget_order == "best_first":
        ordered = sorted(lv.cands, key=lambda item: (-item[1].joint, item[0]))
    else:
        ordered = sorted(lv.cands, key=lambda item: item[0])
    if _pool(cfg) == "beam":
        beam = sorted(lv.cands, key=lambda item: (-item[1].joint, item[0]))
        if len(beam) > lv.width:
            m.ratio(beam[lv.width - 1][1].joint, beam[lv.width][1].joint, "beam cut")
        grow = {pos for pos, _ in beam[: lv.width]} if lv.level < lv.depth else set()
    else:
        refs = [_as_cand(pos, c, lv.nodes[c.parent]) for pos, c in lv.cands]
        drafted = sum(n.conf is not None for n in lv.nodes) - 1
        kept = sage_level_ref(cfg, lv.level, refs, lv.depth, lv.width, drafted, m)
        grow = {c.position for c in kept} if lv.level < lv.depth else set()
    return [(c, pos in grow) for pos, c in ordered]


def _in_top_ref(nodes: list[RefNode], frontier: list[int], total: int, width: int, m: Margin) -> list[int]:
    """The first ``width`` frontier nodes among the ``total`` best draft nodes by joint (ties: earlier node)."""
    order = sorted(range(1, len(nodes)), key=lambda i: (-nodes[i].joint, i))
    if len(order) > total:
        m.ratio(nodes[order[total - 1]].joint, nodes[order[total]].joint, "pool top-N cut")
    top = set(order[:total])
    return [i for i in frontier if i in top][:width]


def _select_static(cfg, lv: _Level, m: Margin) -> list[tuple[RefNode, bool]]:
    by_pos = {pos: c for pos, c in lv.cands}
    kept = static_level_ref([(c.ranks, _as_cand(pos, c, lv.nodes[c.parent])) for pos, c in lv.cands], cfg.static_tree)
    internal = {tuple(p[:-1]) for p in cfg.static_tree if len(p) > 1}
    return [(by_pos[c.position], by_pos[c.position].ranks in internal) for c in kept]


def _select_chain(cfg, lv: _Level, m: Margin) -> list[tuple[RefNode, bool]]:
    return [(c, lv.level < cfg.chain_depth) for _, c in lv.cands if c.rank == 0]


def _select_eagle2(cfg, lv: _Level, m: Margin) -> list[tuple[RefNode, bool]]:
    kept = sorted(lv.cands, key=lambda item: (-item[1].joint, item[0]))
    if len(kept) > cfg.k:
        m.ratio(kept[cfg.k - 1][1].joint, kept[cfg.k][1].joint, "eagle2 expansion cut")
    return [(c, i < cfg.k and lv.level < cfg.eagle_depth) for i, (_, c) in enumerate(kept)]


def _top_mass_ref(nodes: list[RefNode], below: int, n: int) -> float:
    return sum(sorted((x.joint for x in nodes[1:] if 1 <= x.depth < below), reverse=True)[:n])


def _select_topn(cfg, lv: _Level, m: Margin) -> list[tuple[RefNode, bool]]:
    n = cfg.topn_nodes
    if lv.level >= 2:
        gain = _top_mass_ref(lv.nodes, lv.level, n) - _top_mass_ref(lv.nodes, lv.level - 1, n)
        if gain > 0.0 and cfg.topn_threshold > 0.0:
            m.ratio(gain, cfg.topn_threshold, "topn growth threshold")
        if gain <= cfg.topn_threshold:
            return []
    kept = sorted(lv.cands, key=lambda item: (-item[1].joint, item[0]))
    if len(kept) > n:
        m.ratio(kept[n - 1][1].joint, kept[n][1].joint, "topn level cut")
    return [(c, lv.level < cfg.topn_max_depth) for _, c in kept[:n]]


#: policy name -> its naive level selection
SELECTORS: dict[str, Selector] = {
    "sage": _select_sage,
    "static": _select_static,
    "chain": _select_chain,
    "eagle2": _select_eagle2,
    "topn": _select_topn,
}


def _topk_ref(probs: Sequence[float], k: int, m: Margin) -> list[tuple[int, float]]:
    """``(token, prob)`` of the k most likely tokens, by decreasing probability (ties: lower id).

    The batched code ranks the very same input numbers, so only an exact tie (whose order is an implementation
    detail of ``torch.topk``) makes the ranks ambiguous.
    """
    order = sorted(range(len(probs)), key=lambda t: (-probs[t], t))
    head = order[: k + 1]
    for a, b in zip(head, head[1:], strict=False):
        if probs[a] == probs[b] and probs[b] > 0.0:
            m.note(0.0, "draft top-k tie")
    return [(t, probs[t]) for t in order[:k]]


def _calibrated_ref(table, p: float, alpha: float, m: Margin) -> float:
    """``table[alpha bin][probability bin]`` (:mod:`sage_plugin.core.calibration`); near a bin edge: ambiguous."""
    for x, bins in ((alpha, len(table)), (p, len(table[0]))):
        if abs(x * bins - round(x * bins)) < 1e-5 * bins and 0 < round(x * bins) < bins:
            m.note(0.0, "calibration bin edge")
    row = min(max(int(alpha * len(table)), 0), len(table) - 1)
    col = min(max(int(p * len(table[0])), 0), len(table[0]) - 1)
    return table[row][col]


def _propose(
    nodes, frontier, root_probs, draft_fn, k: int, level: int, m: Margin, calibration=()
) -> list[tuple[int, RefNode]]:
    """Top-k children of every frontier node, in frontier order: ``(position = slot * k + rank, node)``; a node's
    joint is its parent's times its probability, or times its calibrated value with a ``calibration`` table."""
    cands = []
    for pos, u in enumerate(frontier):
        parent = nodes[u]
        probs = root_probs if u == 0 else [float(p) for p in as_list(draft_fn(parent.path))]
        parent.conf = topk_confidence_ref([probs], k)[0]
        top = _topk_ref(probs, k, m)
        mass = sum(p for _, p in top)
        for rank, (tok, p) in enumerate(top):
            if p <= 0.0:
                continue  # impossible token: not a candidate
            factor = _calibrated_ref(calibration, p, parent.conf, m) if calibration else p
            node = RefNode(
                parent.path + (tok,), parent.ranks + (rank,), tok, u, level,
                p, p / mass, parent.joint * factor, parent.joint_topk * (p / mass),
            )  # fmt: skip
            cands.append((pos * k + rank, node))
    return cands


def _rerank(nodes: list[RefNode], total: int, m: Margin) -> list[RefNode]:
    """The ``total`` best draft nodes by joint (ties: earlier node) in their original order, parents re-indexed."""
    order = sorted(range(1, len(nodes)), key=lambda i: (-nodes[i].joint, i))
    m.ratio(nodes[order[total - 1]].joint, nodes[order[total]].joint, "rerank cut")
    remap = {0: 0}
    out = [nodes[0]]
    for i in sorted(order[:total]):
        assert nodes[i].parent in remap, "joint probability must not increase along a path"
        remap[i] = len(out)
        n = nodes[i]
        out.append(
            RefNode(
                n.path, n.ranks, n.token, remap[n.parent], n.depth, n.prob, n.prob_topk, n.joint, n.joint_topk, n.conf
            )
        )
    return out


def build_tree_ref(
    cfg,
    root_token: int,
    root_probs: Sequence[float],
    draft_fn: Callable[[tuple[int, ...]], Sequence[float]],
    state_alpha: float,
    d_max_cur: int,
    first_round: bool,
) -> RefTree:
    """Naive per-request tree builder for ``cfg.policy`` (see the module docstring for each policy's rule).

    Args:
        cfg: a :class:`~sage_plugin.config.SageConfig`.
        root_token: the root's token.
        root_probs: draft distribution after the root (full vocabulary).
        draft_fn: ``draft_fn(path) -> probabilities`` for a node whose token path (root's child first, root
            excluded) is ``path``; deterministic.
        state_alpha: the request's carried alpha (lag-1 / path-mean sources).
        d_max_cur: the request's current ``D_max`` (history controller).
        first_round: the request has not finished a round yet.

    Returns:
        The :class:`RefTree` (nodes in level order: parents before children).
    """
    m = Margin()
    root_probs = [float(p) for p in as_list(root_probs)]
    root_alpha = topk_confidence_ref([root_probs], cfg.k)[0]
    static_first = bool(first_round and cfg.policy == "sage" and cfg.first_round_static)
    if cfg.policy == "sage":
        depth, width, alpha, _ = plan_ref(cfg, state_alpha, root_probs, d_max_cur, m)
        static_depth = max(len(p) for p in cfg.static_tree)
        if static_first:
            depth = static_depth
        elif _pool(cfg) == "beam":
            depth = max(cfg.beam_depth, static_depth if cfg.first_round_static else 0)  # the beam's own depth
    else:
        sizes = {"eagle2": cfg.eagle_depth, "chain": cfg.chain_depth, "static": max(len(p) for p in cfg.static_tree),
                 "topn": cfg.topn_max_depth}  # fmt: skip
        depth, width, alpha = sizes[cfg.policy], cfg.k, state_alpha
    select = SELECTORS["static" if static_first else cfg.policy]
    pooled = cfg.policy == "sage" and _pool(cfg) != "kept"
    if pooled and not static_first:
        select = _select_sage_pool
    static_widths = [sum(len(p) == d for p in cfg.static_tree) for d in range(1, 65)]
    frontier_width = max(cfg.k, max(static_widths) if cfg.first_round_static else 0)

    nodes = [RefNode(path=(), ranks=(), token=int(root_token), parent=-1, depth=0)]
    frontier, level = [0], 0
    while frontier:
        level += 1
        calibration = cfg.calibration if cfg.policy == "sage" else ()
        cands = _propose(nodes, frontier, root_probs, draft_fn, cfg.k, level, m, calibration)
        frontier = []
        for node, grow in select(cfg, _Level(cands, nodes, level, depth, width), m):
            nodes.append(node)
            if grow:
                frontier.append(len(nodes) - 1)
        if pooled:
            frontier = _in_top_ref(nodes, frontier, cfg.rerank_nodes or cfg.n_max, frontier_width, m)
    sage_total = cfg.rerank_nodes or (cfg.n_max if pooled else None)
    total = {"eagle2": cfg.eagle_total_tokens, "topn": cfg.topn_nodes, "sage": sage_total}.get(cfg.policy)
    if total is not None and len(nodes) - 1 > total:
        nodes = _rerank(nodes, total, m)
    return RefTree(nodes, depth, width, alpha, root_alpha, static_first, m.value, m.where)
