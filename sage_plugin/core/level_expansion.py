"""Level-synchronous draft-tree expansion shared by every tree policy.

One round builds, per request, a **pool** of candidate nodes level by level from live draft
probabilities.  At level ``l`` the **frontier** (pool nodes of depth ``l-1`` whose draft
distribution was computed) proposes its top-``k`` children; the policy decides which candidates
are **kept** (enter the pool) and which of those are **expanded** (fed to the draft so that they
propose children at level ``l+1``).  At the end the policy **finalises** the pool into a
:class:`~sage_plugin.core.tree.DraftTree` (all of it, or a best-first rerank to a node budget).

Pool layout (per request, padded to capacity ``P``, one trash column at index ``P``)::

    index 0 = root; nodes appended level by level; parents[i] < i

Nothing here synchronises with the host: shapes depend only on capacities, and per-request
counts live in tensors.  A runtime that wants to skip padded work may trim frontier columns
(``frontier.idx >= 0``) itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .calibration import calibrated_logp
from .entropy import topk_confidence
from .tree import DraftTree, path_code

__all__ = [
    "DraftPool", "Candidates", "Frontier", "new_pool", "propose", "append", "budget_top_n", "best_nodes", "finalize",
    "finalize_nodes", "node_values", "rank_desc", "TopChildren", "top_children",
]  # fmt: skip

NEG_INF = float("-inf")


@dataclass(slots=True)
class DraftPool:
    """Candidate nodes of one round (mutable working buffers; ``[B, P+1]`` with a trash column).

    Attributes:
        tokens: int64 token id (-1 empty).
        parents: int64 pool index of the parent (-1 for the root and empty slots).
        depths: int64 (root 0, -1 empty).
        logp: float32 full-softmax conditional log-probability given the parent (root 0).
        logp_topk: float32 top-k renormalised conditional log-probability (root 0).
        joint: float32 sum of ``logp`` along the path (root 0).
        joint_topk: float32 sum of ``logp_topk`` along the path.
        ranks: int64 rank among the parent's candidates (root -1).
        codes: int64 rank-path code (:func:`~sage_plugin.core.tree.path_code`; root 0).
        conf: float32 confidence alpha of the node's own draft distribution, NaN if never computed.
        topk_logp: ``[B, P+1, K]`` float32 top-k log-probabilities of the node's own draft
            distribution (-inf if never computed); the "planned" topology replays them.
        count: ``[B]`` int64 nodes in the pool (root included).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    logp: torch.Tensor
    logp_topk: torch.Tensor
    joint: torch.Tensor
    joint_topk: torch.Tensor
    ranks: torch.Tensor
    codes: torch.Tensor
    conf: torch.Tensor
    topk_logp: torch.Tensor
    count: torch.Tensor

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1] - 1


@dataclass(frozen=True, slots=True)
class Frontier:
    """Pool nodes whose draft distribution is computed next: ``idx [B, F]`` int64, -1 padding."""

    idx: torch.Tensor

    @property
    def valid(self) -> torch.Tensor:
        return self.idx >= 0


@dataclass(frozen=True, slots=True)
class Candidates:
    """Top-k children proposed by a frontier, all ``[B, F, K]``.

    ``parent`` is the pool index of the proposing node (-1 where the frontier slot is empty).  The ``parent_*``
    fields (the proposing node's own probabilities, read by SAGE's level rule) are None unless :func:`propose` was
    asked for them.
    """

    level: int
    parent: torch.Tensor
    valid: torch.Tensor
    tokens: torch.Tensor
    logp: torch.Tensor
    logp_topk: torch.Tensor
    joint: torch.Tensor
    joint_topk: torch.Tensor
    parent_logp: torch.Tensor | None
    parent_logp_topk: torch.Tensor | None
    parent_joint: torch.Tensor | None
    parent_joint_topk: torch.Tensor | None
    ranks: torch.Tensor
    codes: torch.Tensor


