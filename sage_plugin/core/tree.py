"""Batched draft-tree layout: the padded level-order rows, the ancestor mask and rank-path codes.

Layout (padded, one row per request).  Node 0 of every row is the **root**: the last token the
target produced (the previous round's bonus), not yet in either KV cache.  Nodes ``1..n-1`` are
draft tokens in level order (every parent index is smaller than its child's).  Padding uses -1.

Worked example (one request, 5 nodes)::

        root(0) "The"
        ├── 1 "cat"
        │    └── 3 "sat"
        │         └── 4 "on"
        └── 2 "dog"

    tokens  = [The, cat, dog, sat, on]
    parents = [-1,   0,   0,   1,  3]
    depths  = [ 0,   1,   1,   2,  3]
    positions (prefix length L) = L + depths = [L, L+1, L+1, L+2, L+3]

    ancestor mask (row i sees column j iff j is i or an ancestor of i):
             0 1 2 3 4
        0 [  1 0 0 0 0 ]
        1 [  1 1 0 0 0 ]
        2 [  1 0 1 0 0 ]
        3 [  1 1 0 1 0 ]
        4 [  1 1 0 1 1 ]

    SGLang first-child / next-sibling arrays (``retrieve_*``, local node ids):
        next_token   = [ 1,  3, -1,  4, -1]
        next_sibling = [-1,  2, -1, -1, -1]

Greedy verification trace: if the target's argmax after "The" is "cat", after "cat" is "sat" and
after "sat" is "in", nodes 1 and 3 are accepted (tau = 2) and "in" is the bonus token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = [
    "MC_SIM_7B_63",
    "DraftTree",
    "ancestor_mask",
    "tree_from_choices",
    "path_code",
]

#: SpecVLM's 25-node tree (rank paths: ``(0, 1)`` is the second child of the root's first child): the static
#: baseline's tree and SAGE's first-round tree (SAGE Appendix A.1).  Levels hold 4 / 8 / 8 / 3 / 2 nodes.
MC_SIM_7B_63: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class DraftTree:
    """A batch of draft trees, padded to ``N`` nodes (root included).

    Attributes:
        tokens: ``[B, N]`` int64 token ids, -1 on padding.
        parents: ``[B, N]`` int64 parent node index, -1 for the root and on padding.
        depths: ``[B, N]`` int64 depth (root 0), -1 on padding.
        num_nodes: ``[B]`` int64 valid nodes per request, root included (>= 1).
        draft_logp: ``[B, N]`` float32 draft conditional log-probability of each node given its
            parent (0 for the root, -inf on padding).
        ranks: ``[B, N]`` int64 rank of each node among its parent's top-k candidates
            (-1 for the root and padding).
        max_depth: host int, an upper bound on ``depths`` (the number of draft levels built).
        node_conf: ``[B, N]`` float32 confidence alpha of each node's own draft distribution
            (NaN where the draft never ran on the node, e.g. leaves).
        source: ``[B, N]`` int64 index of each node in the pool it was selected from (-1 on
            padding), so a runtime can find the node's draft KV slot; None if not built from a pool.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    num_nodes: torch.Tensor
    draft_logp: torch.Tensor
    ranks: torch.Tensor
    max_depth: int
    node_conf: torch.Tensor
    source: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def width(self) -> int:
        """Padded node count ``N`` (root included)."""
        return self.tokens.shape[1]

    def narrow(self, n: int, max_depth: int | None = None) -> "DraftTree":
        """The first ``n`` node columns (``n >= num_nodes.max()``: drops padding only); ``max_depth`` (a host int
        ``>= depths.max()``, e.g. the levels a runtime drafted) tightens the depth bound, which sets the passes of
        :func:`ancestor_mask` and :func:`~sage_plugin.core.verify.walk_tree` and the accepted path's width."""
        cut = lambda t: None if t is None else t[:, :n]  # noqa: E731
        return DraftTree(
            cut(self.tokens),
            cut(self.parents),
            cut(self.depths),
            self.num_nodes,
            cut(self.draft_logp),
            cut(self.ranks),
            self.max_depth if max_depth is None else min(self.max_depth, max_depth),
            cut(self.node_conf),
            cut(self.source),
        )

    def valid(self) -> torch.Tensor:
        """``[B, N]`` bool, True on real nodes."""
        return torch.arange(self.width, device=self.tokens.device) < self.num_nodes[:, None]


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """Tree attention mask: row i is True on i and on every ancestor of i.

    Args:
        parents: ``[B, N]`` int64, -1 for roots and padding (padding rows only see themselves).
        max_depth: upper bound on the depth of any node (number of parent hops to follow).

    Returns:
        ``[B, N, N]`` bool.

    >>> ancestor_mask(torch.tensor([[-1, 0, 0, 1, 3]]), 3)[0].int()
    tensor([[1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 0, 1, 0, 0],
            [1, 1, 0, 1, 0],
            [1, 1, 0, 1, 1]], dtype=torch.int32)
    """
    bsz, n = parents.shape
    mask = torch.eye(n, dtype=torch.bool, device=parents.device).expand(bsz, n, n).clone()
    hop = parents.clone()  # [B, N]: the k-th ancestor of every node, -1 once past the root
    for _ in range(max_depth):
        ok = hop >= 0
        mask |= torch.nn.functional.one_hot(hop.clamp(min=0), n).bool() & ok[..., None]
        hop = torch.where(ok, parents.gather(1, hop.clamp(min=0)), hop)
    return mask


def path_code(parent_code: torch.Tensor, rank: torch.Tensor, k: int) -> torch.Tensor:
    """Integer code of a rank path: ``code(child) = code(parent) * (k + 1) + rank + 1``; root 0.

    Unique for paths up to ``log_{k+1}(2**63)`` deep (18 levels at k = 10).

    >>> int(path_code(path_code(torch.tensor(0), torch.tensor(1), 10), torch.tensor(0), 10))
    23
    """
    return parent_code * (k + 1) + rank + 1


def codes_of_choices(choices: Sequence[Sequence[int]], k: int) -> list[int]:
    """Path codes of a ``tree_choices`` list (host ints, for building lookup tables)."""
    out = []
    for path in choices:
        code = 0
        for r in path:
            code = code * (k + 1) + r + 1
        out.append(code)
    return out


def tree_from_choices(choices: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[int]]:
    """Topology of a Medusa/SpecVLM ``tree_choices`` list, in level order.

    Returns host lists ``(parents, depths, ranks)`` over ``len(choices) + 1`` nodes (root first).

    >>> tree_from_choices([[0], [1], [0, 0]])
    ([-1, 0, 0, 1], [0, 1, 1, 2], [-1, 0, 1, 0])
    """
    ordered = sorted((tuple(p) for p in choices), key=lambda p: (len(p), p))
    index = {(): 0}
    parents, depths, ranks = [-1], [0], [-1]
    for i, p in enumerate(ordered, start=1):
        index[p] = i
        parents.append(index[p[:-1]])
        depths.append(len(p))
        ranks.append(p[-1])
    return parents, depths, ranks
