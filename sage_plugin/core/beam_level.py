"""One level of SAGE's beam pool in one call on CPU, and the level's cost check: the ops
``torch.ops.sage_plugin.beam_level`` and ``torch.ops.sage_plugin.level_pays`` (``sage_plugin/kernels/csrc/beam_level.cpp``).

:meth:`~sage_plugin.core.sage.SagePolicy.step` under ``rerank_pool: beam`` (SAGE's default) runs about a hundred
small tensor operations a level (the candidates' path values and codes, the beam's top-``W``, the pool's sorted
append, the frontier cut to the pool's best nodes); on a CPU each costs microseconds of host time, about a
millisecond a level in all, which the node budget prices into every drafted level.  The kernel does the same work
per request in one call.  The core looks the ops up by name and never imports the kernels: they run once a runtime
has registered them (``sage_plugin/kernels/beam_level.py``; the reference engine does on CPU).  The torch path stays
the fallback (ops not registered, other devices, a static first round, the planned topology) and is the tests'
oracle: the kernel writes the same integers and adds the same float32 values, so the pool and the frontier it
returns are identical (tests/unit/test_beam_level.py).

:func:`level_pays` is :func:`~sage_plugin.core.cost.level_pays` (run once per drafted level by ``node_budget: auto``)
as the same ATen operators called from C++: the same tensors, the same bits, the same decision, without about 40
Python-dispatched calls between them.

Worked example (one request, ``k = 2``, pool ``[root]``, frontier ``[0]``, width 1, ``n_best = 4``): top values
``[-0.1, -2.3]`` give candidates with path values ``-0.1`` (rank 0, code 1) and ``-2.3`` (rank 1, code 2); both enter
the pool at slots 1 and 2 in that order, the beam grows only slot 1, and the next frontier is ``[1, -1]``.
"""

from __future__ import annotations

from typing import Any

import torch

from .calibration import calibrated_logp
from .level_expansion import DraftPool, Frontier, top_children

__all__ = ["OP_NAMESPACE", "beam_level", "level_pays", "registered_op"]

#: where the ops are registered (``sage_plugin/kernels/beam_level.py`` builds and registers them)
OP_NAMESPACE = "sage_plugin"


def registered_op(name: str) -> Any:
    """``torch.ops.sage_plugin.<name>`` where a runtime has registered it, else None (the operator path runs)."""
    try:
        return getattr(getattr(torch.ops, OP_NAMESPACE), name)
    except (AttributeError, RuntimeError):
        return None


def beam_level(
    pool: DraftPool, frontier: Frontier, logprobs: torch.Tensor, k: int, level: int, width: torch.Tensor,
    n_best: int, frontier_capacity: int, best_first: bool, calibration: torch.Tensor | None = None,
    vocab: torch.Tensor | None = None,
) -> Frontier | None:  # fmt: skip
    """One beam level (the module docstring), or None where the op does not take it (not registered, not CPU).

    Args:
        pool: the round's pool, updated in place (its trash column is not written).
        frontier: ``[B, F]`` the nodes whose children are proposed.
        logprobs, k, level, calibration, vocab: as :func:`~sage_plugin.core.level_expansion.propose` takes them.
        width: ``[B]`` int64 the beam: children of the level that grow.
        n_best: a grown child stays on the frontier only among the pool's ``n_best`` most valuable nodes.
        frontier_capacity: the most frontier slots returned (at most ``F * k`` are).
        best_first: insertion order by path value (``budget_order: best_first``), else by position.
    """
    op = registered_op("beam_level")
    if op is None or logprobs.device.type != "cpu":
        return None
    top = top_children(logprobs, k, vocab)
    gain = top.values if calibration is None else calibrated_logp(calibration, top.values, top.conf[..., None])
    idx = op(
        pool.tokens, pool.parents, pool.depths, pool.logp, pool.logp_topk, pool.joint, pool.joint_topk, pool.ranks,
        pool.codes, pool.conf, pool.count, frontier.idx.contiguous(), top.values, gain, top.tokens, top.logp_topk,
        top.conf, width, level, n_best, min(top.values.shape[1] * k, frontier_capacity), best_first,
    )  # fmt: skip
    return Frontier(idx)


def level_pays(
    pool: DraftPool, level: int, round_ms: torch.Tensor, next_round_ms: torch.Tensor | None = None
) -> torch.Tensor | None:  # fmt: skip
    """:func:`~sage_plugin.core.cost.level_pays` in one call (0-dim bool), or None where the op does not take it
    (not registered, not CPU)."""
    op = registered_op("level_pays")
    if op is None or pool.joint.device.type != "cpu":
        return None
    return op(pool.joint, pool.depths, pool.count, level, round_ms, next_round_ms)