@dataclass(frozen=True, slots=True)
class TopChildren:
    """The ``k`` most probable children of each frontier node, all ``[B, F, K]`` (``conf`` ``[B, F]``).

    Attributes:
        values: float32 their draft log-probabilities, descending (-inf: impossible).
        tokens: int64 their token ids.
        logp_topk: float32 the log-probabilities renormalised over the top ``k``.
        conf: float32 the confidence alpha of each frontier node's draft distribution (:func:`topk_confidence`).
    """

    values: torch.Tensor
    tokens: torch.Tensor
    logp_topk: torch.Tensor
    conf: torch.Tensor


def top_children(logprobs: torch.Tensor, k: int, vocab: torch.Tensor | None = None) -> TopChildren:
    """The top-``k`` children of draft distributions ``logprobs [B, F, V]`` (``vocab``: :func:`propose`)."""
    top = torch.topk(logprobs.float(), k, dim=-1)  # sorted by probability
    tokens = top.indices if vocab is None else vocab[top.indices]
    # the top-k of the top-k is itself
    return TopChildren(top.values, tokens, torch.log_softmax(top.values, dim=-1), topk_confidence(top.values, k))


def new_pool(root_tokens: torch.Tensor, capacity: int, k: int) -> tuple[DraftPool, Frontier]:
    """Start a round: a pool holding only the roots, and a frontier of the roots.

    The root's own confidence and top-k (``conf``, ``topk_logp``) are filled by :func:`propose`
    at level 1, where the root is the frontier.

    Args:
        root_tokens: ``[B]`` int64.
        capacity: pool capacity ``P`` (root included).
        k: top-k size of the per-node ``topk_logp`` rows.
    """
    bsz = root_tokens.shape[0]
    dev = root_tokens.device

    def full(value, dtype):
        return torch.full((bsz, capacity + 1), value, dtype=dtype, device=dev)

    pool = DraftPool(
        tokens=full(-1, torch.int64),
        parents=full(-1, torch.int64),
        depths=full(-1, torch.int64),
        logp=full(NEG_INF, torch.float32),
        logp_topk=full(NEG_INF, torch.float32),
        joint=full(NEG_INF, torch.float32),
        joint_topk=full(NEG_INF, torch.float32),
        ranks=full(-1, torch.int64),
        codes=full(-1, torch.int64),
        conf=full(float("nan"), torch.float32),
        topk_logp=torch.full((bsz, capacity + 1, k), NEG_INF, dtype=torch.float32, device=dev),
        count=torch.ones(bsz, dtype=torch.int64, device=dev),
    )
    pool.tokens[:, 0] = root_tokens
    pool.depths[:, 0] = 0
    for name in ("logp", "logp_topk", "joint", "joint_topk"):
        getattr(pool, name)[:, 0] = 0.0
    pool.codes[:, 0] = 0
    return pool, Frontier(torch.zeros(bsz, 1, dtype=torch.int64, device=dev))


