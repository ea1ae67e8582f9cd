"""Naive references for the confidence (Eq. 7-9) and the tree layout (children, ancestor mask, positions, SGLang's
``retrieve_*`` arrays): one request, plain Python lists."""

from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = [
    "ancestor_mask_ref",
    "as_list",
    "children_ref",
    "positions_ref",
    "retrieve_arrays_ref",
    "topk_confidence_ref",
    "topk_entropy_ref",
]


def as_list(x) -> list:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().tolist()
    return list(x)


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
        alpha = 1.0 - topk_entropy_ref(as_list(probs), k) / math.log(k)
        out.append(min(1.0, max(0.0, alpha)))
    return out


def children_ref(parents: Sequence[int]) -> list[list[int]]:
    """Children of every node, in increasing node order."""
    parents = as_list(parents)
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
    parents = as_list(parents)
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
    return [prefix_len + (d if d >= 0 else 0) for d in as_list(depths)]


def retrieve_arrays_ref(
    parents: Sequence[int], num_nodes: int, batch_index: int = 0
) -> tuple[list[int], list[int], list[int]]:
    """SGLang ``(retrieve_index, retrieve_next_token, retrieve_next_sibling)`` of one padded row.

    First child = the smallest-index child; next sibling = the next larger-index child of the same
    parent; ``retrieve_index[i] = batch_index * N + i`` on real nodes; -1 everywhere else.
    """
    parents = as_list(parents)
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
