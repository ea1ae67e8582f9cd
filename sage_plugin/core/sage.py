"""SAGE's tree policy: entropy-shaped depth and width per request, plus the adaptive-history controller.

Per round and request: alpha (:func:`~.shape.choose_alpha`) sets ``D`` and ``W`` (:func:`~.shape.plan_shape`,
Eq. 10-11); each level keeps the candidates :func:`~.shape.level_keep` admits (Eq. 12, ``theta_l``, ``N_max``) and
expands them while ``l < D``.  Options around the paper's rules (``docs/design/algorithm.md``):

* ``first_round_static``: a request's first round drafts the static tree (SAGE Appendix A.1);
* ``topology="planned"``: replay the tree planned at the end of the previous round (:mod:`.planned`);
* ``node_budget="auto"``: with a measured round cost, verify only the cost-optimal best-first cut and stop drafting
  levels it would not use (:func:`~.cost.cost_cut`).

Worked example: :mod:`sage_plugin.core.shape`.
"""

from __future__ import annotations

from collections import Counter

import torch

from .baselines import StaticPolicy, rerank
from .beam_level import beam_level
from .beam_level import level_pays as fused_level_pays
from .calibration import calibration_log_table
from .controller import observe_history
from .cost import cost_cut, level_pays
from .entropy import topk_confidence
from .level_expansion import Candidates, DraftPool, Frontier, append, best_nodes, budget_top_n, finalize_nodes, propose
from .params import SageParams
from .planned_topology import code_depth, plan_next_tree, planned_selection
from .policy import FixedShapePolicy, PolicyState, RoundPlan
from .shape import LevelProbs, budget_key, choose_alpha, in_prob_space, level_keep, plan_shape
from .tree import DraftTree

__all__ = ["SagePolicy", "pool_of", "sage_level_selection"]


def pool_of(cfg: SageParams) -> str:
    """The pool SAGE builds (``rerank_pool``): ``kept`` under ``topology: planned``, whose replay keeps the planned
    tree whatever ``rerank_pool`` says."""
    return "kept" if cfg.topology == "planned" else cfg.rerank_pool


