"""Slow, obviously-correct per-request reference implementations (test oracles).

Every function here handles **one request** with plain Python lists and float64 arithmetic, in the
most literal loop form of the rule it implements, so that the batched tensor code in
:mod:`sage_plugin.core` can be checked against it.  Nothing here is meant to be fast and nothing
here is used at runtime.  Imports: the standard library and torch (only to accept tensors).

Conventions shared with the batched code:

* a tree is a list of nodes in level order, node 0 the root, ``parents[i] < i``, ``-1`` for the
  root (and for padding where a padded row is passed);
* "top-k" of a distribution is ordered by decreasing probability, ties by lower token id;
* rounding ``half_up`` is ``floor(x + 1/2)``; ``ceil`` / ``floor`` treat a value within ``1e-6`` of
  an integer as that integer (the batched code does the same).

The tree builder :func:`build_tree_ref` also records the smallest relative gap it met in any
decision that a tiny float32-vs-float64 difference could flip (a threshold comparison, a budget
cut, a rounding; an exact tie in a top-k order): ``RefTree.margin``.  A comparison against the batched builder is
only meaningful when that margin is not tiny (see :meth:`RefTree.ambiguous`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

__all__ = [
    "topk_entropy_ref",
    "topk_confidence_ref",
    "ancestor_mask_ref",
    "positions_ref",
    "retrieve_arrays_ref",
    "greedy_verify_ref",
    "process_logits_ref",
    "rejection_verify_one",
    "round_ref",
    "RefNode",
    "RefTree",
    "build_tree_ref",
    "HistoryRef",
    "history_init_ref",
    "history_update_ref",
    "RefState",
    "init_state_ref",
    "observe_ref",
    "children_ref",
]


def _list(x) -> list:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().tolist()
    return list(x)


# ----------------------------------------------------------------------------------------------
# Entropy / confidence (SAGE Eq. 7-9)
# ----------------------------------------------------------------------------------------------


def topk_entropy_ref(probs: Sequence[float], k: int) -> float:
    """Entropy (nats) of the top-k renormalised distribution, by hand.

    ``probs`` are non-negative weights (they need not sum to 1: Eq. 7 renormalises).

    >>> round(topk_entropy_ref([0.25, 0.25, 0.25, 0.25, 0.0], 4), 4)
    1.3863
    """
    top = sorted((float(p) for p in probs), reverse=True)[:k]  # Top_k
    total = sum(top)
    entropy = 0.0
    for p in top:
        q = p / total  # Eq. 7
        if q > 0.0:
            entropy -= q * math.log(q)  # Eq. 8 (0 log 0 = 0)
    return entropy


def topk_confidence_ref(probs_list: Sequence[Sequence[float]], k: int) -> list[float]:
    """``alpha = 1 - H / log k`` (Eq. 9) for each probability vector of ``probs_list``.

    >>> [round(a, 6) for a in topk_confidence_ref([[1.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]], 3)]
    [1.0, 0.0]
    """
    out = []
    for probs in probs_list:
        alpha = 1.0 - topk_entropy_ref(_list(probs), k) / math.log(k)
        out.append(min(1.0, max(0.0, alpha)))
    return out


# ----------------------------------------------------------------------------------------------
# Tree layout
# ----------------------------------------------------------------------------------------------


def children_ref(parents: Sequence[int]) -> list[list[int]]:
    """Children of every node, in increasing node order."""
    parents = _list(parents)
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    return kids


def ancestor_mask_ref(parents: Sequence[int]) -> list[list[bool]]:
    """``mask[i][j]`` is True iff ``j == i`` or ``j`` is an ancestor of ``i`` (walk the parents).

    >>> [[int(v) for v in row] for row in ancestor_mask_ref([-1, 0, 0, 1])]
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    """
    parents = _list(parents)
    n = len(parents)
    mask = [[False] * n for _ in range(n)]
    for i in range(n):
        j = i
        while j >= 0:
            mask[i][j] = True
            assert parents[j] < j, "parents must precede their children"
            j = parents[j]
    return mask


def positions_ref(depths: Sequence[int], prefix_len: int) -> list[int]:
    """Position id of each node: ``prefix_len + depth`` (padding, depth -1, gets the root's)."""
    return [prefix_len + (d if d >= 0 else 0) for d in _list(depths)]


def retrieve_arrays_ref(
    parents: Sequence[int], num_nodes: int, batch_index: int = 0
) -> tuple[list[int], list[int], list[int]]:
    """SGLang ``(retrieve_index, retrieve_next_token, retrieve_next_sibling)`` of one padded row.

    First child = the smallest-index child; next sibling = the next larger-index child of the same
    parent; ``retrieve_index[i] = batch_index * N + i`` on real nodes; -1 everywhere else.
    """
    parents = _list(parents)
    n = len(parents)
    index = [batch_index * n + i if i < num_nodes else -1 for i in range(n)]
    next_token = [-1] * n
    next_sibling = [-1] * n
    for u in range(num_nodes):
        kids = [c for c in range(num_nodes) if parents[c] == u]
        if kids:
            next_token[u] = kids[0]
        for a, b in zip(kids, kids[1:], strict=False):
            next_sibling[a] = b
    return index, next_token, next_sibling


# ----------------------------------------------------------------------------------------------
# Verification
# ----------------------------------------------------------------------------------------------


def greedy_verify_ref(
    tokens: Sequence[int], parents: Sequence[int], target_argmax: Sequence[int]
) -> tuple[list[int], int, int, list[int]]:
    """Greedy tree verification of one request's real nodes (no padding).

    From the root, move to the child whose token equals the target's argmax after the current
    node, while one exists (siblings are assumed to carry distinct tokens).

    Returns:
        ``(accepted node list root-first, tau, bonus, emitted tokens)`` where ``emitted`` is the
        ``tau`` accepted draft tokens followed by the bonus.

    >>> greedy_verify_ref([7, 1, 2, 3, 4], [-1, 0, 0, 1, 3], [1, 3, 9, 5, 6])
    ([0, 1, 3], 2, 5, [1, 3, 5])
    """
    tokens, parents, target_argmax = _list(tokens), _list(parents), _list(target_argmax)
    kids = children_ref(parents)
    path = [0]
    u = 0
    while True:
        match = [c for c in kids[u] if tokens[c] == target_argmax[u]]
        if not match:
            break
        u = match[0]
        path.append(u)
    bonus = target_argmax[u]
    return path, len(path) - 1, bonus, [tokens[i] for i in path[1:]] + [bonus]


def process_logits_ref(
    logits: Sequence[float], temperature: float, top_k: int | None = None, top_p: float | None = None
) -> list[float]:
    """Target sampling distribution of one row: temperature, then top-k, then top-p.

    * top-k keeps every token whose logit is >= the k-th largest logit (``top_k <= 0`` or
      ``>= V`` disables);
    * top-p keeps the smallest prefix of the tokens sorted by decreasing probability whose mass
      reaches ``top_p`` (a token is kept iff the mass strictly before it is < top_p);
      ``top_p >= 1`` disables it.
    """
    z = [float(x) / float(temperature) for x in _list(logits)]
    vocab = len(z)
    if top_k is not None and 0 < top_k < vocab:
        kth = sorted(z, reverse=True)[top_k - 1]
        z = [x if x >= kth else -math.inf for x in z]
    m = max(z)
    e = [math.exp(x - m) if x != -math.inf else 0.0 for x in z]
    total = sum(e)
    p = [x / total for x in e]
    if top_p is not None and top_p < 1.0:
        order = sorted(range(vocab), key=lambda i: (-p[i], i))
        kept, mass = set(), 0.0
        for i in order:
            if mass >= top_p:
                break
            kept.add(i)
            mass += p[i]
        p = [p[i] if i in kept else 0.0 for i in range(vocab)]
        total = sum(p)
        p = [x / total for x in p]
    return p


def _sample(p: Sequence[float], rng: random.Random) -> int:
    total = sum(p)
    u = rng.random() * total
    acc = 0.0
    last = max(i for i, x in enumerate(p) if x > 0)
    for i, x in enumerate(p):
        acc += x
        if x > 0 and u < acc:
            return i
    return last


def rejection_verify_one(
    tokens: Sequence[int], parents: Sequence[int], probs_per_node: Sequence[Sequence[float]], rng: random.Random
) -> list[int]:
    """The literal recursive rejection sampling over deterministic children (one request).

    At the accepted node ``u`` with target distribution ``p``: for each child ``c`` in node order,
    accept it with probability ``p[token c] / sum(p)`` (the current residual, renormalised); on
    rejection set ``p[token c] = 0``.  If every child is rejected, draw the bonus from the
    residual and stop; if ``c`` is accepted, continue at ``c`` with ITS target distribution.

    Args:
        tokens, parents: the tree's real nodes (level order, root first).
        probs_per_node: processed target distribution after every node.
        rng: a ``random.Random``.

    Returns:
        The emitted tokens: accepted draft tokens, then the bonus.
    """
    tokens, parents = _list(tokens), _list(parents)
    kids = children_ref(parents)
    emitted: list[int] = []
    u = 0
    while True:
        p = [float(x) for x in _list(probs_per_node[u])]
        accepted = None
        for c in kids[u]:
            residual = sum(p)
            if rng.random() < p[tokens[c]] / residual:
                accepted = c
                break
            p[tokens[c]] = 0.0
        if accepted is None:
            emitted.append(_sample(p, rng))
            return emitted
        emitted.append(tokens[accepted])
        u = accepted


# ----------------------------------------------------------------------------------------------
# Tree policies (SAGE Eq. 10-12 + SAGE_SPEC §2, EAGLE-2, static, chain)
# ----------------------------------------------------------------------------------------------

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


class _Margin:
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


def _topk_ref(probs: Sequence[float], k: int, m: _Margin) -> list[tuple[int, float]]:
    """``(token, prob)`` of the k most likely tokens, by decreasing probability (ties: lower id).

    The batched code ranks the very same input numbers, so only an exact tie (whose order is an
    implementation detail of ``torch.topk``) makes the ranks ambiguous.
    """
    order = sorted(range(len(probs)), key=lambda t: (-probs[t], t))
    head = order[: k + 1]
    for a, b in zip(head, head[1:], strict=False):
        if probs[a] == probs[b] and probs[b] > 0.0:
            m.note(0.0, "draft top-k tie")
    return [(t, probs[t]) for t in order[:k]]


def _plan_ref(cfg, state_alpha: float, root_probs: Sequence[float], d_max_cur: int, first_round: bool, m: _Margin):
    k = cfg.k
    root_alpha = topk_confidence_ref([root_probs], k)[0]
    if cfg.policy != "sage":
        static_depth = max(len(p) for p in cfg.static_tree)
        depth = {"eagle2": cfg.eagle_depth, "chain": cfg.chain_depth, "static": static_depth}[cfg.policy]
        return depth, k, state_alpha, root_alpha, False
    if not cfg.use_entropy:
        alpha = cfg.alpha_init
    elif cfg.alpha_source == "fresh":
        alpha = root_alpha
    else:
        alpha = state_alpha
    d_max = d_max_cur if cfg.use_history else cfg.d_max
    x_depth = cfg.d_min + alpha * (d_max - cfg.d_min)  # Eq. 10
    x_width = cfg.w_min + (1.0 - alpha) * (cfg.w_max - cfg.w_min)  # Eq. 11
    m.rounding(x_depth, cfg.rounding, "D rounding")
    m.rounding(x_width, cfg.rounding, "W rounding")
    depth = max(1, round_ref(x_depth, cfg.rounding))
    width = min(k, max(1, round_ref(x_width, cfg.rounding)))
    static_first = bool(first_round and cfg.first_round_static)
    if static_first:
        depth = max(len(p) for p in cfg.static_tree)
    return depth, width, alpha, root_alpha, static_first


def build_tree_ref(
    cfg,
    root_token: int,
    root_probs: Sequence[float],
    draft_fn: Callable[[tuple[int, ...]], Sequence[float]],
    state_alpha: float,
    d_max_cur: int,
    first_round: bool,
) -> RefTree:
    """Naive per-request tree builder for ``cfg.policy`` in {sage, eagle2, static, chain}.

    Level-synchronous, like :mod:`sage_plugin.core.policies`: at level ``l`` every frontier node
    (in insertion order) proposes its top-k children; the policy keeps some (inserted into the
    tree in decreasing priority) and expands some (the next frontier, in insertion order).

    * **sage** (non-static rounds): ``D, W`` from alpha (Eq. 10-11, ``cfg.rounding``); a candidate
      of rank r under parent u is eligible iff ``r < W_l(u)`` (``W`` at level 1, else
      ``round(W (0.5 + P_parent) / l)``, clamped to >= 1 if ``cfg.clamp_level_width``), its
      probability (joint or conditional, full or top-k space) is ``> theta0 * l / D`` and
      ``l <= D``; with ``keep_top1`` the level-1 rank-0 child is always eligible.  Eligible
      candidates are kept best-first by (full) joint probability, or in parent order (frontier
      position, then rank), while fewer than ``n_max`` draft nodes exist; kept nodes are expanded
      while ``l < D``.  The first round uses ``cfg.static_tree`` when ``cfg.first_round_static``.
    * **static**: keep a candidate iff its rank path is in ``cfg.static_tree``; expand it iff it
      is a proper prefix of one; insertion by joint.
    * **chain**: keep rank 0, expand while ``l < chain_depth``.
    * **eagle2**: keep every candidate; expand the k best by joint among the level's candidates
      while ``l < eagle_depth``; finally keep the ``eagle_total_tokens`` best nodes by joint
      (ties: earlier node), in their original order.

    Only the "online" topology is modelled (``cfg.topology`` is not read).

    Args:
        cfg: a :class:`~sage_plugin.config.SageConfig`.
        root_token: the root's token.
        root_probs: draft distribution after the root (full vocabulary).
        draft_fn: ``draft_fn(path) -> probabilities`` for a node whose token path (root's child
            first, root excluded) is ``path``; deterministic.
        state_alpha: the request's carried alpha (lag-1 / path-mean sources).
        d_max_cur: the request's current ``D_max`` (history controller).
        first_round: the request has not finished a round yet.

    Returns:
        The :class:`RefTree` (nodes in level order: parents before children).
    """
    m = _Margin()
    k = cfg.k
    root_probs = [float(p) for p in _list(root_probs)]
    depth, width, alpha, root_alpha, static_first = _plan_ref(cfg, state_alpha, root_probs, d_max_cur, first_round, m)
    nodes = [RefNode(path=(), ranks=(), token=int(root_token), parent=-1, depth=0)]
    policy = cfg.policy
    use_static = policy == "static" or (policy == "sage" and static_first)
    static_paths = {tuple(p) for p in cfg.static_tree}
    static_internal = {p[:-1] for p in static_paths if len(p) > 1}
    topk_space = cfg.prob_space == "topk"

    frontier = [0]
    level = 0
    while frontier:
        level += 1
        # -- propose: top-k children of every frontier node, in frontier order -------------------
        cands: list[tuple[int, RefNode]] = []  # (flat index = frontier position * k + rank, node)
        for pos, u in enumerate(frontier):
            parent = nodes[u]
            probs = root_probs if u == 0 else [float(p) for p in _list(draft_fn(parent.path))]
            parent.conf = topk_confidence_ref([probs], k)[0]
            top = _topk_ref(probs, k, m)
            mass = sum(p for _, p in top)
            for rank, (tok, p) in enumerate(top):
                if p <= 0.0:
                    continue  # impossible token: not a candidate
                cands.append(
                    (
                        pos * k + rank,
                        RefNode(
                            path=parent.path + (tok,),
                            ranks=parent.ranks + (rank,),
                            token=tok,
                            parent=u,
                            depth=level,
                            prob=p,
                            prob_topk=p / mass,
                            joint=parent.joint * p,
                            joint_topk=parent.joint_topk * (p / mass),
                        ),
                    )
                )

        def by_joint(item):
            return (-item[1].joint, item[0])

        # -- select -------------------------------------------------------------------------------
        if use_static:
            kept = sorted((c for c in cands if c[1].ranks in static_paths), key=by_joint)
            expand = [c[1].ranks in static_internal for c in kept]
        elif policy == "chain":
            kept = [c for c in cands if c[1].rank == 0]
            expand = [level < cfg.chain_depth for _ in kept]
        elif policy == "eagle2":
            kept = sorted(cands, key=by_joint)
            if len(kept) > k:
                m.ratio(kept[k - 1][1].joint, kept[k][1].joint, "eagle2 expansion cut")
            best = {id(c[1]) for c in kept[:k]}
            expand = [id(c[1]) in best and level < cfg.eagle_depth for c in kept]
        else:  # sage
            theta = cfg.theta0 * level / depth
            eligible = []
            for flat, c in cands:
                u = nodes[c.parent]
                if level == 1:
                    w_l = width
                else:
                    if cfg.parent_prob == "joint":
                        p_parent = u.joint_topk if topk_space else u.joint
                    else:
                        p_parent = u.prob_topk if topk_space else u.prob
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
                ok = (c.rank < w_l and score > theta and level <= depth) or forced
                if ok:
                    eligible.append((flat, c))
            if cfg.budget_order == "best_first":
                eligible.sort(key=by_joint)
            else:
                eligible.sort(key=lambda item: item[0])
            budget = cfg.n_max - (len(nodes) - 1)
            if cfg.budget_order == "best_first" and 0 < budget < len(eligible):
                m.ratio(eligible[budget - 1][1].joint, eligible[budget][1].joint, "N_max budget cut")
            kept = eligible[: max(budget, 0)]
            expand = [level < depth for _ in kept]

        # -- append (priority order) and the next frontier (expanded nodes, insertion order) -----
        frontier = []
        for (_, c), grow in zip(kept, expand, strict=True):
            nodes.append(c)
            if grow:
                frontier.append(len(nodes) - 1)

    if policy == "eagle2" and len(nodes) - 1 > cfg.eagle_total_tokens:
        total = cfg.eagle_total_tokens
        order = sorted(range(1, len(nodes)), key=lambda i: (-nodes[i].joint, i))
        m.ratio(nodes[order[total - 1]].joint, nodes[order[total]].joint, "eagle2 rerank cut")
        chosen = sorted(order[:total])
        remap = {0: 0}
        out = [nodes[0]]
        for i in chosen:
            assert nodes[i].parent in remap, "joint probability must not increase along a path"
            remap[i] = len(out)
            node = nodes[i]
            out.append(
                RefNode(
                    node.path,
                    node.ranks,
                    node.token,
                    remap[node.parent],
                    node.depth,
                    node.prob,
                    node.prob_topk,
                    node.joint,
                    node.joint_topk,
                    node.conf,
                )
            )
        nodes = out

    return RefTree(nodes, depth, width, alpha, root_alpha, static_first, m.value, m.where)


# ----------------------------------------------------------------------------------------------
# History controller and per-request policy state
# ----------------------------------------------------------------------------------------------


@dataclass
class HistoryRef:
    """One request's controller state: recent tau values (at most ``window``), counters, D_max."""

    window: list[float]
    since_change: int
    d_max: int


def history_init_ref(d_max: int) -> HistoryRef:
    return HistoryRef([], 0, d_max)


def history_update_ref(
    h: HistoryRef,
    tau: float,
    *,
    window: int,
    lo: float,
    hi: float,
    step: int,
    d_min: int,
    d_cap: int,
    full_window_cooldown: bool,
) -> HistoryRef:
    """Push ``tau``; once ``window`` values are held (and, with the cool-down, ``window`` rounds
    have passed since the last change), move D_max by -step if the mean < lo, by +step if the
    mean > hi, clamped to ``[d_min, d_cap]``.

    >>> h = history_init_ref(8)
    >>> out = []
    >>> for t in (4, 4, 4, 4, 1, 1):
    ...     h = history_update_ref(h, t, window=2, lo=2, hi=3, step=1, d_min=3, d_cap=10, full_window_cooldown=True)
    ...     out.append(h.d_max)
    >>> out
    [8, 9, 9, 10, 10, 9]
    """
    values = (h.window + [float(tau)])[-window:]
    since = h.since_change + 1
    d_max = h.d_max
    ready = len(values) == window and (since >= window or not full_window_cooldown)
    if ready:
        mean = sum(values) / window
        if mean < lo and d_max > d_min:
            d_max = max(d_min, d_max - step)
            since = 0
        elif mean > hi and d_max < d_cap:
            d_max = min(d_cap, d_max + step)
            since = 0
    return HistoryRef(values, since, d_max)


@dataclass
class RefState:
    """One request's policy state between rounds."""

    alpha: float
    first_round: bool
    history: HistoryRef


def init_state_ref(cfg) -> RefState:
    return RefState(cfg.alpha_init, True, history_init_ref(cfg.d_max))


def observe_ref(cfg, state: RefState, tree: RefTree, accepted: Sequence[int], tau: int) -> RefState:
    """State after a round: next alpha (lag-1 root alpha, or the mean confidence over the accepted
    path's drafted nodes, root included, for ``path_mean``) and the history controller update."""
    if cfg.policy != "sage":
        return RefState(tree.root_alpha, False, state.history)
    if cfg.alpha_source == "path_mean":
        confs = [tree.nodes[i].conf for i in accepted if tree.nodes[i].conf is not None]
        alpha = sum(confs) / len(confs) if confs else tree.root_alpha
    else:
        alpha = tree.root_alpha
    history = state.history
    if cfg.use_history:
        t = tau + (1 if cfg.history_tau == "drafts_plus_bonus" else 0)
        history = history_update_ref(
            history,
            t,
            window=cfg.history_window,
            lo=cfg.history_lo,
            hi=cfg.history_hi,
            step=cfg.history_step,
            d_min=cfg.d_min,
            d_cap=cfg.d_cap,
            full_window_cooldown=cfg.history_cooldown == "full_window",
        )
    return RefState(alpha, False, history)
