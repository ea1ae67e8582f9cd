"""Naive per-node penalties: for each node, the request's tokens plus the node's path, counted from scratch.

The oracle of :mod:`sage_plugin.core.penalties`: one request and one node at a time, Python lists and dictionaries,
the definitions as the OpenAI API and SGLang's penalizers state them (the penalties count generated tokens only).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

__all__ = ["Request", "node_logits", "parents_to_pointers"]


@dataclass(frozen=True)
class Request:
    """One request's penalty parameters and its generated tokens so far."""

    output: tuple[int, ...]
    frequency: float = 0.0
    presence: float = 0.0
    repetition: float = 1.0
    min_tokens: int = 0
    stop: frozenset[int] = frozenset()


def node_logits(logits: list[float], req: Request, extra: list[int]) -> list[float]:
    """The logits plain decoding samples from after ``req.output + extra``: penalties from the counts of those
    tokens, additive terms first (frequency, presence, min_tokens), then the repetition scaling."""
    counts = Counter(req.output) + Counter(extra)
    length = len(req.output) + len(extra)
    out = []
    for token, x in enumerate(logits):
        c = counts.get(token, 0)
        x = x - req.frequency * c - (req.presence if c else 0.0)
        if length < req.min_tokens and token in req.stop:
            x = float("-inf")
        if c and req.repetition != 1.0:
            x = x * req.repetition if x < 0 else x / req.repetition
        out.append(x)
    return out


def parents_to_pointers(parents: list[int]) -> tuple[list[int], list[int]]:
    """SGLang's first-child / next-sibling pointers of a tree given by its parent list (children in index order)."""
    n = len(parents)
    first, sibling = [-1] * n, [-1] * n
    last: dict[int, int] = {}
    for i in range(1, n):
        p = parents[i]
        if p in last:
            sibling[last[p]] = i
        else:
            first[p] = i
        last[p] = i
    return first, sibling
