"""Calibrated path values: a node's acceptance probability read from a fitted table, not its draft probability.

SAGE ranks nodes (best-first budget, the device cost cut's expected yield) by their path probability, the product of
the draft's conditional probabilities from the root, which EAGLE-2 observed is roughly the probability that greedy
verification accepts the path.  Roughly: a draft is over- or under-confident, and differently so when its
distribution is flat.  ``calibration`` replaces each factor by the measured acceptance rate of draft tokens with that
probability drawn from a distribution of that confidence alpha:

    value(node) = value(parent) * c[alpha bin of the parent's distribution][probability bin of the node]

with ``A`` alpha bins and ``P`` probability bins of equal width over ``[0, 1]`` (row ``a`` holds alphas in
``[a/A, (a+1)/A)``, the last bin closed).  A node is accepted when its parent is and the target's next token equals
it, and a draft that reads the accepted path sees exactly the context it would see teacher-forced on the target's
output, so the table is fitted offline from one teacher-forced draft pass over plain-decoding outputs
(:func:`fit_calibration`; ``sage calibrate``); depth adds nothing for a draft model that reads tokens (an EAGLE head
reading its own hidden states would need a depth axis).  Values lie in ``(0, 1]`` so a path's value never increases
along it (the best-first cuts stay ancestor-closed) and are non-decreasing in probability within a row.

Worked example (``A = 1``, ``P = 4``: one row ``[0.05, 0.2, 0.5, 0.9]``): a node of draft probability 0.6 under a
parent of value 0.8 gets value ``0.8 * 0.5 = 0.4`` (bin 2 covers ``[0.5, 0.75)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["calibrated_logp", "calibration_log_table", "fit_calibration", "calibration_bin"]


def calibration_bin(x: float, bins: int) -> int:
    """The bin of ``x`` in ``[0, 1]`` among ``bins`` equal bins (the last one closed): the rule of the table."""
    return min(max(int(x * bins), 0), bins - 1)


def calibration_log_table(table: Sequence[Sequence[float]], device: torch.device | str) -> torch.Tensor:
    """``[A, P]`` float32 log of a calibration table (config ``calibration``)."""
    return torch.tensor(table, dtype=torch.float32, device=device).log()


def calibrated_logp(log_table: torch.Tensor, logp: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Calibrated log value factor of each candidate (sync-free gather).

    Args:
        log_table: ``[A, P]`` from :func:`calibration_log_table`.
        logp: ``[...]`` the candidates' full-softmax conditional draft log-probabilities (-inf: impossible).
        alpha: ``[...]`` (broadcastable) confidence of the distribution each candidate was drawn from (NaN: 0.5).

    Returns:
        ``[...]`` float32 ``log c[alpha bin][probability bin]``, -inf where ``logp`` is -inf.
    """
    a_bins, p_bins = log_table.shape
    # the bin products in float64: in float32, 0.9f * 10 rounds up to 9.0 although 0.9f (0.8999999762) lies in bin 8
    a = (alpha.nan_to_num(0.5).double() * a_bins).long().clamp(0, a_bins - 1)
    p = (logp.exp().double() * p_bins).long().clamp(0, p_bins - 1)
    a, p = torch.broadcast_tensors(a, p)
    out = log_table[a, p]
    return torch.where(torch.isneginf(logp), logp, out)


def _pav(rates: list[float], weights: list[float]) -> list[float]:
    """Weighted isotonic (non-decreasing) regression by pool-adjacent-violators."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for r, w in zip(rates, weights, strict=True):
        blocks.append([r, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [v for v, _, n in blocks for _ in range(n)]


def fit_calibration(
    alpha: Sequence[float], prob: Sequence[float], accepted: Sequence[bool], alpha_bins: int = 4,
    prob_bins: int = 10, prior: float = 4.0, floor: float = 1e-3,
) -> tuple[tuple[float, ...], ...]:  # fmt: skip
    """Fit a calibration table from observed candidates.

    Args:
        alpha, prob, accepted: per candidate, the confidence of its parent's distribution, its draft probability,
            and whether the target's next token was it.
        alpha_bins, prob_bins: table size.
        prior: pseudo-observations per bin at the identity (the bin's centre probability), so empty or thin bins
            stay near the draft's own probability.
        floor: smallest value (a value of 0 would make a path impossible).

    Returns:
        ``alpha_bins`` rows of ``prob_bins`` values in ``[floor, 1]``, non-decreasing along each row.
    """
    n = [[0.0] * prob_bins for _ in range(alpha_bins)]
    hits = [[0.0] * prob_bins for _ in range(alpha_bins)]
    for a, p, ok in zip(alpha, prob, accepted, strict=True):
        i = calibration_bin(0.5 if math.isnan(a) else a, alpha_bins)
        j = calibration_bin(p, prob_bins)
        n[i][j] += 1.0
        hits[i][j] += 1.0 if ok else 0.0
    rows = []
    for i in range(alpha_bins):
        centre = [(j + 0.5) / prob_bins for j in range(prob_bins)]
        rates = [(hits[i][j] + prior * centre[j]) / (n[i][j] + prior) for j in range(prob_bins)]
        fitted = _pav(rates, [n[i][j] + prior for j in range(prob_bins)])
        rows.append(tuple(round(min(1.0, max(floor, v)), 4) for v in fitted))
    return tuple(rows)
