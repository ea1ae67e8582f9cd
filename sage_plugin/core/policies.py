"""Tree policies behind one interface: ``sage``, ``eagle2``, ``static`` (SD-Tree), ``chain``.

A policy turns live draft probabilities into a draft tree, level by level, inside a node budget
(see :mod:`sage_plugin.core.expand` for the pool/frontier machinery).  The runtime drives it::

    plan = policy.plan(state, root_logprobs)                 # once per round, per request D/W
    pool, frontier = new_pool(root_tokens, policy.pool_capacity, policy.k)
    logprobs = root_logprobs[:, None]
    for level in range(1, policy.max_depth + 1):
        frontier = policy.step(plan, pool, frontier, logprobs, level)
        if level == policy.max_depth or no frontier: break
        logprobs = draft(frontier)                           # one batched draft forward per level
    tree = policy.finalize(plan, pool)
    ...verify...
    state = policy.observe(state, plan, tree, result)        # alpha (lag-1) and history controller

SAGE (arXiv 2602.00523, Eq. 10-12) with the recommended choices of SAGE_SPEC §2::

    D(alpha) = D_min + alpha (D_max_cur - D_min)        deep when confident
    W(alpha) = W_min + (1 - alpha)(W_max - W_min)       wide when unsure
    W_l = W (l = 1),  round(W (0.5 + P_parent) / l) (l >= 2), clamped to [1, k]
    theta_l = theta0 * l / D;  keep a candidate iff rank < W_l(parent) and P(node | parent) > theta_l
    (``threshold_on="joint"``: P(path) > theta_l, the paper's formal rule; see :mod:`sage_plugin.config`)
    best-first by joint probability under N_max; expand kept nodes while l < D

Example (k = 4, W = 2, D = 2, theta0 = 0.1 so theta_1 = 0.05, theta_2 = 0.1)::

    root  top-4: a .60, b .30, c .06, d .04     W_1 = 2            -> keep a, b
    a     top-4: e .90, f .05, ...              W_2 = round(2 * 1.1 / 2) = 1 -> e (.90 > .1; joint .54)
    b     top-4: g .50, h .40                   W_2 = round(2 * 0.8 / 2) = 1 -> g (.50 > .1; joint .15)
    tree: root -> a -> e, root -> b -> g   (4 draft nodes, the same under either threshold reading)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..config import SageConfig
from .controller import HistoryState, history_init, history_update
from .cost import best_count
from .entropy import topk_confidence
from .expand import NEG_INF, Candidates, DraftPool, Frontier, append, budget_top_n, finalize, new_pool, propose
from .tree import DraftTree, codes_of_choices, tree_from_choices

__all__ = [
    "PolicyState",
    "RoundPlan",
    "TreePolicy",
    "SagePolicy",
    "Eagle2Policy",
    "StaticPolicy",
    "ChainPolicy",
    "build_policy",
]


@dataclass(frozen=True, slots=True)
class PolicyState:
    """Per-request state carried between rounds (``[B]`` rows).

    Attributes:
        alpha: float32 confidence to use in the next round (lag-1 / path-mean sources).
        first_round: bool, the request has not finished a round yet.
        history: the adaptive-history controller state.
        planned: ``[B, C]`` int64 rank-path codes of the tree planned for the next round
            ("planned" topology, SAGE_SPEC §2 point 8), -1 padding; unused otherwise.
    """

    alpha: torch.Tensor
    first_round: torch.Tensor
    history: HistoryState
    planned: torch.Tensor

    def index(self, idx: torch.Tensor) -> "PolicyState":
        return PolicyState(self.alpha[idx], self.first_round[idx], self.history.index(idx), self.planned[idx])

    @staticmethod
    def cat(states: list["PolicyState"]) -> "PolicyState":
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
    """What a runtime needs from a tree policy (see module docstring for the loop)."""

    name: str
    k: int  # candidate children per expanded node
    max_depth: int  # host bound on levels in any round
    pool_capacity: int  # pool slots per request (root included)
    tree_capacity: int  # padded DraftTree width (root included)
    frontier_capacity: int  # nodes per request fed to the draft per level

    def init_state(self, batch: int, device: torch.device | str) -> PolicyState: ...

    def plan(self, state: PolicyState, root_logprobs: torch.Tensor) -> RoundPlan: ...

    def step(
        self, plan: RoundPlan, pool: DraftPool, frontier: Frontier, logprobs: torch.Tensor, level: int
    ) -> Frontier: ...

    def finalize(self, plan: RoundPlan, pool: DraftPool, round_ms: torch.Tensor | None = None) -> DraftTree: ...

    # Hardware-aware node budget (:mod:`sage_plugin.core.cost`): a runtime that measured its round cost passes
    # ``round_ms [N+1]`` (cost of verifying q = 0..N nodes after this round's draft forwards, N = pool_capacity - 1)
    # to ``finalize`` and asks ``keep_drafting`` after each level; policies with ``wants_cost = False`` ignore it.
    wants_cost: bool

    def keep_drafting(self, pool: DraftPool, level: int, round_ms: torch.Tensor) -> torch.Tensor: ...

    def observe(
        self,
        state: PolicyState,
        plan: RoundPlan,
        tree: DraftTree,
        accepted_nodes: torch.Tensor,
        num_accepted: torch.Tensor,
        pool: DraftPool | None = None,
    ) -> PolicyState: ...


def round_mode(x: torch.Tensor, mode: str) -> torch.Tensor:
    """Round a float tensor to int64: ``half_up`` (floor(x + 0.5)), ``ceil`` or ``floor``.

    >>> round_mode(torch.tensor([1.5, 2.5, 2.2]), "half_up")
    tensor([2, 3, 2])
    """
    if mode == "half_up":
        return torch.floor(x + 0.5).long()
    if mode == "ceil":
        return torch.ceil(x - 1e-6).long()
    return torch.floor(x + 1e-6).long()


class _Base:
    """Shared state handling: fixed-shape policies keep no adaptive state."""

    name = "base"
    wants_cost = False  # the baselines keep their published fixed shapes

    def __init__(self, cfg: SageConfig) -> None:
        self.cfg = cfg
        self.k = cfg.k

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

    def keep_drafting(self, pool: DraftPool, level: int, round_ms: torch.Tensor) -> torch.Tensor:
        return torch.ones((), dtype=torch.bool, device=pool.count.device)


class ChainPolicy(_Base):
    """SD-Chain: the draft's top-1 token at every level, ``chain_depth`` levels."""

    name = "chain"

    def __init__(self, cfg: SageConfig) -> None:
        super().__init__(cfg)
        self.max_depth = cfg.chain_depth
        self.pool_capacity = self.tree_capacity = cfg.chain_depth + 1
        self.frontier_capacity = 1

    def step(self, plan, pool, frontier, logprobs, level) -> Frontier:
        c = propose(pool, frontier, logprobs, self.k, level)
        keep = c.valid & (c.ranks == 0)
        return append(pool, c, keep, keep & (level < self.max_depth), c.joint, self.frontier_capacity)


