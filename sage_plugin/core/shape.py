"""The SAGE shape rules (arXiv 2602.00523, Eq. 9-12), each written once.

Every consumer of SAGE calls these functions: the online tree policy (:mod:`.sage`, one level of live draft
candidates at a time), the selection inside a fixed draft beam (:mod:`.beam_selection`, SGLang) and the per-slot serving
state (:mod:`.slots`).  The naive oracle of the same rules is ``tests/oracles/rules.py``.

* :func:`choose_alpha`: which confidence shapes a round (open point 1: ``lag1`` / ``fresh`` / ``path_mean``;
  ``use_entropy=False`` pins ``alpha_init``).
* :func:`plan_shape`: Eq. 10-11, depth ``D`` and width ``W`` from alpha and the history controller's ``D_max``::

      D = round(D_min + alpha (D_max - D_min)),  >= 1         deep when confident
      W = round(W_min + (1 - alpha)(W_max - W_min)), in [1, k] wide when unsure

* :func:`level_keep`: Eq. 12 and the inclusion rule of one level ``l`` (open points 2-7)::

      W_l = W (l = 1),   round(W (0.5 + P_parent) / l) (l >= 2, clamped to >= 1)
      theta_l = theta0 l / D
      eligible iff rank < W_l(parent)  and  score > theta_l  and  l <= D   (score: the node's own probability,
      or its path's with threshold_on=joint), plus the root's rank-0 child with keep_top1;
      kept = the eligible candidates best-first by path probability (or in parent order) while < N_max nodes.

Worked example (k = 4, D = 2, W = 2, theta0 = 0.1, so theta_1 = 0.05 and theta_2 = 0.1)::

    level 1, root top-4: a .60, b .30, c .06, d .04       W_1 = 2              -> keep a, b
    level 2, a's top-4: e .90, f .05                      W_2 = round(2 * 1.1 / 2) = 1 -> e (.90 > .1)
             b's top-4: g .50, h .40                      W_2 = round(2 * 0.8 / 2) = 1 -> g (.50 > .1)
    tree: root -> a -> e, root -> b -> g
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .level_expansion import budget_top_n
from .params import SageParams

__all__ = ["LevelProbs", "budget_key", "choose_alpha", "in_prob_space", "level_keep", "plan_shape", "round_mode"]


def round_mode(x: torch.Tensor, mode: str) -> torch.Tensor:
    """Round a float tensor to int64 (open point 2): ``half_up`` (floor(x + 0.5)), ``ceil`` or ``floor``.

    ``ceil`` / ``floor`` treat a value within 1e-6 of an integer as that integer.

    >>> round_mode(torch.tensor([1.5, 2.5, 2.2]), "half_up")
    tensor([2, 3, 2])
    """
    if mode == "half_up":
        return torch.floor(x + 0.5).long()
    if mode == "ceil":
        return torch.ceil(x - 1e-6).long()
    return torch.floor(x + 1e-6).long()


def choose_alpha(cfg: SageParams, carried: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
    """``[B]`` confidence that shapes this round (Eq. 9 and open point 1).

    Args:
        cfg: ``use_entropy``, ``alpha_source``, ``alpha_init``.
        carried: ``[B]`` float32 alpha carried from the previous round (``lag1``: its root's; ``path_mean``: the
            mean over its accepted path).
        fresh: ``[B]`` float32 alpha of this round's root distribution.

    >>> from types import SimpleNamespace
    >>> choose_alpha(SimpleNamespace(use_entropy=True, alpha_source="fresh"), torch.tensor([0.2]), torch.tensor([0.9]))
    tensor([0.9000])
    """
    if not cfg.use_entropy:
        return torch.full_like(fresh, cfg.alpha_init)
    if cfg.alpha_source == "fresh":
        return fresh
    return carried


def plan_shape(cfg: SageParams, alpha: torch.Tensor, d_max: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 10-11: ``(depth, width)``, each ``[B]`` int64, from ``alpha [B]`` and the controller's ``d_max [B]``.

    With ``use_history=False`` the configured ``d_max`` replaces the controller's.

    >>> from types import SimpleNamespace
    >>> p = SimpleNamespace(use_history=True, d_min=3, w_min=2, w_max=10, k=10, rounding="half_up")
    >>> plan_shape(p, torch.tensor([0.0, 1.0]), torch.tensor([8, 8]))
    (tensor([3, 8]), tensor([10,  2]))
    """
    if not cfg.use_history:
        d_max = torch.full_like(d_max, cfg.d_max)
    depth = round_mode(cfg.d_min + alpha * (d_max - cfg.d_min).float(), cfg.rounding).clamp(min=1)
    width = round_mode(cfg.w_min + (1.0 - alpha) * (cfg.w_max - cfg.w_min), cfg.rounding).clamp(1, cfg.k)
    return depth, width


