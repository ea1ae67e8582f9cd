"""Normalised top-k entropy and the confidence alpha (SAGE Eq. 7-9).

    P~_i = P_i / sum_{j in Top_k} P_j            (7)
    H    = - sum_i P~_i log P~_i                 (8)
    alpha = 1 - H / log k   in [0, 1]            (9)

All functions are batched over any leading dimensions and never synchronise with the host.
"""

from __future__ import annotations

import math

import torch

__all__ = ["root_confidence", "topk_confidence", "topk_entropy"]


def topk_entropy(logprobs: torch.Tensor, k: int) -> torch.Tensor:
    """Entropy of the top-k renormalised distribution (Eq. 7-8).

    Args:
        logprobs: ``[..., V]`` float, log-probabilities (or unnormalised logits: the top-k
            renormalisation makes the result invariant to an additive constant).
        k: number of top tokens kept, ``2 <= k <= V``.

    Returns:
        ``[...]`` float32 entropy in nats, in ``[0, log k]``.

    >>> round(float(topk_entropy(torch.log(torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0])), 4)), 4)
    1.3863
    """
    top = torch.topk(logprobs.float(), k, dim=-1).values
    logq = torch.log_softmax(top, dim=-1)  # renormalise over the top-k (Eq. 7)
    q = logq.exp()
    return -(q * torch.nan_to_num(logq, neginf=0.0)).sum(-1)


def topk_confidence(logprobs: torch.Tensor, k: int) -> torch.Tensor:
    """Confidence ``alpha = 1 - H(P~)/log k`` (Eq. 9), batched.

    Args:
        logprobs: ``[..., V]`` float log-probabilities or logits.
        k: top-k size.

    Returns:
        ``[...]`` float32 in ``[0, 1]``: 1 for a one-hot draft, 0 for a flat top-k.

    >>> topk_confidence(torch.tensor([[0.0, 0.0, 0.0], [0.0, -1e9, -1e9]]), 3)
    tensor([0., 1.])
    """
    return (1.0 - topk_entropy(logprobs, k) / math.log(k)).clamp_(0.0, 1.0)


def root_confidence(root_probs: torch.Tensor, k: int) -> torch.Tensor:
    """Alpha of each request's root from the top probabilities a runtime keeps (SGLang's ``topk_p``).

    Args:
        root_probs: ``[B, t]`` the draft's ``t`` highest next-token probabilities per request.
        k: the configured top-k; the renormalisation uses ``min(k, t)`` of them.

    Returns:
        ``[B]`` float32 alpha (Eq. 9).

    >>> root_confidence(torch.tensor([[0.5, 0.5, 0.0, 0.0]]), 10)
    tensor([0.5000])
    """
    return topk_confidence(root_probs.float().clamp(min=1e-30).log(), min(k, root_probs.shape[1]))