class StaticPolicy(_Base):
    """SD-Tree: a fixed rank-path tree (default SpecVLM ``mc_sim_7b_63``), drafted with top-k."""

    name = "static"

    def __init__(self, cfg: SageConfig, choices=None) -> None:
        super().__init__(cfg)
        self.choices = tuple(tuple(p) for p in (choices or cfg.static_tree))
        codes = codes_of_choices(self.choices, self.k)
        internal = codes_of_choices({p[:-1] for p in self.choices if len(p) > 1}, self.k)
        self._codes = torch.tensor(sorted(codes), dtype=torch.int64)
        self._internal = torch.tensor(sorted(internal) or [-2], dtype=torch.int64)
        self.max_depth = max(len(p) for p in self.choices)
        self.pool_capacity = self.tree_capacity = len(self.choices) + 1
        _, depths, _ = tree_from_choices(self.choices)
        self.frontier_capacity = max(depths.count(d) for d in range(1, self.max_depth + 1))

    def select(self, c: Candidates) -> tuple[torch.Tensor, torch.Tensor]:
        codes = self._codes.to(c.codes.device)
        keep = c.valid & torch.isin(c.codes, codes)
        return keep, keep & torch.isin(c.codes, self._internal.to(c.codes.device))

    def step(self, plan, pool, frontier, logprobs, level) -> Frontier:
        c = propose(pool, frontier, logprobs, self.k, level)
        keep, expand = self.select(c)
        return append(pool, c, keep, expand, c.joint, self.frontier_capacity)


