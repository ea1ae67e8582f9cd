"""Conversions of the core's padded tree layout (:mod:`sage_plugin.core.tree`) that only the tests use: position
ids, SGLang's first-child / next-sibling ``retrieve_*`` arrays and their inverse, rank paths back from a tree, and the
flattened CSR form.

They check the runtimes' own conversions (the SGLang CPU tree ops build ``retrieve_*`` arrays themselves) and the
policies' trees against rank-path lists; nothing in the package calls them.
"""

from __future__ import annotations

from typing import Sequence

import torch

from sage_plugin.core.tree import DraftTree

__all__ = ["choices_from_tree", "flatten_tree", "parents_from_retrieve_arrays", "to_retrieve_arrays", "tree_positions"]


def tree_positions(depths: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
    """Position ids of tree nodes: committed prefix length + depth (padding gets the root's).

    Args:
        depths: ``[B, N]`` int64 (-1 on padding).
        prefix_lens: ``[B]`` int64 committed KV length of each request (the root's position).

    Returns:
        ``[B, N]`` int64.

    >>> tree_positions(torch.tensor([[0, 1, 1, 2, -1]]), torch.tensor([7]))
    tensor([[7, 8, 8, 9, 7]])
    """
    return prefix_lens[:, None] + depths.clamp(min=0)


def to_retrieve_arrays(parents: torch.Tensor, num_nodes: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Convert parents to SGLang's verify index arrays.

    Children are linked in increasing node order (first child = smallest index).

    Args:
        parents: ``[B, N]`` int64.
        num_nodes: ``[B]`` int64.

    Returns:
        ``(retrieve_index, retrieve_next_token, retrieve_next_sibling)``, each ``[B, N]`` int64:
        global node ids ``b*N + i`` (-1 on padding), first child, next sibling (local ids, -1 none).

    >>> idx, nxt, sib = to_retrieve_arrays(torch.tensor([[-1, 0, 0, 1, 3]]), torch.tensor([5]))
    >>> nxt, sib
    (tensor([[ 1,  3, -1,  4, -1]]), tensor([[-1,  2, -1, -1, -1]]))
    """
    bsz, n = parents.shape
    dev = parents.device
    node = torch.arange(n, device=dev).expand(bsz, n)
    valid = node < num_nodes[:, None]
    is_child = valid & (parents >= 0)
    # For every (parent p, child c): c is p's first child iff no smaller child of p exists;
    # c's next sibling is the smallest child of p larger than c.  [B, N, N] pairwise, N <= ~1k.
    same_parent = (parents[:, :, None] == parents[:, None, :]) & is_child[:, :, None] & is_child[:, None, :]
    later = node[:, None, :] > node[:, :, None]
    sib_cand = torch.where(same_parent & later, node[:, None, :], n)
    next_sibling = sib_cand.min(-1).values
    next_sibling = torch.where(next_sibling == n, -1, next_sibling)
    child_of = (parents[:, None, :] == node[:, :, None]) & is_child[:, None, :]  # [B, parent, child]
    next_token = torch.where(child_of, node[:, None, :], n).min(-1).values
    next_token = torch.where((next_token == n) | ~valid, -1, next_token)
    next_sibling = torch.where(valid, next_sibling, -1)
    retrieve_index = torch.where(valid, node + torch.arange(bsz, device=dev)[:, None] * n, -1)
    return retrieve_index, next_token, next_sibling


def parents_from_retrieve_arrays(next_token: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_retrieve_arrays`: recover ``parents [B, N]`` (-1 root/padding).

    A node's parent is the node whose first child starts the sibling chain containing it.
    """
    bsz, n = next_token.shape
    parents = torch.full((bsz, n + 1), -1, dtype=next_token.dtype, device=next_token.device)
    cur = next_token.clone()  # walk every parent's sibling chain in lock-step
    owner = torch.arange(n, device=next_token.device).expand(bsz, n)
    for _ in range(n):  # a sibling chain is at most n long; finished chains write to column n
        ok = cur >= 0
        parents.scatter_(1, torch.where(ok, cur, n), torch.where(ok, owner, -1))
        cur = torch.where(ok, next_sibling.gather(1, cur.clamp(min=0)), cur)
    return parents[:, :n]


def choices_from_tree(parents: Sequence[int], ranks: Sequence[int]) -> list[list[int]]:
    """Inverse of :func:`sage_plugin.core.tree.tree_from_choices` for one request (host lists; padding = parent -1 past 0)."""
    paths: list[list[int]] = [[]]
    for i in range(1, len(parents)):
        if parents[i] < 0:
            break
        paths.append(paths[parents[i]] + [ranks[i]])
    return sorted(paths[1:], key=lambda p: (len(p), p))


def flatten_tree(tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flattened CSR form: ``(tokens [T], parents [T] (local), depths [T], cu_num_nodes [B+1])``."""
    valid = tree.valid()
    cu = torch.zeros(tree.batch_size + 1, dtype=torch.int64, device=tree.tokens.device)
    cu[1:] = torch.cumsum(tree.num_nodes, 0)
    return tree.tokens[valid], tree.parents[valid], tree.depths[valid], cu