def propose(
    pool: DraftPool, frontier: Frontier, logprobs: torch.Tensor, k: int, level: int,
    calibration: torch.Tensor | None = None, vocab: torch.Tensor | None = None, parents: bool = True,
    topk_rows: bool = True,
) -> Candidates:  # fmt: skip
    """Top-``k`` children of every frontier node.

    Args:
        pool: the round's pool (its ``conf`` column is filled for the frontier nodes).
        frontier: ``[B, F]`` pool indices.
        logprobs: ``[B, F, V]`` draft log-softmax after each frontier node, over the whole vocabulary or (``vocab``)
            over the only ids the draft can propose.
        k: children per node.
        level: depth of the children (1 for the root's children).
        calibration: ``[A, P]`` log calibration table (:mod:`.calibration`): the candidates' ``joint`` is then the
            parent's plus the calibrated factor instead of the draft log-probability.
        vocab: ``[V]`` int64 token id of each ``logprobs`` column (None: column = id).  A draft whose head scores a
            subset of the vocabulary (``TextModel`` with ``head_ids``) passes that subset and its log-softmax over it:
            the same candidates as the full row with ``-inf`` elsewhere, for a fraction of the top-k and softmax.
        parents: fill the candidates' ``parent_*`` fields (False: None; a caller that never reads them saves the
            gathers, a level's host time being a drafted level's cost).
        topk_rows: record the frontier's top-k rows in ``pool.topk_logp`` (read only by the planned topology).
    """
    fidx = frontier.idx.clamp(min=0)
    fvalid = frontier.valid
    top = top_children(logprobs, k, vocab)
    logp_topk, conf = top.logp_topk, top.conf
    rows = torch.where(fvalid, fidx, pool.capacity)
    pool.conf.scatter_(1, rows, conf)
    if topk_rows:
        pool.topk_logp.scatter_(1, rows[..., None].expand(-1, -1, k), top.values)

    def par(col: torch.Tensor) -> torch.Tensor:
        return col.gather(1, fidx)[..., None].expand(-1, -1, k)

    parent_joint, parent_joint_topk = par(pool.joint), par(pool.joint_topk)

    ranks = torch.arange(k, device=logprobs.device).expand_as(top.tokens)
    valid = fvalid[..., None].expand_as(top.tokens) & torch.isfinite(top.values)
    return Candidates(
        level=level,
        parent=torch.where(fvalid, frontier.idx, -1)[..., None].expand(-1, -1, k),
        valid=valid,
        tokens=top.tokens,
        logp=top.values,
        logp_topk=logp_topk,
        joint=parent_joint
        + (top.values if calibration is None else calibrated_logp(calibration, top.values, conf[..., None])),
        joint_topk=parent_joint_topk + logp_topk,
        parent_logp=par(pool.logp) if parents else None,
        parent_logp_topk=par(pool.logp_topk) if parents else None,
        parent_joint=parent_joint if parents else None,
        parent_joint_topk=parent_joint_topk if parents else None,
        ranks=ranks,
        codes=path_code(par(pool.codes), ranks, k),
    )


