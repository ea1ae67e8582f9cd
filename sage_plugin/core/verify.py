"""Tree verification: greedy longest accepted path, and lossless tree sampling.

Terms: the **accepted** nodes are the draft nodes on the path the target agrees with; the
**bonus** token is the target's own token after the last accepted node; the **emitted** tokens of
a round are the accepted draft tokens followed by the bonus (``num_accepted + 1`` tokens).

Greedy (SpecInfer / EAGLE ``evaluate_posterior``): node i is accepted iff its parent is accepted
and ``token[i] == argmax target(. | parent)``.  Siblings carry distinct tokens, so at most one child
of an accepted node matches and the accepted set is a single path.

Sampling, lossless for deterministic candidates (the top-k children of a node): at an accepted
node u with processed target distribution p and children c_1..c_m, recursive rejection accepts
c_j with probability p(c_j) / (1 - sum_{i<j} p(c_i)) after rejecting c_1..c_{j-1} (each rejection
zeroes p(c_i) and renormalises); if all are rejected the bonus is drawn from the residual.  The
probability of accepting c_j is therefore exactly p(c_j), and the probability of stopping with
bonus y not among the children is p(y): the walk is identical in law to drawing
``y ~ p(. | u)`` and moving to the child whose token is y.  We draw one ``y`` per node (Gumbel /
exponential race, no host sync) and run the greedy walk on the drawn tokens; every node on the
walked path uses a fresh independent draw, so the emitted sequence follows the target's
distribution exactly.  ``tests.oracles.verify.rejection_verify_one`` implements the
literal recursive-rejection loop and the tests check both against the target distribution.

Example (tree of :mod:`sage_plugin.core.tree`)::

    tokens  = [The, cat, dog, sat, on],  parents = [-1, 0, 0, 1, 3]
    target argmax per node = [cat, sat, ran, in, the]
    accepted: 0 (root) -> 1 (cat) -> 3 (sat); node 4 "on" != "in"
    accepted_nodes = [0, 1, 3, -1], num_accepted = 2, bonus = "in", emitted = [cat, sat, in, -1]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .filters import renormalise, top_k_keep, top_p_keep
from .tree import DraftTree

__all__ = ["VerifyResult", "greedy_verify", "sample_verify", "walk_tree", "process_logits", "sample_tokens"]


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """Outcome of verifying a batch of trees.

    Attributes:
        accepted_nodes: ``[B, D+1]`` int64 node indices root-first along the accepted path, -1 pad.
        num_accepted: ``[B]`` int64 accepted draft tokens (tau, bonus excluded).
        bonus: ``[B]`` int64 the target's token after the last accepted node.
        emitted: ``[B, D+1]`` int64 accepted draft tokens then the bonus, -1 pad.
    """

    accepted_nodes: torch.Tensor
    num_accepted: torch.Tensor
    bonus: torch.Tensor
    emitted: torch.Tensor


def walk_tree(tree: DraftTree, target_tokens: torch.Tensor) -> VerifyResult:
    """Accept the path whose draft tokens equal the target token chosen at each parent.

    Args:
        tree: the drafted trees (``[B, N]``).
        target_tokens: ``[B, N]`` int64, the target's token after each node (argmax or a sample).

    Returns:
        The :class:`VerifyResult`.
    """
    bsz, n = tree.tokens.shape
    dev = tree.tokens.device
    valid = tree.valid()
    par = tree.parents.clamp(min=0)
    match = valid & (tree.parents >= 0) & (tree.tokens == target_tokens.gather(1, par))
    ok = torch.zeros(bsz, n, dtype=torch.bool, device=dev)
    ok[:, 0] = True
    for _ in range(tree.max_depth):  # parents precede children: one pass per level settles all
        ok = ok | (match & ok.gather(1, par))
    depth = torch.where(ok, tree.depths, -1)
    best = depth.argmax(1)  # deepest accepted node (unique per depth: siblings are distinct)
    num_accepted = depth.gather(1, best[:, None])[:, 0]
    # Walk back from best to the root, filling the path right-to-left by depth.
    d = tree.max_depth + 1
    accepted_nodes = torch.full((bsz, d + 1), -1, dtype=torch.int64, device=dev)
    node = best
    for _ in range(d):
        nd = tree.depths.gather(1, node.clamp(min=0)[:, None])[:, 0]
        live = node >= 0
        accepted_nodes.scatter_(1, torch.where(live, nd, d)[:, None], torch.where(live, node, -1)[:, None])
        node = torch.where(live, tree.parents.gather(1, node.clamp(min=0)[:, None])[:, 0], -1)
    accepted_nodes = accepted_nodes[:, :d]
    bonus = target_tokens.gather(1, best[:, None])[:, 0]
    path_tokens = tree.tokens.gather(1, accepted_nodes.clamp(min=0))
    steps = torch.arange(d, device=dev)
    shifted = torch.cat([path_tokens[:, 1:], path_tokens.new_full((bsz, 1), -1)], 1)  # drop the root
    emitted = torch.where(steps[None] < num_accepted[:, None], shifted, -1)
    emitted = emitted.scatter(1, num_accepted[:, None], bonus[:, None])
    return VerifyResult(accepted_nodes, num_accepted, bonus, emitted)


def greedy_verify(tree: DraftTree, target_logits: torch.Tensor) -> VerifyResult:
    """Greedy verification.

    Args:
        tree: ``[B, N]`` trees.
        target_logits: ``[B, N, V]`` target logits at every node (predicting the next token).
    """
    return walk_tree(tree, target_logits.argmax(-1))


def process_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Target sampling distribution: temperature, then top-k, then top-p (nucleus) filtering (:mod:`.filters`).

    Args:
        logits: ``[B, N, V]`` float.
        temperature: ``[B]`` float > 0.
        top_k: ``[B]`` int64, 0 or >= V disables.
        top_p: ``[B]`` float in (0, 1], 1 disables.

    Returns:
        ``[B, N, V]`` float32 probabilities.
    """
    logits = logits.float() / temperature[:, None, None]
    if top_k is not None:  # transformers' rules (the reference engine's plain sampler): ties kept, top-p on top-k
        logits = logits.masked_fill(~top_k_keep(logits, top_k[:, None, None], ties=True), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None:
        probs = renormalise(probs, top_p_keep(probs, top_p[:, None, None], "reach"))
    return probs


def sample_tokens(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One sample per row without a host sync: ``argmax(p / E)`` with ``E ~ Exp(1)``."""
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / noise).argmax(-1)


def sample_verify(
    tree: DraftTree,
    target_logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Lossless tree sampling (recursive rejection over deterministic top-k children).

    Requests with ``temperature == 0`` are verified greedily in the same call.

    Args:
        tree: ``[B, N]`` trees.
        target_logits: ``[B, N, V]``.
        temperature: ``[B]`` float, 0 means greedy.
        top_k, top_p: ``[B]`` target sampling filters (see :func:`process_logits`).
        generator: RNG for reproducible sampling.
    """
    greedy = temperature <= 0
    probs = process_logits(target_logits, torch.where(greedy, 1.0, temperature), top_k, top_p)
    drawn = sample_tokens(probs, generator)
    chosen = torch.where(greedy[:, None], target_logits.argmax(-1), drawn)
    return walk_tree(tree, chosen)
