"""SAGE's part of SGLang's EAGLE draft step: the round's plan and the choice of the verified nodes (no SGLang import).

SGLang's ``EagleDraftWorker.draft_forward`` ends with ``organize_draft_results(score_list, token_list, parents_list,
num_draft_token)``, which picks the ``num_draft_token - 1`` beam candidates to verify; the hook (``hooks.py``,
``patches/INDEX.md`` #3) calls the active :class:`BeamSelection` instead.  The SAGE draft worker's
``draft_forward`` (the callable SGLang's draft CUDA graph runner captures) runs :func:`planned_draft`: the round's
plan, written into the selection's persistent ``[max_bs]`` buffers (:meth:`BeamSelection.load`), upstream's draft
forward with the selection inside, then the metrics (:class:`DraftCounters`).  All of it is captured in the draft
graph and replayed with each step's values; ``tests/unit/test_graph_safety.py`` checks the whole per-step path for
host syncs, data-dependent shapes, values baked in at capture and the padded rows of SGLang's graph runner.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch

from sage_plugin.config import AlgorithmConfig
from sage_plugin.core.beam_selection import eagle_beam_candidates, select_shaped
from sage_plugin.serving.slots import RoundShape, SlotState

from .request_meta import ROUND_FIELDS

__all__ = ["STAT_FIELDS", "BeamSelection", "DraftCounters", "planned_draft"]

#: metric counters kept on the device, in this order (:attr:`DraftCounters.stats`)
STAT_FIELDS = ("rounds", "alpha_sum", "depth_sum", "width_sum", "shaped_sum", "accept_sum")
T = TypeVar("T")
_ACCEPT = STAT_FIELDS.index("accept_sum")


class BeamSelection:
    """``organize_draft_results`` replacement for one draft worker: SAGE's choice of the verified nodes.

    ``depth``/``width``/``first`` are persistent ``[max_bs]`` buffers written by :func:`planned_draft`; a call reads
    the first ``bs`` rows (the batch's, in row order) and writes the rows' SAGE-shaped node counts into ``shaped``
    and, with ``max_nodes`` > 0 (a ragged verify can run, ``ragged_verify.py``), the beam's path scores of the nodes it chose,
    in their verify order, into ``node_scores [max_bs, max_nodes]`` (what the ragged verify drops nodes by; None and
    not written otherwise).
    """

    def __init__(
        self, cfg: AlgorithmConfig, topk: int, max_bs: int, device: torch.device | str, max_nodes: int = 0
    ) -> None:
        self.cfg, self.topk = cfg, topk
        self.depth = torch.ones(max_bs, dtype=torch.int64, device=device)
        self.width = torch.ones(max_bs, dtype=torch.int64, device=device)
        self.shaped = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.first = torch.zeros(max_bs, dtype=torch.bool, device=device)  # first round: the static tree
        self.node_scores = torch.zeros(max_bs, max_nodes, dtype=torch.float32, device=device) if max_nodes > 0 else None

    def load(self, shape: RoundShape) -> None:
        """Write a round's plan (``[bs]`` depth, width, first round) into the first ``bs`` rows of the buffers."""
        bs = shape.depth.shape[0]
        self.depth[:bs].copy_(shape.depth)
        self.width[:bs].copy_(shape.width)
        self.first[:bs].copy_(shape.first_round)

    def __call__(self, score_list, token_list, parents_list, num_draft_token: int):
        """Same contract as SGLang's ``organize_draft_results``: ``(parent_list, top_scores_index, draft_tokens)``."""
        scores = torch.cat(score_list, dim=1).flatten(1)
        tokens = torch.cat(token_list, dim=1)
        bs = scores.shape[0]
        if len(parents_list) > 1:
            parent_list = torch.cat(parents_list[:-1], dim=1)
            beam_parents = parent_list
        else:  # one step: every candidate is a child of the root
            parent_list = torch.empty(bs, 0, dtype=torch.long, device=scores.device)
            beam_parents = parents_list[0][:, :1]
        cands = eagle_beam_candidates(scores, beam_parents, self.topk)
        static_first = self.first[:bs] if self.cfg.first_round_static else None
        sel = select_shaped(cands, self.depth[:bs], self.width[:bs], num_draft_token - 1, self.cfg, static_first)
        self.shaped[:bs].copy_(sel.shaped)
        if self.node_scores is not None:
            n = min(sel.index.shape[1], self.node_scores.shape[1])
            self.node_scores[:bs, :n].copy_(scores.gather(1, sel.index[:, :n]))
        return parent_list, sel.index, tokens.gather(1, sel.index)


class DraftCounters:
    """A draft worker's device-side metrics, in persistent buffers a captured draft graph writes.

    ``stats``: ``[len(STAT_FIELDS)]`` float64 running sums over drafted request-rounds (:data:`STAT_FIELDS`; the last,
    ``accept_sum``, is the worker's, after verify: :meth:`add_accepted`).  ``rounds``: ``[max_bs, 4]`` float32, the
    last round's record of each batch row (``meta.ROUND_FIELDS``: alpha, D, W, SAGE-shaped nodes); a step's first
    ``bs`` rows are its batch.
    """

    def __init__(self, max_bs: int, device: torch.device | str) -> None:
        self.stats = torch.zeros(len(STAT_FIELDS), dtype=torch.float64, device=device)
        self.rounds = torch.zeros(max_bs, len(ROUND_FIELDS), dtype=torch.float32, device=device)

    def add_accepted(self, accept_lens: torch.Tensor) -> None:
        """A verified step's ``accept_lens [B]`` (accepted drafts + the bonus) into ``accept_sum``."""
        self.stats[_ACCEPT] += accept_lens.sum().to(self.stats.dtype)


def planned_draft(
    state: SlotState,
    sel: BeamSelection,
    counters: DraftCounters,
    slots: torch.Tensor,
    topk_p: torch.Tensor,
    draft: Callable[[], T],
) -> T:
    """One SAGE draft step around upstream's draft forward ``draft()``: plan, load, draft, record; returns ``draft()``.

    Args:
        state: the slots' SAGE state; :meth:`SlotState.plan` reads and updates the rows of ``slots``.
        sel: the active selection; its buffers get the plan before ``draft()`` (whose ``organize_draft_results``
            reads them and writes ``sel.shaped``).
        counters: ``stats[:5]`` gain the real rows' sums; ``rounds[:B]`` get every row's record ``[B, 4]``.
        slots: ``[B]`` int64, each row's request slot (SGLang's ``req_pool_indices``).
        topk_p: ``[B, t]`` float32, each row's top-``t`` root draft probabilities (``spec_info.topk_p``).
        draft: upstream's draft forward (or, in the tests, the selection alone).

    Inside SGLang's draft CUDA graph ``B`` is the captured batch size: ``slots`` and ``topk_p`` are the runner's
    static buffers, and the rows past the real batch are padding, which ``EagleDraftCudaGraphRunner.execute`` sets to
    slot 0 (``ReqToTokenPool`` keeps row 0 for it; no request owns slot 0) and ``topk_p`` all zeros.  Such a row
    plans, loads and selects like any row (row-independent work whose outputs the runner drops; its plan only writes
    slot 0's state), but must not count in the metrics.  A row counts when its top-1 root probability is above 0:
    a real row's is the largest of a draft distribution over the vocabulary (at least ``1 / vocab`` after softmax,
    top-k / top-p renormalisation or temperature; exactly 1 on SGLang's ``topk == 1`` path), a padded row's is 0.
    The test reads the row itself, with no host value (the real batch size is a host int the graph cannot see), and
    holds however the slots are numbered (the CPU proofs use slot 0 for real rows too).  The masked sums use
    ``torch.where``, so a padded row's values (finite here, but never read) cannot leak into them as ``0 * nan``.

    Sync-free and shape-static (``tests/unit/test_graph_safety.py``): no host read, no boolean-mask indexing.
    """
    shape = state.plan(slots, topk_p)
    sel.load(shape)
    out = draft()
    bs = slots.shape[0]
    record = torch.stack(
        [shape.alpha, shape.depth.to(shape.alpha.dtype), shape.width.to(shape.alpha.dtype),
         sel.shaped[:bs].to(shape.alpha.dtype)], dim=1,
    )  # fmt: skip
    counters.rounds[:bs].copy_(record)
    real = topk_p[:, :1] > 0  # [B, 1]
    rows = torch.cat([torch.ones_like(record[:, :1]), record], dim=1).to(counters.stats.dtype)  # [B, 5]
    counters.stats[: rows.shape[1]] += torch.where(real, rows, 0.0).sum(0)
    return out