def budget_top_n(eligible: torch.Tensor, score: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Keep, per request, the ``n`` eligible entries with the highest score (ties: lower index).

    Args:
        eligible: ``[B, M]`` bool.
        score: ``[B, M]`` float.
        n: ``[B]`` int64 budget (may be <= 0).

    Returns:
        ``[B, M]`` bool.

    >>> budget_top_n(torch.tensor([[True, True, False, True]]), torch.tensor([[0.1, 0.5, 0.9, 0.3]]),
    ...              torch.tensor([2]))
    tensor([[False,  True, False,  True]])
    """
    _, place = rank_desc(torch.where(eligible, score, NEG_INF))
    return eligible & (place < n[:, None])


def rank_desc(score: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ordered, place)``, each ``[B, M]``: each row's ``score`` in descending order, and each entry's place in that
    order (0 = the highest; ties: the lower index first).

    >>> rank_desc(torch.tensor([[0.1, 0.5, 0.5]]))
    (tensor([[0.5000, 0.5000, 0.1000]]), tensor([[2, 0, 1]]))
    """
    order = torch.sort(score, dim=1, descending=True, stable=True)
    ar = torch.arange(score.shape[1], device=score.device).expand_as(order.indices)
    return order.values, torch.empty_like(ar).scatter_(1, order.indices, ar)


def node_values(pool: DraftPool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(filled, value)``, each ``[B, P-1]`` over the pool's draft nodes (root and trash column dropped): which slots
    hold a node, and its path value ``joint`` (-inf where empty)."""
    filled = torch.arange(1, pool.capacity, device=pool.count.device) < pool.count[:, None]
    return filled, torch.where(filled, pool.joint[:, 1:-1], NEG_INF)


def best_nodes(pool: DraftPool, n: torch.Tensor) -> torch.Tensor:
    """``[B, P-1]`` bool over the pool's draft nodes: each request's ``n [B]`` most valuable nodes by path value
    (ties: the earlier node), an ancestor-closed set."""
    return budget_top_n(*node_values(pool), n)


def append(
    pool: DraftPool, cands: Candidates, keep: torch.Tensor, expand: torch.Tensor, order: torch.Tensor, frontier_cap: int
) -> Frontier:
    """Append kept candidates to the pool in ``order`` (descending) and return the next frontier.

    Args:
        pool: updated in place.
        cands: this level's candidates ``[B, F, K]``.
        keep: ``[B, F, K]`` bool, candidates entering the pool (must fit its capacity).
        expand: ``[B, F, K]`` bool subset of ``keep`` that forms the next frontier.
        order: ``[B, F, K]`` float, insertion priority (higher first).
        frontier_cap: width of the returned frontier; expanded nodes beyond it (lowest
            priority) are not expanded.

    Returns:
        The next :class:`Frontier` ``[B, frontier_cap]``.
    """
    bsz = keep.shape[0]
    flat = lambda t: t.reshape(bsz, -1)  # noqa: E731
    keep_f, expand_f = flat(keep), flat(expand & keep)
    sort = torch.sort(torch.where(keep_f, flat(order), NEG_INF), dim=1, descending=True, stable=True).indices
    kept_sorted = keep_f.gather(1, sort)
    slot = pool.count[:, None] + torch.cumsum(kept_sorted.long(), 1) - 1
    slot = torch.where(kept_sorted & (slot < pool.capacity), slot, pool.capacity)  # trash column
    for name, src in (
        ("tokens", cands.tokens),
        ("parents", cands.parent),
        ("logp", cands.logp),
        ("logp_topk", cands.logp_topk),
        ("joint", cands.joint),
        ("joint_topk", cands.joint_topk),
        ("ranks", cands.ranks),
        ("codes", cands.codes),
    ):
        getattr(pool, name).scatter_(1, slot, flat(src).gather(1, sort))
    pool.depths.scatter_(1, slot, torch.full_like(slot, cands.level))
    pool.count += (slot < pool.capacity).sum(1)
    # Next frontier: expanded nodes in insertion order (already best-first), cut to frontier_cap.
    exp_sorted = expand_f.gather(1, sort) & (slot < pool.capacity)
    key = torch.where(exp_sorted, torch.arange(slot.shape[1], device=slot.device).expand_as(slot), slot.shape[1])
    pick = torch.sort(key, dim=1).indices[:, :frontier_cap]
    chosen = exp_sorted.gather(1, pick)
    idx = torch.where(chosen, slot.gather(1, pick), -1)
    if idx.shape[1] < frontier_cap:
        idx = torch.cat([idx, idx.new_full((bsz, frontier_cap - idx.shape[1]), -1)], 1)
    return Frontier(idx)


def finalize_nodes(pool: DraftPool, keep: torch.Tensor, max_depth: int, width: int) -> DraftTree:
    """:func:`finalize` of the root plus the draft nodes ``keep [B, P-1]`` (as :func:`best_nodes` returns)."""
    selected = torch.cat([torch.ones_like(keep[:, :1]), keep, torch.zeros_like(keep[:, :1])], 1)
    return finalize(pool, selected, max_depth, width)


def finalize(pool: DraftPool, selected: torch.Tensor, max_depth: int, width: int) -> DraftTree:
    """Compact the selected pool nodes (ancestor-closed, root included) into a DraftTree.

    Args:
        pool: the round's pool.
        selected: ``[B, P+1]`` bool; column 0 (root) must be True, the trash column False.
        max_depth: deepest level built this round.
        width: padded node count of the output (``>=`` max selected per request).
    """
    bsz = selected.shape[0]
    dev = selected.device
    new_index = torch.cumsum(selected.long(), 1) - 1  # pool index -> tree index
    dest = torch.where(selected & (new_index < width), new_index, width)  # width = trash column

    def move(col: torch.Tensor, fill) -> torch.Tensor:
        out = torch.full((bsz, width + 1), fill, dtype=col.dtype, device=dev)
        return out.scatter_(1, dest, col)[:, :width]

    parents = pool.parents.clamp(min=0)
    tree_parents = torch.where(pool.parents >= 0, new_index.gather(1, parents), -1)
    return DraftTree(
        tokens=move(pool.tokens, -1),
        parents=move(tree_parents, -1),
        depths=move(pool.depths, -1),
        num_nodes=selected.sum(1).clamp(max=width),
        draft_logp=move(pool.logp, NEG_INF),
        ranks=move(pool.ranks, -1),
        max_depth=max_depth,
        node_conf=move(pool.conf, float("nan")),
        source=move(torch.arange(pool.capacity + 1, device=dev).expand(bsz, -1), -1),
    )
