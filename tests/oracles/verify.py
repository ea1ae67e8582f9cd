"""Naive references for tree verification: greedy (follow the target's argmax) and the literal recursive rejection
sampling over deterministic children, with the target's temperature / top-k / top-p processing."""

from __future__ import annotations

import math
import random
from typing import Sequence

from tests.oracles.layout import as_list, children_ref

__all__ = ["greedy_verify_ref", "process_logits_ref", "rejection_verify_one"]


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
    tokens, parents, target_argmax = as_list(tokens), as_list(parents), as_list(target_argmax)
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
    z = [float(x) / float(temperature) for x in as_list(logits)]
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
    tokens, parents = as_list(tokens), as_list(parents)
    kids = children_ref(parents)
    emitted: list[int] = []
    u = 0
    while True:
        p = [float(x) for x in as_list(probs_per_node[u])]
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
