"""Per-batch bookkeeping of the reference engine's speculative rounds (:mod:`sage_plugin.engines.speculative`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..core.policies import PolicyState, TreePolicy

__all__ = ["SpecBatch", "PolicyClock", "rows_of"]


@dataclass(slots=True)
class SpecBatch:
    """The live requests of a speculative batch and their per-request rows (``[B]`` / ``[B, L]``).

    Attributes:
        ids: output index of each live request.
        roots: ``[B]`` the next round's root token (the last bonus).
        pending: ``[B, L]`` tokens the draft has not processed yet (root last), -1 padding.
        pend_len: ``[B]`` number of pending tokens.
        temperature: ``[B]`` sampling temperature.
        pstate: the tree policy's per-request state.
        pend_feats: ``[B, L, 3H]`` an EAGLE-3 draft's feature for each pending token (None for other drafts).
        tree_feats: ``[B, N, 3H]`` the target's features of this round's tree nodes (EAGLE-3 draft).
    """

    ids: list[int]
    roots: torch.Tensor
    pending: torch.Tensor
    pend_len: torch.Tensor
    temperature: torch.Tensor
    pstate: PolicyState
    pend_feats: torch.Tensor | None = None
    tree_feats: torch.Tensor | None = None

    @staticmethod
    def start(policy: TreePolicy, roots: torch.Tensor, ids: list[int], params, device, feats=None) -> SpecBatch:
        bsz = len(ids)
        return SpecBatch(
            ids=list(ids),
            roots=roots,
            pending=roots[:, None].clone(),
            pend_len=torch.ones(bsz, dtype=torch.int64, device=device),
            temperature=torch.full((bsz,), float(params.temperature), device=device),
            pstate=policy.init_state(bsz, device),
            pend_feats=feats,
        )

    def select(self, rows: torch.Tensor, active: list[bool]) -> None:
        """Keep the rows ``rows`` (the requests still ``active``)."""
        self.ids = [rid for rid, a in zip(self.ids, active) if a]
        self.roots, self.pending, self.pend_len = self.roots[rows], self.pending[rows], self.pend_len[rows]
        self.temperature, self.pstate = self.temperature[rows], self.pstate.index(rows)
        if self.pend_feats is not None:
            self.pend_feats = self.pend_feats[rows]


class PolicyClock:
    """A tree policy whose method calls add their host wall time to ``seconds``; attributes pass through."""

    def __init__(self, policy: TreePolicy) -> None:
        self._policy = policy
        self.seconds = 0.0

    def __getattr__(self, name: str):
        attr = getattr(self._policy, name)
        if not callable(attr):
            return attr

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return timed


def rows_of(active: list[bool], device) -> torch.Tensor:
    """Indices of the rows still active."""
    return torch.tensor([i for i, a in enumerate(active) if a], dtype=torch.int64, device=device)
