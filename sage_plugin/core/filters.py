"""Target sampling filters: top-k, top-p (nucleus) and min-p, each runtime's boundary rule a parameter.

Lossless speculative sampling follows the target's *filtered* distribution, so the speculative path must filter
exactly as the runtime's plain sampler does, ties included; the runtimes differ at the boundaries, so each rule is a
parameter here rather than a second implementation:

* **top-k** ``ties``: ``True`` keeps every token scoring at least the k-th score (transformers' ``TopKLogitsWarper``,
  the reference engine); ``False`` keeps exactly the first ``k`` of a stable descending sort (SGLang's torch sampler:
  rank ``< k``).
* **top-p** ``boundary``: in descending order with ``before`` the mass strictly above a token, ``"reach"`` drops it
  once ``before >= p`` (the smallest prefix whose mass reaches ``p``: transformers' ``TopPLogitsWarper``, the reference
  engine) and ``"exceed"`` once ``before > p`` (SGLang's torch sampler, ``probs_sum - probs_sort > top_ps``).  They
  differ only at a tie, ``before == p`` exactly, where ``"exceed"`` keeps one more token.
* **min-p**: a token below ``min_p`` times the row's largest probability is dropped (SGLang's samplers).

How top-k and top-p combine is the caller's: transformers and SGLang's fused GPU sampler under min-p filter top-p on
the top-k-renormalised distribution; SGLang's plain samplers otherwise filter both on the unfiltered distribution and
keep the intersection (``runtimes/sglang/penalties.py`` makes SAGE's verify do the same).  Each function returns a
``keep`` mask of the scores' shape; :func:`renormalise` applies one.

Shapes: ``scores`` / ``probs`` ``[..., V]``; ``k``, ``p``, ``min_p`` broadcast against ``[..., 1]``.

Worked example (``probs = [0.5, 0.25, 0.25]``, ``p = 0.5``): ``before = [0, 0.5, 0.75]``; ``"reach"`` keeps
``[True, False, False]``, ``"exceed"`` keeps ``[True, True, False]`` (the second token's ``before`` equals ``p``).
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = ["TOP_P_BOUNDARIES", "min_p_keep", "renormalise", "top_k_keep", "top_p_keep"]

#: the top-p boundary rules (module docstring)
TOP_P_BOUNDARIES = ("reach", "exceed")


def _scatter_sorted(keep_sorted: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """A mask over sorted positions back in vocabulary order."""
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def top_k_keep(scores: torch.Tensor, k: torch.Tensor, ties: bool) -> torch.Tensor:
    """Keep mask of the ``k`` best tokens per row (``k <= 0`` or ``>= V``: every token); ``ties`` as above."""
    vocab = scores.shape[-1]
    kk = torch.where((k <= 0) | (k > vocab), vocab, k).to(torch.long)
    if ties:
        kth = torch.sort(scores, dim=-1, descending=True).values.gather(-1, (kk - 1).expand(*scores.shape[:-1], 1))
        return scores >= kth
    order = scores.argsort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(vocab, device=scores.device)
    return _scatter_sorted(ranks < kk, order)


def top_p_keep(probs: torch.Tensor, p: torch.Tensor, boundary: Literal["reach", "exceed"]) -> torch.Tensor:
    """Keep mask of each row's nucleus of mass ``p`` under ``boundary`` (``p >= 1``: every token).

    ``p >= 1`` is never compared: a float32 cumulative sum reaches 1.0 before the vocabulary's tail.
    """
    if boundary not in TOP_P_BOUNDARIES:
        raise ValueError(f"boundary one of {TOP_P_BOUNDARIES}, got {boundary!r}")
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    before = sorted_p.cumsum(-1) - sorted_p  # the mass strictly above each token
    p = p.to(probs.dtype)
    keep_sorted = (before < p if boundary == "reach" else before <= p) | (p >= 1.0)
    return _scatter_sorted(keep_sorted, order)


def min_p_keep(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Keep mask of the tokens at least ``min_p`` times their row's largest probability."""
    return probs >= probs.amax(dim=-1, keepdim=True) * min_p.to(probs.dtype)


def renormalise(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``probs`` with the tokens outside ``keep`` zeroed, each row summing to 1 again."""
    out = torch.where(keep, probs, torch.zeros((), dtype=probs.dtype, device=probs.device))
    return out / out.sum(-1, keepdim=True)
