"""The baseline tree policies SAGE is compared with: SD-Chain, SD-Tree (static) and the EAGLE-2 dynamic tree.

All three keep their published fixed shapes (no adaptive state, no cost-aware cut):

* ``chain``: the draft's top-1 token at each of ``chain_depth`` levels;
* ``static``: a fixed rank-path tree (``static_tree``, SpecVLM's 25-node ``mc_sim_7b_63`` by default: rank path
  ``(0, 1)`` is the second most likely child of the root's most likely child);
* ``eagle2``: EAGLE-2's expansion (the k best nodes of each level by path probability are expanded) and rerank
  (the ``eagle_total_tokens`` best pool nodes by path probability are verified);
* ``topn``: OPT-Tree's greedy top-N tree (each level keeps, and expands, the ``topn_nodes`` most probable of its
  candidates; a level is added while the level before it raised the expected accepted length by more than
  ``topn_threshold``; the ``topn_nodes`` most probable nodes of all levels are verified).
"""

from __future__ import annotations

import torch

from .level_expansion import (
    NEG_INF,
    Candidates,
    DraftPool,
    Frontier,
    append,
    best_nodes,
    budget_top_n,
    finalize_nodes,
    propose,
)
from .params import SageParams
from .policy import FixedShapePolicy, RoundPlan
from .tree import DraftTree, codes_of_choices, tree_from_choices

__all__ = ["ChainPolicy", "Eagle2Policy", "StaticPolicy", "TopNPolicy", "rerank"]


class ChainPolicy(FixedShapePolicy):
    """SD-Chain: the draft's top-1 token at every level, ``chain_depth`` levels."""

    name = "chain"

    @classmethod
    def max_depth_for(cls, cfg: SageParams) -> int:
        return cfg.chain_depth

    @classmethod
    def max_nodes_for(cls, cfg: SageParams) -> int:
        return cfg.chain_depth

    def __init__(self, cfg: SageParams) -> None:
        super().__init__(cfg)
        self.pool_capacity = self.tree_capacity
        self.frontier_capacity = 1

    def step(self, plan, pool, frontier, logprobs, level, vocab=None) -> Frontier:
        c = propose(pool, frontier, logprobs, self.k, level, vocab=vocab, parents=False, topk_rows=False)
        keep = c.valid & (c.ranks == 0)
        return append(pool, c, keep, keep & (level < self.max_depth), c.joint, self.frontier_capacity)


