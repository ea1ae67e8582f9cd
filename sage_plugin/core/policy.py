"""The tree-policy interface: :class:`TreePolicy`, its per-request state and plan, and the fixed-shape base.

A policy turns live draft probabilities into a draft tree, level by level, inside a node budget (the pool /
frontier machinery is :mod:`sage_plugin.core.level_expansion`).  A runtime drives it like this (``B`` requests)::

    state = policy.init_state(B, device)                          # once per batch of requests
    plan = policy.plan(state, root_logprobs)                      # once per round: per-request D / W
    pool, frontier = new_pool(root_tokens, policy.pool_capacity, policy.k)
    logprobs = root_logprobs[:, None]                             # [B, 1, V]
    for level in range(1, policy.max_depth + 1):
        frontier = policy.step(plan, pool, frontier, logprobs, level)
        if level == policy.max_depth or not frontier.valid.any(): break
        logprobs = draft(frontier)                                # one batched draft forward per level, [B, F, V]
    tree = policy.finalize(plan, pool)                            # DraftTree, [B, tree_capacity]
    ...verify...
    state = policy.observe(state, plan, tree, accepted_nodes, num_accepted, pool)   # alpha and history

The policies themselves: :mod:`.baselines` (``chain``, ``static``, ``eagle2``) and :mod:`.sage`; the registry that
maps ``policy`` names to them is :mod:`.policies`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import torch

from .controller import HistoryState, history_init
from .entropy import topk_confidence
from .level_expansion import DraftPool, Frontier, finalize
from .params import SageParams
from .tree import DraftTree

__all__ = ["FixedShapePolicy", "PolicyState", "RoundPlan", "TreePolicy"]


@dataclass(frozen=True, slots=True)
class PolicyState:
    """Per-request state carried between rounds (``[B]`` rows).

    Attributes:
        alpha: ``[B]`` float32 confidence carried to the next round (lag-1 / path-mean sources).
        first_round: ``[B]`` bool, the request has not finished a round yet.
        history: the adaptive-history controller state.
        planned: ``[B, C]`` int64 rank-path codes of the tree planned for the next round ("planned" topology, open
            point 8), -1 padding; ``C = 1`` and unused otherwise.
    """

    alpha: torch.Tensor
    first_round: torch.Tensor
    history: HistoryState
    planned: torch.Tensor

    def index(self, idx: torch.Tensor) -> PolicyState:
        """The rows ``idx [B']`` (requests that stay in the batch)."""
        return PolicyState(self.alpha[idx], self.first_round[idx], self.history.index(idx), self.planned[idx])

    @staticmethod
    def cat(states: list[PolicyState]) -> PolicyState:
        return PolicyState(
            torch.cat([s.alpha for s in states]),
            torch.cat([s.first_round for s in states]),
            HistoryState.cat([s.history for s in states]),
            torch.cat([s.planned for s in states]),
        )


@dataclass(frozen=True, slots=True)
class RoundPlan:
    """Per-request shape decisions of one round (all ``[B]``).

    Attributes:
        depth: int64 target depth D of this round's tree.
        width: int64 level-1 width W.
        alpha: float32 confidence used to pick D and W.
        root_alpha: float32 confidence of this round's root distribution.
        first_round: bool, use the static initial tree.
        planned: ``[B, C]`` int64 planned rank-path codes (see :class:`PolicyState`), or None.
    """

    depth: torch.Tensor
    width: torch.Tensor
    alpha: torch.Tensor
    root_alpha: torch.Tensor
    first_round: torch.Tensor
    planned: torch.Tensor | None = None


@runtime_checkable
class TreePolicy(Protocol):
    """What a runtime needs from a tree policy (the loop is in the module docstring).

    Sizes (host ints, fixed for the policy's lifetime, so buffers can be allocated once):
    ``k`` candidate children per expanded node; ``max_depth`` levels in any round; ``pool_capacity`` pool slots per
    request (root included); ``tree_capacity`` padded :class:`DraftTree` width (root included);
    ``frontier_capacity`` nodes per request fed to the draft per level.
    """

    name: str
    k: int
    max_depth: int
    pool_capacity: int
    tree_capacity: int
    frontier_capacity: int
    #: the policy uses a measured round cost (:mod:`sage_plugin.core.cost`) in ``finalize`` / ``keep_drafting``
    wants_cost: bool
    #: with ``wants_cost``: the runtime runs forwards at the cost's padded sizes (:meth:`RoundCost.verify_nodes`)
    pad_forwards: bool

    def init_state(self, batch: int, device: torch.device | str) -> PolicyState:
        """Fresh state for ``batch`` requests that have not drafted yet."""
        ...

    def plan(self, state: PolicyState, root_logprobs: torch.Tensor) -> RoundPlan:
        """This round's shape from ``state`` and ``root_logprobs [B, V]`` (draft log-softmax after the root)."""
        ...

    def step(
        self, plan: RoundPlan, pool: DraftPool, frontier: Frontier, logprobs: torch.Tensor, level: int,
        vocab: torch.Tensor | None = None,
    ) -> Frontier:  # fmt: skip
        """Add level ``level``'s nodes to ``pool`` (in place) from the frontier's ``logprobs [B, F, V]`` (over the
        token ids ``vocab [V]`` where given, else over the whole vocabulary: :func:`~.expand.propose`).

        Returns the next frontier ``[B, frontier_capacity]`` (pool indices, -1 padding): the kept nodes to expand.
        """
        ...

    def finalize(self, plan: RoundPlan, pool: DraftPool, round_ms: torch.Tensor | None = None) -> DraftTree:
        """The tree to verify, ``[B, tree_capacity]``; ``round_ms [N+1]`` is the round cost of verifying
        ``q = 0..N`` nodes (``N = pool_capacity - 1``) for a policy with ``wants_cost`` (else ignored)."""
        ...

    def keep_drafting(
        self, pool: DraftPool, level: int, round_ms: torch.Tensor, next_round_ms: torch.Tensor | None = None
    ) -> torch.Tensor:  # fmt: skip
        """0-dim bool: is another draft level worth its forward given ``round_ms [N+1]`` (and ``next_round_ms``, the
        round with that forward, where the caller prices it)?"""
        ...

    def observe(
        self,
        state: PolicyState,
        plan: RoundPlan,
        tree: DraftTree,
        accepted_nodes: torch.Tensor,
        num_accepted: torch.Tensor,
        pool: DraftPool | None = None,
    ) -> PolicyState:
        """State for the next round from ``accepted_nodes [B, D+1]`` (tree indices root-first, -1 padding) and
        ``num_accepted [B]`` (accepted draft tokens, bonus excluded)."""
        ...


class FixedShapePolicy:
    """Shared parts of every policy; alone, the behaviour of the fixed-shape baselines (no adaptive state).

    Subclasses set ``name`` and implement ``step``; the sizes come from the class methods
    :meth:`max_depth_for` / :meth:`max_nodes_for`, which :class:`~sage_plugin.config.AlgorithmConfig` also reads (one
    home for a policy's sizes).
    """

    name: ClassVar[str] = "base"
    wants_cost = False  # the baselines keep their published fixed shapes
    pad_forwards = False

    @classmethod
    def max_depth_for(cls, cfg: SageParams) -> int:
        """Deepest draft level any round can reach under ``cfg``."""
        raise NotImplementedError

    @classmethod
    def plan_depth_for(cls, cfg: SageParams) -> int:
        """Deepest draft level the policy's plan can reach (:meth:`max_depth_for` unless a reference-engine-only
        search grows deeper, as SAGE's beam does); what a runtime drafting its own fixed beam sizes its steps by."""
        return cls.max_depth_for(cfg)

    @classmethod
    def max_nodes_for(cls, cfg: SageParams) -> int:
        """Largest number of draft nodes (root excluded) in one request's tree under ``cfg``."""
        raise NotImplementedError

    @classmethod
    def uses_static_tree(cls, cfg: SageParams) -> bool:
        """Whether ``cfg.static_tree`` is drafted (its ranks must then fit ``cfg.k``)."""
        return False

    def __init__(self, cfg: SageParams) -> None:
        self.cfg = cfg
        self.k = cfg.k
        self.max_depth = self.max_depth_for(cfg)
        self.tree_capacity = self.max_nodes_for(cfg) + 1

    def init_state(self, batch: int, device: torch.device | str = "cpu") -> PolicyState:
        return PolicyState(
            alpha=torch.full((batch,), self.cfg.alpha_init, dtype=torch.float32, device=device),
            first_round=torch.ones(batch, dtype=torch.bool, device=device),
            history=history_init(batch, self.cfg.history_window, self.cfg.d_max, device),
            planned=torch.full((batch, 1), -1, dtype=torch.int64, device=device),
        )

    def plan(self, state: PolicyState, root_logprobs: torch.Tensor) -> RoundPlan:
        root_alpha = topk_confidence(root_logprobs, self.k)
        depth = torch.full_like(state.history.d_max, self.max_depth)
        return RoundPlan(depth, torch.full_like(depth, self.k), state.alpha, root_alpha, state.first_round)

    def observe(self, state, plan, tree, accepted_nodes, num_accepted, pool=None) -> PolicyState:
        return PolicyState(plan.root_alpha, torch.zeros_like(state.first_round), state.history, state.planned)

    def finalize(self, plan: RoundPlan, pool: DraftPool, round_ms: torch.Tensor | None = None) -> DraftTree:
        selected = torch.arange(pool.capacity + 1, device=pool.count.device) < pool.count[:, None]
        return finalize(pool, selected, self.max_depth, self.tree_capacity)

    def keep_drafting(self, pool: DraftPool, level: int, round_ms: torch.Tensor, next_round_ms=None) -> torch.Tensor:
        return torch.ones((), dtype=torch.bool, device=pool.count.device)
