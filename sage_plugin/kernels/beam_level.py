"""SAGE's beam level and its cost check as custom ops on CPU: ``csrc/beam_level.cpp``.

Two ops in ``torch.ops.sage_plugin``: ``beam_level`` (one level of the beam pool: the pool's eleven columns written
in place, the next frontier ``[B, out_width]`` int64 returned) and ``level_pays`` (``core.cost.level_pays`` as ATen
calls from C++, a 0-dim bool).  The algorithm core calls them by name (:mod:`sage_plugin.core.beam_level`, which
documents the arguments) and keeps its operator path, the ops' oracle, wherever they are not registered; nothing in
the core imports this module.  A runtime that runs SAGE's tree policy on CPU loads them with :func:`beam_ops` (the
reference engine does when it starts a speculative decode).
"""

from __future__ import annotations

from typing import Any

import torch

from .native import NAMESPACE, cpu_ops

__all__ = ["beam_ops"]


def beam_ops() -> Any:
    """The ops (``.beam_level``, ``.level_pays``), registered on first use, or None where they cannot be built (one
    warning; SAGE's beam levels then run operator by operator)."""
    return cpu_ops("beam_level", "SAGE's beam levels run operator by operator", _register_fakes)


def _register_fakes() -> None:
    @torch.library.register_fake(f"{NAMESPACE}::beam_level")
    def _(tokens, parents, depths, logp, logp_topk, joint, joint_topk, ranks, codes, conf, count, frontier,
          top_values, gain, top_tokens, top_logp_topk, top_conf, width, level, n_best, out_width, best_first):  # fmt: skip
        return frontier.new_empty(frontier.shape[0], out_width)

    @torch.library.register_fake(f"{NAMESPACE}::level_pays")
    def _(joint, depths, count, level, round_ms, next_round_ms):
        return torch.empty((), dtype=torch.bool, device=joint.device)