def sage_level_selection(
    cfg: SageParams, plan: RoundPlan, pool: DraftPool, c: Candidates
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(keep, expand, insertion order)``, each ``[B, F, K]``, for one level's live candidates (Eq. 10-12).

    ``N_max`` counts the pool's nodes, or with ``rerank_pool`` ``children`` / ``beam`` (every child pooled) the
    nodes drafted so far (their own draft distribution is known: ``pool.conf`` set), root excluded.
    """
    lp = lambda full, topk: in_prob_space(cfg, full, topk).exp().flatten(1)  # noqa: E731
    probs = LevelProbs(
        lp(c.logp, c.logp_topk),
        lp(c.joint, c.joint_topk),
        lp(c.parent_logp, c.parent_logp_topk),
        lp(c.parent_joint, c.parent_joint_topk),
    )
    order = budget_key(cfg, c.joint.flatten(1))
    chosen = pool.count if pool_of(cfg) == "kept" else (~torch.isnan(pool.conf[:, :-1])).sum(1)
    keep = level_keep(
        cfg, c.level, c.valid.flatten(1), c.ranks.flatten(1), probs, order, plan.depth, plan.width, chosen - 1
    ).view_as(c.valid)
    return keep, keep & (c.level < plan.depth[:, None, None]), order.view_as(c.joint)


def _in_top(pool: DraftPool, frontier: Frontier, n: int, width: int) -> Frontier:
    """The first ``width`` frontier nodes (in frontier order) among the pool's ``n`` best by path value.

    Pruning the others loses nothing: a child's value is at most its parent's and the pool's ``n``-th best value
    only rises, so no descendant of a node outside the ``n`` best can enter the final ``n`` best.
    """
    top = best_nodes(pool, torch.full_like(pool.count, n))  # over pool indices 1 .. P-1 (a frontier node is >= 1)
    ok = frontier.valid & top.gather(1, (frontier.idx - 1).clamp(min=0))
    pack = torch.sort((~ok).long(), dim=1, stable=True).indices
    return Frontier(torch.where(ok, frontier.idx, -1).gather(1, pack)[:, :width])


def _or_first_tree(cfg: SageParams, depth: int) -> int:
    """``depth``, or the static first round's tree depth where that round is drafted and deeper."""
    return max(depth, StaticPolicy.max_depth_for(cfg) if cfg.first_round_static else 0)


class SagePolicy(FixedShapePolicy):
    """SAGE: entropy-shaped depth/width per request plus the adaptive-history controller."""

    name = "sage"

    @classmethod
    def max_depth_for(cls, cfg: SageParams) -> int:
        """The plan's depth (:meth:`plan_depth_for`), or with ``rerank_pool: beam`` the beam's ``beam_depth``."""
        if pool_of(cfg) != "beam":
            return cls.plan_depth_for(cfg)
        return _or_first_tree(cfg, cfg.beam_depth)

    @classmethod
    def plan_depth_for(cls, cfg: SageParams) -> int:
        """``d_cap`` with the history controller (``d_max`` without), or the static first tree's depth if deeper."""
        return _or_first_tree(cfg, cfg.d_cap if cfg.use_history else cfg.d_max)

    @classmethod
    def pool_nodes_for(cls, cfg: SageParams) -> int:
        """Draft nodes a round can build (root excluded): ``n_max``, or the static first tree if larger; with
        ``rerank_pool="children"`` the k children of at most k expanded nodes per level."""
        # children / beam: at most pooled_width_for(cfg) nodes of a level grow, each proposing k children
        pooled = cfg.k * (1 + (cls.max_depth_for(cfg) - 1) * cls.pooled_width_for(cfg))
        built = cfg.n_max if pool_of(cfg) == "kept" else pooled
        return max(built, StaticPolicy.max_nodes_for(cfg) if cfg.first_round_static else 0)

    @classmethod
    def pooled_width_for(cls, cfg: SageParams) -> int:
        """Nodes of one level that grow under ``rerank_pool`` children / beam: ``k``, or the static first tree's
        widest level if wider."""
        static = max(Counter(len(p) for p in cfg.static_tree).values()) if cfg.first_round_static else 0
        return max(cfg.k, static)

    @classmethod
    def max_nodes_for(cls, cfg: SageParams) -> int:
        built = cls.pool_nodes_for(cfg)
        total = cls.rerank_total(cfg)
        return min(built, total) if total else built

    @staticmethod
    def rerank_total(cfg: SageParams) -> int:
        """Nodes the final rerank keeps: ``rerank_nodes``, else ``n_max`` for a pooled ``rerank_pool``, else 0 (none)."""
        return cfg.rerank_nodes or (cfg.n_max if pool_of(cfg) != "kept" else 0)

    @classmethod
    def uses_static_tree(cls, cfg: SageParams) -> bool:
        return cfg.first_round_static

    def __init__(self, cfg: SageParams, fused: bool = True) -> None:
        """``fused``: run the beam pool's levels (:meth:`_fused_step`) and the levels' cost check
        (:meth:`keep_drafting`) through the CPU kernels where they apply (False: always operator by operator, the
        tests' oracle)."""
        super().__init__(cfg)
        self.static = StaticPolicy(cfg) if cfg.first_round_static else None
        self.pool_capacity = self.pool_nodes_for(cfg) + 1
        self.pool = pool_of(cfg)
        self.pooled = self.pool != "kept"
        self.frontier_capacity = self.pooled_width_for(cfg) if self.pooled else self.pool_capacity - 1
        self.wants_cost = cfg.node_budget == "auto"
        self.pad_forwards = self.wants_cost and cfg.pad_forwards
        self._calibration = calibration_log_table(cfg.calibration, "cpu") if cfg.calibration else None
        # what step() reads of a level's candidates: the parents' probabilities (the level rule of a kept pool) and
        # the frontier's top-k rows (the planned topology's replay)
        self._propose_reads = {"parents": self.pool != "beam", "topk_rows": cfg.topology == "planned"}
        self.fused = fused and self.pool == "beam" and cfg.topology == "online"
        self.fused_cost = fused

    def init_state(self, batch: int, device: torch.device | str = "cpu") -> PolicyState:
        state = super().init_state(batch, device)
        planned = torch.full((batch, self.tree_capacity), -1, dtype=torch.int64, device=device)
        return PolicyState(state.alpha, state.first_round, state.history, planned)

    def plan(self, state: PolicyState, root_logprobs: torch.Tensor) -> RoundPlan:
        root_alpha = topk_confidence(root_logprobs, self.k)
        alpha = choose_alpha(self.cfg, state.alpha, root_alpha)
        depth, width = plan_shape(self.cfg, alpha, state.history.d_max)
        first = state.first_round & (self.static is not None)
        if self.static is not None:
            depth = torch.where(first, self.static.max_depth, depth)
        if self.pool == "beam":  # the beam grows while its nodes can still be verified
            depth = torch.where(first, depth, self.max_depth)
        planned = state.planned if self.cfg.topology == "planned" else None
        if planned is not None:  # the planned tree's own depth
            depth = torch.where(first, depth, code_depth(planned, self.k).max(1).values.clamp(min=1))
        return RoundPlan(depth, width, alpha, root_alpha, first, planned)

    def step(
        self, plan: RoundPlan, pool: DraftPool, frontier: Frontier, logprobs: torch.Tensor, level: int, vocab=None
    ):
        cal = self._calibration
        if cal is not None and cal.device != logprobs.device:  # once per device (a host-to-device copy)
            cal = self._calibration = cal.to(logprobs.device)
        # a CPU tensor's read (never a device sync): first rounds draft the static tree, operator by operator
        if self.fused and logprobs.device.type == "cpu" and not bool(plan.first_round.any()):
            fused = self._fused_step(plan, pool, frontier, logprobs, level, cal, vocab)
            if fused is not None:
                return fused
        c = propose(pool, frontier, logprobs, self.k, level, cal, vocab, **self._propose_reads)
        if plan.planned is not None:  # replay the tree planned at the end of the last round
            keep, expand = planned_selection(plan.planned, c, self.k)
            order = c.joint
        elif self.pool == "beam":  # every candidate is pooled and the beam chooses what grows (below): the
            keep = expand = c.valid  # levels' own selection would be overwritten (a static first round keeps its own)
            order = budget_key(self.cfg, c.joint.flatten(1)).view_as(c.joint)
        else:
            keep, expand, order = sage_level_selection(self.cfg, plan, pool, c)
        if self.static is not None:
            s_keep, s_expand = self.static.select(c)
            first = plan.first_round[:, None, None]
            keep, expand = torch.where(first, s_keep, keep), torch.where(first, s_expand, expand)
            order = torch.where(first, c.joint, order)
        if not self.pooled:
            return append(pool, c, keep, expand, order, self.frontier_capacity)
        # every child is a rerank candidate (a static first round keeps its own tree: first_round is False without)
        first = plan.first_round[:, None, None]
        keep = torch.where(first, keep, c.valid)
        if self.pool == "beam":  # the W best of the level by path value grow, to the deepest level
            beam = budget_top_n(c.valid.flatten(1), c.joint.flatten(1), plan.width).view_as(c.valid)
            expand = torch.where(first, expand, beam)
        # every expanded candidate (at most all of the level's) in insertion order; _in_top cuts them to the width
        frontier = append(pool, c, keep, expand, order, c.valid[0].numel())
        return _in_top(pool, frontier, self.rerank_total(self.cfg), self.frontier_capacity)

    def _fused_step(self, plan, pool, frontier, logprobs, level, cal, vocab) -> Frontier | None:
        """:meth:`step` of a beam pool after the first round (every candidate pooled, the ``W`` best by path value
        grow, the frontier cut by :func:`_in_top`) in one kernel call on CPU (:mod:`.beam_level`); None where the
        kernel does not take it.  The same pool and frontier as the operator path."""
        best_first = self.cfg.budget_order == "best_first"
        n_best, cap = self.rerank_total(self.cfg), self.frontier_capacity
        return beam_level(pool, frontier, logprobs, self.k, level, plan.width, n_best, cap, best_first, cal, vocab)

    def finalize(self, plan: RoundPlan, pool: DraftPool, round_ms: torch.Tensor | None = None) -> DraftTree:
        """All pool nodes, or the :meth:`rerank_total` best by path value; with ``node_budget="auto"`` and a measured
        ``round_ms``, the cost-optimal best-first cut (at most :meth:`rerank_total` where set)."""
        if round_ms is None or not self.wants_cost:
            if not self.rerank_total(self.cfg):
                return super().finalize(plan, pool)
            return rerank(pool, self.tree_capacity - 1, self.max_depth)  # the pool holds no more than that
        return finalize_nodes(pool, cost_cut(pool, self._rerank_cap(round_ms)), self.max_depth, self.tree_capacity)

    def keep_drafting(self, pool: DraftPool, level: int, round_ms: torch.Tensor, next_round_ms=None) -> torch.Tensor:
        """0-dim bool: does the cost-optimal cut of the pool so far use a node of ``level``, and (``lookahead``, with
        ``next_round_ms`` given) could the next level's forward pay for itself (:func:`~.cost.next_level_can_pay`)?

        If the cut leaves ``level`` out, drafting the next level cannot pay either: its nodes are less probable than
        their parents.  The cut alone never weighs the next forward, only the verify cost of the nodes drafted so
        far; the look-ahead does.  (Without a node budget every level pays: always True.)
        """
        if not self.wants_cost:
            return super().keep_drafting(pool, level, round_ms)
        ahead = self._rerank_cap(next_round_ms) if next_round_ms is not None and self.cfg.lookahead else None
        cap = self._rerank_cap(round_ms)
        fused = fused_level_pays(pool, level, cap, ahead) if self.fused_cost else None
        return fused if fused is not None else level_pays(pool, level, cap, ahead)

    def _rerank_cap(self, round_ms: torch.Tensor) -> torch.Tensor:
        """``round_ms`` up to :meth:`rerank_total` nodes (where set): the cut prices, so keeps, at most that many."""
        n = self.rerank_total(self.cfg)
        return round_ms[: n + 1] if n else round_ms

    def observe(self, state, plan, tree, accepted_nodes, num_accepted, pool=None) -> PolicyState:
        cfg = self.cfg
        alpha = plan.root_alpha
        if cfg.alpha_source == "path_mean":
            conf = tree.node_conf.gather(1, accepted_nodes.clamp(min=0))
            conf = torch.where(accepted_nodes >= 0, conf, float("nan"))
            path_alpha = torch.nanmean(conf, dim=1)
            alpha = torch.where(torch.isnan(path_alpha), plan.root_alpha, path_alpha)
        history = observe_history(cfg, state.history, num_accepted)
        planned = state.planned
        if cfg.topology == "planned":
            if pool is None:
                raise ValueError("the planned topology needs the round's pool in observe()")
            depth, width = plan_shape(cfg, alpha, history.d_max)
            planned = plan_next_tree(
                lambda p, vpool, c: sage_level_selection(cfg, p, vpool, c),
                RoundPlan(depth, width, alpha, alpha, torch.zeros_like(state.first_round)),
                pool,
                k=self.k,
                pool_capacity=self.pool_capacity,
                frontier_capacity=self.frontier_capacity,
                tree_capacity=self.tree_capacity,
                max_levels=cfg.d_cap,
            )
        return PolicyState(alpha, torch.zeros_like(state.first_round), history, planned)