class Eagle2Policy(_Base):
    """EAGLE-2 dynamic tree: expand the top-k by joint probability per level, then rerank.

    Level 1 keeps the root's top-k; each later level proposes k children for each of the k
    frontier nodes (k^2 candidates, all pooled) and expands the k best by joint probability.
    Finalisation keeps the ``eagle_total_tokens`` best pool nodes by joint probability, which is
    ancestor-closed because joint probability never increases along a path.
    """

    name = "eagle2"

    def __init__(self, cfg: SageConfig) -> None:
        super().__init__(cfg)
        self.max_depth = cfg.eagle_depth
        self.frontier_capacity = cfg.k
        self.pool_capacity = 1 + cfg.k + (cfg.eagle_depth - 1) * cfg.k * cfg.k
        self.tree_capacity = cfg.eagle_total_tokens + 1

    def step(self, plan, pool, frontier, logprobs, level) -> Frontier:
        c = propose(pool, frontier, logprobs, self.k, level)
        expand = budget_top_n(c.valid.flatten(1), c.joint.flatten(1), torch.full_like(pool.count, self.k))
        expand = expand.view_as(c.valid) & (level < self.max_depth)
        return append(pool, c, c.valid, expand, c.joint, self.frontier_capacity)

    def finalize(self, plan: RoundPlan, pool: DraftPool, round_ms: torch.Tensor | None = None) -> DraftTree:
        filled = torch.arange(pool.capacity + 1, device=pool.count.device) < pool.count[:, None]
        score = torch.where(filled, pool.joint, NEG_INF)
        score[:, 0] = float("inf")  # the root always stays
        selected = budget_top_n(filled, score, torch.full_like(pool.count, self.tree_capacity))
        return finalize(pool, selected, self.max_depth, self.tree_capacity)


