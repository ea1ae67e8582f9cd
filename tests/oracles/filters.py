"""Oracle of the target sampling filters (:mod:`sage_plugin.core.filters`): one row, literal loops, exact fractions
where the boundary rule compares a sum with ``p``."""

from __future__ import annotations

from fractions import Fraction


def _descending(values: list[float]) -> list[int]:
    """Token ids by decreasing value, ties by lower id."""
    return sorted(range(len(values)), key=lambda i: (-values[i], i))


def top_k_keep_one(scores: list[float], k: int, ties: bool) -> list[bool]:
    """Keep flags of the ``k`` best tokens (``k <= 0`` or ``>= V``: all): ``ties`` every token at least the k-th
    score, else the first ``k`` by decreasing score, ties by lower id."""
    if k <= 0 or k >= len(scores):
        return [True] * len(scores)
    order = _descending(scores)
    if ties:
        kth = scores[order[k - 1]]
        return [s >= kth for s in scores]
    keep = [False] * len(scores)
    for i in order[:k]:
        keep[i] = True
    return keep


def top_p_keep_one(probs: list[float], p: float, boundary: str) -> list[bool]:
    """Keep flags of the nucleus: walking down by decreasing probability, a token is kept while the mass before it is
    below ``p`` (``"reach"``) or at most ``p`` (``"exceed"``); ``p >= 1`` keeps all."""
    if p >= 1.0:
        return [True] * len(probs)
    keep = [False] * len(probs)
    before = Fraction(0)
    for i in _descending(probs):
        if before < Fraction(p) or (boundary == "exceed" and before == Fraction(p)):
            keep[i] = True
        before += Fraction(probs[i])
    return keep


def min_p_keep_one(probs: list[float], min_p: float) -> list[bool]:
    """Keep flags of the tokens at least ``min_p`` times the largest probability."""
    top = max(probs)
    return [q >= top * min_p for q in probs]
