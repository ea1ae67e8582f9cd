"""SAGE's choice of the verified nodes inside SGLang's EAGLE draft step (no SGLang import: unit-testable).

SGLang's ``EagleDraftWorker.draft_forward`` ends with ``organize_draft_results(score_list, token_list, parents_list,
num_draft_token)``, which picks the ``num_draft_token - 1`` beam candidates to verify; the hook (``hooks.py``,
``patches/INDEX.md`` #3) calls the active :class:`BeamSelection` instead.  Its plan lives in persistent ``[max_bs]``
buffers written before the draft step (:meth:`BeamSelection.load`), so a CUDA graph captured around the draft step
reads each step's values; ``tests/unit/test_graph_safety.py`` checks the whole per-step path for host syncs,
data-dependent shapes and values baked in at capture.
"""

from __future__ import annotations

import torch

from sage_plugin.config import SageConfig
from sage_plugin.core.budgeted import eagle_beam_candidates, select_shaped
from sage_plugin.core.slots import RoundShape

__all__ = ["BeamSelection"]


class BeamSelection:
    """``organize_draft_results`` replacement for one draft worker: SAGE's choice of the verified nodes.

    ``depth``/``width``/``first`` are persistent ``[max_bs]`` buffers written by :meth:`SageDraftWorker.draft`; a call
    reads the first ``bs`` rows (the batch's, in row order).
    """

    def __init__(self, cfg: SageConfig, topk: int, max_bs: int, device: torch.device | str) -> None:
        self.cfg, self.topk = cfg, topk
        self.depth = torch.ones(max_bs, dtype=torch.int64, device=device)
        self.width = torch.ones(max_bs, dtype=torch.int64, device=device)
        self.shaped = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.first = torch.zeros(max_bs, dtype=torch.bool, device=device)  # first round: the static tree

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
        return parent_list, sel.index, tokens.gather(1, sel.index)
