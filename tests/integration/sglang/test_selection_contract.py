"""Contract test: SAGE's selection inside SGLang's beam against SGLang's own ``organize_draft_results``.

With ``rerank_pool: beam`` (the default) SAGE verifies the beam's most probable paths, which is what SGLang's
``organize_draft_results`` verifies (its top ``num_draft_token - 1`` scores): the two must return the same
``(parent_list, top_scores_index, draft_tokens)`` on SGLang's beam layout, at every step count and verify width.
With ``kept`` or ``children`` SAGE's shape comes first, so they must differ somewhere (the test can fail).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.speculative.eagle_utils import organize_draft_results  # noqa: E402

from sage_plugin.config import AlgorithmConfig  # noqa: E402
from sage_plugin.serving.slots import SlotState  # noqa: E402

from ...unit.graph_step import SMALL, TOPK, new_selection, sglang_beam  # noqa: E402


def _select(cfg: AlgorithmConfig, beam, bsz: int, draft_tokens: int):
    sel = new_selection(cfg)
    state = SlotState(cfg, 2 * bsz + 1)
    sel.load(state.plan(torch.arange(bsz), beam.root))
    return sel(beam.score_list, beam.token_list, beam.parents_list, draft_tokens)


@pytest.mark.parametrize("steps, draft_tokens", [(1, 2), (1, TOPK + 1), (3, 4), (4, 8), (6, 11), (3, 1 + TOPK * 3)])
def test_beam_pool_is_sglangs_own_top_n(steps, draft_tokens):
    assert SMALL.rerank_pool == "beam"
    gen = torch.Generator().manual_seed(steps * 100 + draft_tokens)
    differs = {"kept": 0, "children": 0}
    for _ in range(20):
        bsz = int(torch.randint(1, 6, (1,), generator=gen))
        beam = sglang_beam(bsz, steps, gen=gen)
        want = organize_draft_results(beam.score_list, beam.token_list, beam.parents_list, draft_tokens)
        got = _select(SMALL, beam, bsz, draft_tokens)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w)
        for pool in differs:
            other = _select(SMALL.replace(rerank_pool=pool), beam, bsz, draft_tokens)
            differs[pool] += int(not torch.equal(other[1], want[1]))
    if draft_tokens >= 8:  # narrower widths (or every candidate verified) often leave the pools nothing to differ on
        assert all(differs.values()), differs