class SagePolicy(_Base):
    """SAGE: entropy-shaped depth/width per request plus the adaptive-history controller."""

    name = "sage"

    def __init__(self, cfg: SageConfig) -> None:
        super().__init__(cfg)
        self.static = StaticPolicy(cfg) if cfg.first_round_static else None
        self.max_depth = cfg.max_tree_depth
        self.tree_capacity = self.pool_capacity = cfg.max_tree_nodes + 1
        self.frontier_capacity = cfg.max_tree_nodes
        self.wants_cost = cfg.node_budget == "auto"

    def finalize(self, plan: RoundPlan, pool: DraftPool, round_ms: torch.Tensor | None = None) -> DraftTree:
        """All pool nodes; with ``node_budget="auto"`` and a measured ``round_ms``, the cost-optimal best-first cut."""
        if round_ms is None or not self.wants_cost:
            return super().finalize(plan, pool)
        keep = _cost_cut(pool, round_ms)
        selected = torch.cat([torch.ones_like(keep[:, :1]), keep, torch.zeros_like(keep[:, :1])], 1)
        return finalize(pool, selected, self.max_depth, self.tree_capacity)

    def keep_drafting(self, pool: DraftPool, level: int, round_ms: torch.Tensor) -> torch.Tensor:
        """0-dim bool: does the cost-optimal cut of the pool so far use a node of ``level``?

        If not, drafting the next level cannot pay either: its nodes are less probable than their parents, which
        the cut already leaves out.  (Without a node budget every level pays: always True.)
        """
        if not self.wants_cost:
            return super().keep_drafting(pool, level, round_ms)
        return (_cost_cut(pool, round_ms) & (pool.depths[:, 1:-1] == level)).any()

    def init_state(self, batch: int, device: torch.device | str = "cpu") -> PolicyState:
        state = super().init_state(batch, device)
        planned = torch.full((batch, self.tree_capacity), -1, dtype=torch.int64, device=device)
        return PolicyState(state.alpha, state.first_round, state.history, planned)

    def shape(self, alpha: torch.Tensor, history: HistoryState) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 10-11: depth ``D`` and width ``W`` per request from confidence and current D_max."""
        cfg = self.cfg
        d_max = history.d_max if cfg.use_history else torch.full_like(history.d_max, cfg.d_max)
        depth = round_mode(cfg.d_min + alpha * (d_max - cfg.d_min).float(), cfg.rounding).clamp(min=1)
        width = round_mode(cfg.w_min + (1.0 - alpha) * (cfg.w_max - cfg.w_min), cfg.rounding).clamp(1, self.k)
        return depth, width

    def plan(self, state: PolicyState, root_logprobs: torch.Tensor) -> RoundPlan:
        cfg = self.cfg
        root_alpha = topk_confidence(root_logprobs, self.k)
        if not cfg.use_entropy:
            alpha = torch.full_like(root_alpha, cfg.alpha_init)
        elif cfg.alpha_source == "fresh":
            alpha = root_alpha
        else:
            alpha = state.alpha
        depth, width = self.shape(alpha, state.history)
        first = state.first_round & (self.static is not None)
        if self.static is not None:
            depth = torch.where(first, self.static.max_depth, depth)
        planned = state.planned if cfg.topology == "planned" else None
        if planned is not None:  # the planned tree's own depth
            depth = torch.where(first, depth, _code_depth(planned, self.k).max(1).values.clamp(min=1))
        return RoundPlan(depth, width, alpha, root_alpha, first, planned)

    def select(
        self, plan: RoundPlan, pool: DraftPool, c: Candidates
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(keep, expand, insertion order)`` for one level's candidates (Eq. 10-12 + §2)."""
        cfg, lvl = self.cfg, c.level
        topk_space = cfg.prob_space == "topk"
        depth = plan.depth[:, None, None]
        if lvl == 1:
            w_l = plan.width[:, None, None].expand_as(c.ranks)
        else:
            if cfg.parent_prob == "joint":
                p_par = (c.parent_joint_topk if topk_space else c.parent_joint).exp()
            else:
                p_par = (c.parent_logp_topk if topk_space else c.parent_logp).exp()
            w_l = round_mode(plan.width[:, None, None] * (0.5 + p_par) / lvl, cfg.rounding)
            if cfg.clamp_level_width:
                w_l = w_l.clamp(min=1)
        if cfg.threshold_on == "joint":
            score = c.joint_topk if topk_space else c.joint
        else:
            score = c.logp_topk if topk_space else c.logp
        theta = cfg.theta0 * lvl / depth.float()
        eligible = c.valid & (c.ranks < w_l) & (score.exp() > theta) & (lvl <= depth)
        if cfg.keep_top1 and lvl == 1:
            eligible |= c.valid & (c.ranks == 0)
        if cfg.budget_order == "best_first":
            order = c.joint
        else:  # parent order: frontier slot, then rank (what a recursive DFS-like build fills first)
            f, k = c.ranks.shape[1], c.ranks.shape[2]
            order = -torch.arange(f * k, device=c.ranks.device, dtype=torch.float32).view(1, f, k).expand_as(c.joint)
        budget = cfg.n_max - (pool.count - 1)
        keep = budget_top_n(eligible.flatten(1), order.flatten(1), budget).view_as(eligible)
        return keep, keep & (lvl < depth), order

    def step(self, plan, pool, frontier, logprobs, level) -> Frontier:
        c = propose(pool, frontier, logprobs, self.k, level)
        if plan.planned is not None:  # replay the tree planned at the end of the last round
            planned = plan.planned[:, None, None, :]
            parents = torch.where(plan.planned > 0, (plan.planned - 1) // (self.k + 1), -1)[:, None, None, :]
            keep = c.valid & (c.codes[..., None] == planned).any(-1)
            expand, order = keep & (c.codes[..., None] == parents).any(-1), c.joint
        else:
            keep, expand, order = self.select(plan, pool, c)
        if self.static is not None:
            s_keep, s_expand = self.static.select(c)
            first = plan.first_round[:, None, None]
            keep, expand = torch.where(first, s_keep, keep), torch.where(first, s_expand, expand)
            order = torch.where(first, c.joint, order)
        return append(pool, c, keep, expand, order, self.frontier_capacity)

    def observe(self, state, plan, tree, accepted_nodes, num_accepted, pool=None) -> PolicyState:
        cfg = self.cfg
        if cfg.alpha_source == "path_mean":
            conf = tree.node_conf.gather(1, accepted_nodes.clamp(min=0))
            conf = torch.where(accepted_nodes >= 0, conf, float("nan"))
            alpha = torch.nanmean(conf, dim=1)
            alpha = torch.where(torch.isnan(alpha), plan.root_alpha, alpha)
        else:
            alpha = plan.root_alpha
        tau = num_accepted.float() + (1.0 if cfg.history_tau == "drafts_plus_bonus" else 0.0)
        history = state.history
        if cfg.use_history:
            history = history_update(
                history,
                tau,
                lo=cfg.history_lo,
                hi=cfg.history_hi,
                step=cfg.history_step,
                d_min=cfg.d_min,
                d_cap=cfg.d_cap,
                full_window_cooldown=cfg.history_cooldown == "full_window",
            )
        planned = state.planned
        if cfg.topology == "planned":
            if pool is None:
                raise ValueError("the planned topology needs the round's pool in observe()")
            planned = self._plan_next(alpha, history, pool)
        return PolicyState(alpha, torch.zeros_like(state.first_round), history, planned)

    def _plan_next(self, alpha: torch.Tensor, history: HistoryState, pool: DraftPool) -> torch.Tensor:
        """Literal Alg. 1 line 18: plan next round's rank-path tree from this round's draft outputs.

        Runs the same level-by-level SAGE selection over a virtual tree whose node distributions
        are this round's top-k draft distributions at the same rank path, or the root's where the
        path was not expanded this round.  Returns ``[B, C]`` planned codes (-1 padding).
        """
        bsz = alpha.shape[0]
        depth, width = self.shape(alpha, history)
        plan = RoundPlan(depth, width, alpha, alpha, torch.zeros_like(alpha, dtype=torch.bool))
        root = pool.topk_logp[:, 0]  # [B, K] sorted: as a k-token "vocabulary", token id = rank
        expanded = ~torch.isnan(pool.conf)
        vpool, front = new_pool(torch.zeros(bsz, dtype=torch.int64, device=alpha.device), self.pool_capacity, self.k)
        logprobs = root[:, None]
        for level in range(1, self.cfg.d_cap + 1):
            cand = propose(vpool, front, logprobs, self.k, level)
            keep, expand, order = self.select(plan, vpool, cand)
            front = append(vpool, cand, keep, expand, order, self.frontier_capacity)
            codes = vpool.codes.gather(1, front.idx.clamp(min=0))  # [B, F]
            same = (codes[..., None] == pool.codes[:, None, :]) & expanded[:, None, :]
            found = same.any(-1)
            src = same.float().argmax(-1)
            replay = pool.topk_logp.gather(1, src[..., None].expand(-1, -1, self.k))
            logprobs = torch.where(found[..., None], replay, root[:, None, :])
        filled = torch.arange(self.pool_capacity + 1, device=alpha.device) < vpool.count[:, None]
        return torch.where(filled, vpool.codes, -1)[:, : self.tree_capacity]


def _cost_cut(pool: DraftPool, round_ms: torch.Tensor) -> torch.Tensor:
    """``[B, P-1]`` bool over the pool's draft nodes (root and trash column dropped): the cost-optimal cut, i.e.
    each request's ``q*`` most probable nodes (:func:`~sage_plugin.core.cost.best_count`)."""
    filled = torch.arange(1, pool.capacity, device=pool.count.device) < pool.count[:, None]
    node_logp = torch.where(filled, pool.joint[:, 1:-1], NEG_INF)
    q = best_count(node_logp, round_ms)
    return budget_top_n(filled, node_logp, q.expand(pool.count.shape[0]))


def _code_depth(codes: torch.Tensor, k: int) -> torch.Tensor:
    """Depth of rank-path codes (0 for the root, -1 for padding), by repeated parent steps."""
    depth = torch.zeros_like(codes)
    cur = codes.clone()
    for _ in range(64):
        live = cur > 0
        depth = depth + live.long()
        cur = torch.where(live, (cur - 1) // (k + 1), cur)
    return torch.where(codes < 0, -1, depth)


def build_policy(cfg: SageConfig) -> TreePolicy:
    """The policy named by ``cfg.policy``."""
    return {"sage": SagePolicy, "eagle2": Eagle2Policy, "static": StaticPolicy, "chain": ChainPolicy}[cfg.policy](cfg)
