"""Sampling penalties on a draft tree: every node's logits penalised by the tokens along its own path.

Plain decoding penalises the logits of the next token by the tokens the request has generated so far (OpenAI's
``frequency_penalty`` / ``presence_penalty``, the multiplicative ``repetition_penalty``, and ``min_tokens``, which
forbids the stop tokens until that many were generated).  In a verified tree, node ``i``'s logits are those of the
token after the request's output *plus the drafted tokens on the path from the root to node i*, so its penalties
must count those tokens too; the root's penalties (what a speculative runtime that repeats one state over the tree
applies) are right for the root only.  With per-node penalties greedy verification accepts exactly the tokens plain
decoding emits, and lossless tree sampling draws every token from the same penalised distribution plain sampling
uses.

State, as runtimes keep it per request (SGLang's penalizers do), in *accumulator* form over the vocabulary:

* :class:`TokenPenalty` ``acc [B, V]`` after the request's tokens so far, and ``value [B, 1]``, what one more
  occurrence of a token writes into its column: added (``accumulate``, frequency: ``acc = f * count``) or set
  (presence: ``acc = p`` where ``count > 0``; repetition: ``acc = r`` where ``count > 0``, 1 elsewhere).
  Additive accumulators are subtracted from the logits; scaling ones divide positive logits and multiply negative
  ones.
* :class:`MinTokens`: ``stop [B, V]`` (``-inf`` at the request's stop tokens, 0 elsewhere) is added while
  ``length < minimum``.

Worked example (one request, vocabulary ``a b c d``, presence 0.5, ``min_tokens`` 3 with stop token ``d``, output
so far ``[a]``; tree ``root -> b -> a`` and ``root -> c``, nodes ``[root, b, a, c]``)::

    node  path tokens  presence acc (a b c d)   length  stop forbidden
    root  []           .5  0  0  0              1       yes
    b     [b]          .5 .5  0  0              2       yes
    a     [b, a]       .5 .5  0  0              3       no
    c     [c]          .5  0 .5  0              2       yes

Shapes: ``B`` requests, ``N`` nodes per request (node 0 the root, a parent before its children), ``V`` vocabulary,
logits rows request-major (``[B * N, V]``, row ``b * N + i``).  Every function is batched, runs on the device of its
inputs and never reads a tensor on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["MinTokens", "TokenPenalty", "advance", "path_tokens", "tree_parents", "tree_penalties"]


@dataclass(frozen=True)
class TokenPenalty:
    """A per-token penalty in accumulator form (module docstring).

    Attributes:
        value: ``[B, 1]`` float32, what one occurrence writes into a token's column.
        acc: ``[B, V]`` float32, the accumulator after the request's tokens so far.
        accumulate: True: an occurrence adds ``value`` (frequency); False: it sets ``value`` (presence, repetition).
    """

    value: torch.Tensor
    acc: torch.Tensor
    accumulate: bool


@dataclass(frozen=True)
class MinTokens:
    """``min_tokens``: the stop tokens are forbidden while fewer than ``minimum`` tokens were generated.

    Attributes:
        minimum: ``[B, 1]`` int, each request's ``min_tokens`` (0: none).
        stop: ``[B, V]`` float32, ``-inf`` at the request's stop tokens, 0 elsewhere.
        length: ``[B, 1]`` int, tokens generated so far.
    """

    minimum: torch.Tensor
    stop: torch.Tensor
    length: torch.Tensor


def tree_parents(next_token: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    """Each node's parent from first-child / next-sibling pointers (SGLang's ``retrieve_next_token`` /
    ``retrieve_next_sibling``).

    Args:
        next_token: ``[B, N]`` int, each node's first child (-1: none).
        next_sibling: ``[B, N]`` int, each node's next sibling (-1: none).

    Returns:
        ``[B, N]`` int64 parent index; -1 for the root and for any node no pointer reaches.

    A node's parent is the node whose first child heads its sibling chain; the chain heads are found by pointer
    doubling (``ceil(log2 N)`` gathers), so the cost does not grow with the tree's width.

    >>> nt = torch.tensor([[1, 3, -1, -1, -1]])  # root -> 1 -> 3; root -> 2 (1's sibling); 3 -> 4 (sibling)
    >>> ns = torch.tensor([[-1, 2, -1, 4, -1]])
    >>> tree_parents(nt, ns).tolist()
    [[-1, 0, 0, 1, 1]]
    """
    b, n = next_token.shape
    rows = torch.arange(b, device=next_token.device).unsqueeze(1)
    cols = torch.arange(n, device=next_token.device).expand(b, n)
    dump = torch.full((b, n + 1), -1, dtype=torch.int64, device=next_token.device)  # column n takes the -1s
    prev = dump.clone()
    prev[rows, torch.where(next_sibling >= 0, next_sibling.long(), n)] = cols  # prev[s] = c for next_sibling[c] = s
    owner = dump.clone()
    owner[rows, torch.where(next_token >= 0, next_token.long(), n)] = cols  # owner[first child] = its parent
    head = torch.where(prev[:, :n] >= 0, prev[:, :n], cols)  # one step towards the chain's head (a head: itself)
    for _ in range(max(n - 1, 1).bit_length()):
        head = head.gather(1, head)
    return owner.gather(1, head)


def path_tokens(parent: torch.Tensor, tokens: torch.Tensor, depth: int) -> torch.Tensor:
    """The drafted tokens on each node's path: its ancestors' below the root, and its own.

    Args:
        parent: ``[B, N]`` int64 from :func:`tree_parents` (the root's is -1).
        tokens: ``[B, N]`` int, each node's token (node 0's, the root's, is already in the request's output).
        depth: the deepest node's depth (a bound is enough).

    Returns:
        ``[B, N, depth]`` int64, node i's path tokens deepest first, -1 past its depth.

    >>> parent = torch.tensor([[-1, 0, 1, 0]])
    >>> path_tokens(parent, torch.tensor([[7, 8, 9, 5]]), 2).tolist()
    [[[-1, -1], [8, -1], [9, 8], [5, -1]]]
    """
    b, n = parent.shape
    node = torch.arange(n, device=parent.device).expand(b, n)
    out = torch.full((b, n, max(depth, 0)), -1, dtype=torch.int64, device=tokens.device)
    for d in range(depth):
        below_root = node > 0
        at = node.clamp(min=0)
        out[:, :, d] = torch.where(below_root, tokens.long().gather(1, at), -1)
        node = torch.where(below_root, parent.gather(1, at), -1)
    return out


def advance(acc: torch.Tensor, tokens: torch.Tensor, value: torch.Tensor, *, accumulate: bool) -> None:
    """Feed ``tokens`` to a :class:`TokenPenalty` accumulator in place (a row's tokens in any order).

    Args:
        acc: ``[R, V]`` float32 accumulator.
        tokens: ``[R, L]`` int, the tokens of each row, -1 pad.
        value: ``[R, 1]`` float32, what an occurrence writes.
        accumulate: add ``value`` per occurrence (frequency), or set it (presence, repetition).

    >>> acc = torch.zeros(1, 4)
    >>> advance(acc, torch.tensor([[2, 2, -1]]), torch.tensor([[0.5]]), accumulate=True)
    >>> acc.tolist()
    [[0.0, 0.0, 1.0, 0.0]]
    """
    real = tokens >= 0
    index = tokens.long().clamp(min=0)
    if accumulate:
        acc.scatter_add_(1, index, torch.where(real, value, 0.0).to(acc.dtype))
        return
    hits = torch.zeros_like(acc).scatter_add_(1, index, real.to(acc.dtype))  # a pad adds 0: no collision
    acc.copy_(torch.where(hits > 0, value.to(acc.dtype), acc))


def _expand(x: torch.Tensor, n: int) -> torch.Tensor:
    return torch.repeat_interleave(x, n, dim=0)


def tree_penalties(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    *,
    additive: Sequence[TokenPenalty | MinTokens] = (),
    scaling: Sequence[TokenPenalty] = (),
) -> None:
    """Apply each node's own penalties to a tree's logits, in place.

    Args:
        logits: ``[B * N, V]`` float, node rows request-major.
        tokens: ``[B, N, L]`` int, the tokens each node's row adds to its request's state (-1 pad): its path tokens
            (:func:`path_tokens`), after any of the request's output the state has not seen yet.
        additive: the subtracted accumulators and ``min_tokens``, summed in this order (a runtime passes its own).
        scaling: the multiplicative accumulators, multiplied together in this order.

    The result equals applying the request's state advanced by the row's tokens to each row alone, which is what
    plain decoding applies after emitting those tokens (``tests/oracles`` checks it against a per-node loop).
    """
    b, n, length = tokens.shape
    rows = tokens.reshape(b * n, length)
    if additive:
        total = torch.zeros_like(logits, dtype=torch.float32)
        for term in additive:
            if isinstance(term, MinTokens):
                seen = _expand(term.length, n) + (rows >= 0).sum(dim=1, keepdim=True)
                total.add_(torch.where(seen < _expand(term.minimum, n), _expand(term.stop, n), 0.0))
                continue
            acc = _expand(term.acc, n)  # a new tensor: the request's state is left as it is
            advance(acc, rows, _expand(term.value, n), accumulate=term.accumulate)
            total.sub_(acc)
        logits.add_(total.to(logits.dtype))
    if scaling:
        scale = None
        for term in scaling:
            acc = _expand(term.acc, n)
            advance(acc, rows, _expand(term.value, n), accumulate=term.accumulate)
            scale = acc if scale is None else scale.mul_(acc)
        logits.copy_(torch.where(logits < 0, logits * scale, logits / scale))
