"""Per-batch bookkeeping of the reference engine's speculative rounds (:mod:`sage_plugin.engines.speculative`)."""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass

import torch

from ..core.policies import PolicyState, TreePolicy
from ..core.verify import VerifyResult, process_logits, sample_tokens
from .records import RoundLog, SamplingParams

__all__ = [
    "LevelClock",
    "PolicyClock",
    "SpecBatch",
    "ancestor_slots",
    "choose_tokens",
    "emit_tokens",
    "log_round",
    "rows_of",
    "sampling_filters",
]


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
        pend_width: ``L`` after a round (the policy's deepest path plus its bonus), whatever depth the round's tree
            had: the catch-up's padded width is capped by it (``SpecEngine._catch_up``).
    """

    ids: list[int]
    roots: torch.Tensor
    pending: torch.Tensor
    pend_len: torch.Tensor
    temperature: torch.Tensor
    pstate: PolicyState
    pend_feats: torch.Tensor | None = None
    tree_feats: torch.Tensor | None = None
    pend_width: int = 1

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
            pend_width=policy.max_depth + 1,
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


class LevelClock:
    """Host time of a drafted level besides its forward (the policy's step and cut, the engine's bookkeeping), for
    ``price_level_host``: :meth:`ms` is the median of the last ``window`` levels (0 before the first), :meth:`price`
    what the next round charges a level.

    In the level loop: :meth:`start` at the level's top, :meth:`pause` / :meth:`resume` around its draft forward,
    :meth:`end` after it (a level that stops before its forward is not a sample: it drafts nothing).

    The price is a measurement that can stop the very levels that would refresh it, so :meth:`price` is 0
    (unpriced: levels cost their forward alone) in two cases.  While fewer than ``min_samples`` levels are timed: a
    process's first level carries one-off costs (many times a warm level's), and a median of one such sample would
    make every later level look too dear, so a whole run would draft no level past the catch-up.  And for one round after ``probe_every`` rounds priced
    without a new sample, so a price that a slow spell pushed too high is re-measured instead of kept for the rest of
    the process.  Worked example (``min_samples`` 2, ``probe_every`` 2): samples ``[15]`` -> price 0; ``[15, 1, 1]``
    -> 1; two rounds without a level -> 1, 1, then 0 for one round, then 1 again.
    """

    def __init__(self, window: int = 64, min_samples: int = 5, probe_every: int = 16) -> None:
        self.samples: deque[float] = deque(maxlen=window)
        self.min_samples = min_samples
        self.probe_every = probe_every
        self._stale = 0  # rounds priced since the last sample
        self._t0 = 0.0
        self._acc = 0.0

    def start(self) -> None:
        self._acc, self._t0 = 0.0, time.perf_counter()

    def pause(self) -> None:
        self._acc += time.perf_counter() - self._t0

    def resume(self) -> None:
        self._t0 = time.perf_counter()

    def end(self) -> None:
        self.pause()
        self.samples.append(1e3 * self._acc)
        self._stale = 0

    def ms(self) -> float:
        return statistics.median(self.samples) if self.samples else 0.0

    def price(self) -> float:
        """The host ms to charge each level of the next round (call once a round): :meth:`ms`, or 0 while fewer than
        ``min_samples`` levels are timed and for one round after ``probe_every`` priced rounds without a sample."""
        if len(self.samples) < self.min_samples or self._stale >= self.probe_every:
            self._stale = 0
            return 0.0
        self._stale += 1
        return self.ms()


def emit_tokens(outputs: list, ids: list[int], new_tokens: torch.Tensor, counts: torch.Tensor, params) -> list[bool]:
    """Append ``counts[b]`` tokens of ``new_tokens[b]`` to each request; apply stop/length.

    Returns, per row, whether the request is still active.
    """
    still = []
    for rid, toks, n in zip(ids, new_tokens.tolist(), counts.tolist()):
        out = outputs[rid]
        for tok in toks[:n]:
            out.tokens.append(tok)
            if tok in params.stop_token_ids:
                out.finish_reason = "stop"
                break
            if len(out.tokens) >= params.max_new_tokens:
                out.finish_reason = "length"
                break
        still.append(out.finish_reason != "stop" and len(out.tokens) < params.max_new_tokens)
    return still


def rows_of(active: list[bool], device) -> torch.Tensor:
    """Indices of the rows still active."""
    return torch.tensor([i for i, a in enumerate(active) if a], dtype=torch.int64, device=device)


def choose_tokens(logits: torch.Tensor, params: SamplingParams, gen) -> torch.Tensor:
    """Token after each row of ``logits [B, Q, V]`` (greedy or sampled)."""
    if params.temperature <= 0:
        return logits.argmax(-1)
    bsz = logits.shape[0]
    top_k, top_p = sampling_filters(params, bsz, logits.device)
    probs = process_logits(logits, torch.full((bsz,), params.temperature, device=logits.device), top_k, top_p)
    return sample_tokens(probs, gen)


def sampling_filters(
    params: SamplingParams, bsz: int, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-request top-k / top-p tensors, or None where the filter is disabled (skips a vocab sort)."""
    top_k = torch.full((bsz,), params.top_k, dtype=torch.int64, device=device) if params.top_k > 0 else None
    top_p = torch.full((bsz,), params.top_p, device=device) if params.top_p < 1.0 else None
    return top_k, top_p


def ancestor_slots(pool, slot_of: torch.Tensor, fidx: torch.Tensor, level: int, num_slots: int) -> torch.Tensor:
    """``[B, F, S]`` bool: draft KV slots of each frontier node's strict ancestors (root included)."""
    bsz, width = fidx.shape
    extra = torch.zeros(bsz, width, num_slots + 1, dtype=torch.bool, device=fidx.device)
    node = pool.parents.gather(1, fidx.clamp(min=0))
    for _ in range(level):
        slot = torch.where(node >= 0, slot_of.gather(1, node.clamp(min=0)), num_slots)
        slot = torch.where(slot >= 0, slot, num_slots)
        extra.scatter_(2, slot[..., None], True)
        node = torch.where(node >= 0, pool.parents.gather(1, node.clamp(min=0)), -1)
    return extra[..., :num_slots]


def log_round(outputs, ids, plan, tree, res: VerifyResult, forwards: int) -> None:
    """Append each request's :class:`~.records.RoundLog` of a verified round (host copies: logging only)."""
    cols = [
        res.num_accepted.tolist(),
        (tree.num_nodes - 1).tolist(),
        tree.depths.max(1).values.tolist(),
        plan.alpha.tolist(),
        plan.root_alpha.tolist(),
        plan.depth.tolist(),
        plan.width.tolist(),
    ]
    for rid, (tau, nodes, dep, a, ra, pd, pw) in zip(ids, zip(*cols)):
        outputs[rid].rounds.append(RoundLog(tau, nodes, dep, a, ra, pd, pw, forwards))
        outputs[rid].target_forwards += 1