class StaticPolicy(FixedShapePolicy):
    """SD-Tree: a fixed rank-path tree (default SpecVLM ``mc_sim_7b_63``), drafted with top-k."""

    name = "static"

    @classmethod
    def max_depth_for(cls, cfg: SageParams) -> int:
        return max(len(p) for p in cfg.static_tree)

    @classmethod
    def max_nodes_for(cls, cfg: SageParams) -> int:
        return len(cfg.static_tree)

    @classmethod
    def uses_static_tree(cls, cfg: SageParams) -> bool:
        return True

    def __init__(self, cfg: SageParams) -> None:
        super().__init__(cfg)
        self.choices = cfg.static_tree
        codes = codes_of_choices(self.choices, self.k)
        internal = codes_of_choices({p[:-1] for p in self.choices if len(p) > 1}, self.k)
        self._codes = torch.tensor(sorted(codes), dtype=torch.int64)
        self._internal = torch.tensor(sorted(internal) or [-2], dtype=torch.int64)
        self.pool_capacity = self.tree_capacity
        _, depths, _ = tree_from_choices(self.choices)
        self.frontier_capacity = max(depths.count(d) for d in range(1, self.max_depth + 1))

    def select(self, c: Candidates) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keep, expand)`` ``[B, F, K]``: candidates whose rank path is in the tree / a proper prefix of one."""
        # one compare against each of the tree's few codes (torch.isin sorts: several times the cost at this size)
        codes = c.codes[..., None]
        keep = c.valid & (codes == self._codes.to(c.codes.device)).any(-1)
        return keep, keep & (codes == self._internal.to(c.codes.device)).any(-1)

    def step(self, plan, pool, frontier, logprobs, level, vocab=None) -> Frontier:
        c = propose(pool, frontier, logprobs, self.k, level, vocab=vocab, parents=False, topk_rows=False)
        keep, expand = self.select(c)
        return append(pool, c, keep, expand, c.joint, self.frontier_capacity)


def rerank(pool: DraftPool, total: int, max_depth: int) -> DraftTree:
    """The ``total`` most probable pool nodes (and the root), a tree because path probability never increases along a
    path; ties to the earlier (parent-first) node."""
    return finalize_nodes(pool, best_nodes(pool, torch.full_like(pool.count, total)), max_depth, total + 1)


class Eagle2Policy(FixedShapePolicy):
    """EAGLE-2 dynamic tree: expand the top-k by joint probability per level, then rerank.

    Level 1 keeps the root's top-k; each later level proposes k children for each of the k frontier nodes (k^2
    candidates, all pooled) and expands the k best by joint probability.  Finalisation keeps the
    ``eagle_total_tokens`` best pool nodes by joint probability, which is ancestor-closed because joint probability
    never increases along a path.
    """

    name = "eagle2"

    @classmethod
    def max_depth_for(cls, cfg: SageParams) -> int:
        return cfg.eagle_depth

    @classmethod
    def max_nodes_for(cls, cfg: SageParams) -> int:
        return cfg.eagle_total_tokens

    def __init__(self, cfg: SageParams) -> None:
        super().__init__(cfg)
        self.frontier_capacity = cfg.k
        self.pool_capacity = 1 + cfg.k + (cfg.eagle_depth - 1) * cfg.k * cfg.k

    def step(self, plan, pool, frontier, logprobs, level, vocab=None) -> Frontier:
        c = propose(pool, frontier, logprobs, self.k, level, vocab=vocab, parents=False, topk_rows=False)
        expand = budget_top_n(c.valid.flatten(1), c.joint.flatten(1), torch.full_like(pool.count, self.k))
        expand = expand.view_as(c.valid) & (level < self.max_depth)
        return append(pool, c, c.valid, expand, c.joint, self.frontier_capacity)

    def finalize(self, plan: RoundPlan, pool: DraftPool, round_ms: torch.Tensor | None = None) -> DraftTree:
        return rerank(pool, self.tree_capacity - 1, self.max_depth)


class TopNPolicy(FixedShapePolicy):
    """OPT-Tree's top-N tree (Wang et al., TACL 2025): maximise the expected accepted length, the sum of the
    verified nodes' path probabilities, for ``N = topn_nodes`` nodes.

    Level ``l`` keeps the ``N`` most probable of its candidates (the top-k children of every node of level ``l-1``)
    and expands them.  ``E_l`` is the sum of the ``N`` largest path probabilities over levels ``< l``; level ``l`` is
    drafted only while ``E_{l-1} - E_{l-2}`` (what level ``l-1`` added) exceeds ``topn_threshold``.  The tree verified
    is the ``N`` most probable pool nodes.

    Example (N = 2, threshold 0.05): level 1 keeps a .6, b .3; level 2 keeps a->c .54, b->d .15 (E over level 1:
    .9, gain .9); level 3: E over levels 1-2 is still .6 + .54 = 1.14, gain .24 > .05, so it is drafted; the tree
    verifies a and a->c.
    """

    name = "topn"

    @classmethod
    def max_depth_for(cls, cfg: SageParams) -> int:
        return cfg.topn_max_depth

    @classmethod
    def max_nodes_for(cls, cfg: SageParams) -> int:
        return cfg.topn_nodes

    def __init__(self, cfg: SageParams) -> None:
        super().__init__(cfg)
        self.frontier_capacity = cfg.topn_nodes
        self.pool_capacity = 1 + cfg.topn_nodes * cfg.topn_max_depth

    def _top_mass(self, pool: DraftPool, below: int) -> torch.Tensor:
        """``[B]`` sum of the ``N`` largest path probabilities among draft nodes of depth ``1 .. below - 1``."""
        ok = (pool.depths[:, 1:-1] >= 1) & (pool.depths[:, 1:-1] < below)
        p = torch.where(ok, pool.joint[:, 1:-1], NEG_INF).exp()
        n = min(self.cfg.topn_nodes, p.shape[1])
        return torch.topk(p, n, dim=1).values.sum(1)

    def step(self, plan, pool, frontier, logprobs, level, vocab=None) -> Frontier:
        c = propose(pool, frontier, logprobs, self.k, level, vocab=vocab, parents=False, topk_rows=False)
        grow = torch.ones_like(pool.count, dtype=torch.bool)
        if level >= 2:  # what level - 1 added to the best N
            grow = self._top_mass(pool, level) - self._top_mass(pool, level - 1) > self.cfg.topn_threshold
        n = torch.where(grow, self.cfg.topn_nodes, 0)
        keep = budget_top_n(c.valid.flatten(1), c.joint.flatten(1), n).view_as(c.valid)
        return append(pool, c, keep, keep & (level < self.max_depth), c.joint, self.frontier_capacity)

    def finalize(self, plan: RoundPlan, pool: DraftPool, round_ms: torch.Tensor | None = None) -> DraftTree:
        return rerank(pool, self.cfg.topn_nodes, self.max_depth)