def in_prob_space(cfg: SageParams, full: torch.Tensor, topk: torch.Tensor) -> torch.Tensor:
    """The tensor of the configured probability space (open point 5): ``full`` softmax or ``topk`` renormalised."""
    return topk if cfg.prob_space == "topk" else full


class LevelProbs(NamedTuple):
    """Probabilities of one level's candidates, each ``[B, X]`` float, in the configured ``prob_space``.

    Attributes:
        cond: the candidate's own (conditional) draft probability given its parent.
        joint: its path probability (product of ``cond`` from the root).
        parent_cond: its parent's conditional probability (read for ``l >= 2`` only).
        parent_joint: its parent's path probability (read for ``l >= 2`` only).
    """

    cond: torch.Tensor
    joint: torch.Tensor
    parent_cond: torch.Tensor
    parent_joint: torch.Tensor


def budget_key(cfg: SageParams, best_first_key: torch.Tensor) -> torch.Tensor:
    """``[B, X]`` priority of candidates under ``N_max`` (open point 6), higher first.

    ``best_first``: ``best_first_key`` (any increasing function of the path probability); ``parent_order``: the
    candidate's position (frontier slot, then rank: what a recursive build fills first).
    """
    if cfg.budget_order == "best_first":
        return best_first_key
    x = best_first_key.shape[-1]
    return -torch.arange(x, device=best_first_key.device, dtype=torch.float32).expand_as(best_first_key)


def level_keep(
    cfg: SageParams,
    level: int,
    candidate: torch.Tensor,
    ranks: torch.Tensor,
    probs: LevelProbs,
    key: torch.Tensor,
    depth: torch.Tensor,
    width: torch.Tensor,
    num_kept: torch.Tensor,
) -> torch.Tensor:
    """``[B, X]`` bool: the candidates of level ``level`` that SAGE keeps (Eq. 12 and the inclusion rule).

    Args:
        cfg: ``parent_prob``, ``threshold_on``, ``rounding``, ``clamp_level_width``, ``keep_top1``, ``theta0``,
            ``n_max``.
        level: ``l >= 1``.
        candidate: ``[B, X]`` bool, the slot holds a candidate of this level whose parent was kept and expanded.
        ranks: ``[B, X]`` int64 rank among the parent's children (0 = most likely).
        probs: :class:`LevelProbs`.
        key: ``[B, X]`` priority under the node cap (:func:`budget_key`).
        depth: ``[B]`` int64 planned ``D``.
        width: ``[B]`` int64 planned ``W``.
        num_kept: ``[B]`` int64 draft nodes already kept this round (``N_max - num_kept`` remain).
    """
    if level == 1:
        w_l = width[:, None].expand_as(ranks)
    else:
        p_parent = probs.parent_joint if cfg.parent_prob == "joint" else probs.parent_cond
        w_l = round_mode(width[:, None] * (0.5 + p_parent) / level, cfg.rounding)
        if cfg.clamp_level_width:
            w_l = w_l.clamp(min=1)
    score = probs.joint if cfg.threshold_on == "joint" else probs.cond
    d = depth[:, None]
    theta = cfg.theta0 * level / d.float()
    eligible = candidate & (ranks < w_l) & (score > theta) & (level <= d)
    if cfg.keep_top1 and level == 1:
        eligible |= candidate & (ranks == 0)
    return budget_top_n(eligible, key, cfg.n_max - num_kept)
