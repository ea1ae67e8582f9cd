"""The "planned" topology (open point 8, the literal Algorithm 1 line 18): plan round r+1's tree at the end of round r.

The plan is a set of rank-path codes (:func:`~sage_plugin.core.tree.path_code`): code ``0`` is the root and a
child of code ``c`` with rank ``r`` has code ``c (k + 1) + r + 1``.  At the end of a round, the SAGE selection runs
level by level over a *virtual* tree whose node distributions are this round's top-k draft distributions at the
same rank path (or the root's, where that path was not expanded this round); next round replays the codes it kept.

Example (k = 2): codes ``[0, 1, 2, 4]`` are the root, its rank-0 and rank-1 children and the rank-0 child of the
rank-0 child (``1 * 3 + 0 + 1 = 4``); :func:`code_depth` gives ``[0, 1, 1, 2]``.
"""

from __future__ import annotations

from typing import Callable

import torch

from .level_expansion import Candidates, DraftPool, append, new_pool, propose
from .policy import RoundPlan

__all__ = ["code_depth", "plan_next_tree", "planned_selection"]

#: ``(plan, pool, candidates) -> (keep, expand, order)``, the policy's selection of one level
LevelSelection = Callable[[RoundPlan, DraftPool, Candidates], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def code_depth(codes: torch.Tensor, k: int) -> torch.Tensor:
    """Depth of rank-path codes (0 for the root, -1 for padding), by repeated parent steps.

    >>> code_depth(torch.tensor([[0, 1, 2, 4, -1]]), 2)
    tensor([[ 0,  1,  1,  2, -1]])
    """
    depth = torch.zeros_like(codes)
    cur = codes.clone()
    for _ in range(64):
        live = cur > 0
        depth = depth + live.long()
        cur = torch.where(live, (cur - 1) // (k + 1), cur)
    return torch.where(codes < 0, -1, depth)


def planned_selection(planned: torch.Tensor, c: Candidates, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keep, expand)`` ``[B, F, K]``: candidates whose code is planned / the parent of a planned code.

    Args:
        planned: ``[B, C]`` int64 planned codes, -1 padding.
        c: one level's candidates.
        k: the code base (children per node).
    """
    codes = planned[:, None, None, :]
    parents = torch.where(planned > 0, (planned - 1) // (k + 1), -1)[:, None, None, :]
    keep = c.valid & (c.codes[..., None] == codes).any(-1)
    return keep, keep & (c.codes[..., None] == parents).any(-1)


def plan_next_tree(
    select: LevelSelection,
    plan: RoundPlan,
    pool: DraftPool,
    *,
    k: int,
    pool_capacity: int,
    frontier_capacity: int,
    tree_capacity: int,
    max_levels: int,
) -> torch.Tensor:
    """``[B, tree_capacity]`` int64 codes of the tree planned for the next round (-1 padding).

    Args:
        select: the policy's level selection, run on the virtual tree.
        plan: next round's ``D`` / ``W`` (from this round's alpha and the updated history).
        pool: this round's pool (its ``codes``, ``conf`` and ``topk_logp`` rows).
        k: children per node; the virtual tree's "vocabulary" is the k ranks (token id = rank).
        pool_capacity, frontier_capacity, tree_capacity: the policy's sizes.
        max_levels: deepest level to plan (``d_cap``).
    """
    bsz = plan.alpha.shape[0]
    root = pool.topk_logp[:, 0]  # [B, K] sorted: as a k-token "vocabulary", token id = rank
    expanded = ~torch.isnan(pool.conf)
    vpool, front = new_pool(torch.zeros(bsz, dtype=torch.int64, device=root.device), pool_capacity, k)
    logprobs = root[:, None]
    for level in range(1, max_levels + 1):
        cand = propose(vpool, front, logprobs, k, level)
        keep, expand, order = select(plan, vpool, cand)
        front = append(vpool, cand, keep, expand, order, frontier_capacity)
        codes = vpool.codes.gather(1, front.idx.clamp(min=0))  # [B, F]
        same = (codes[..., None] == pool.codes[:, None, :]) & expanded[:, None, :]
        found = same.any(-1)
        src = same.float().argmax(-1)
        replay = pool.topk_logp.gather(1, src[..., None].expand(-1, -1, k))
        logprobs = torch.where(found[..., None], replay, root[:, None, :])
    filled = torch.arange(pool_capacity + 1, device=root.device) < vpool.count[:, None]
    return torch.where(filled, vpool.codes, -1)[:, :tree_capacity]
