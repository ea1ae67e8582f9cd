"""The target sampling filters (``sage_plugin/core/filters.py``) against their oracle, and the reference engine's
sampling distribution against transformers' warpers (the rules the engine's plain sampler follows), a tie exactly at
the top-p boundary included."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.core.filters import min_p_keep, renormalise, top_k_keep, top_p_keep
from sage_plugin.core.verify import process_logits
from tests.oracles.filters import min_p_keep_one, top_k_keep_one, top_p_keep_one

#: probabilities in 1/1024ths: every partial sum is exact in float32, so a sum equal to ``p`` is a real tie
rows = st.lists(st.lists(st.integers(0, 40), min_size=2, max_size=12), min_size=1, max_size=4).filter(
    lambda r: all(sum(row) > 0 for row in r) and len({len(row) for row in r}) == 1
)


def _probs(counts: list[list[int]]) -> torch.Tensor:
    return torch.tensor(counts, dtype=torch.float32) / 1024


@settings(max_examples=200, deadline=None)
@given(rows, st.data())
def test_top_p_matches_its_oracle_ties_included(counts, data):
    probs = _probs(counts)
    for boundary in ("reach", "exceed"):
        # p at a partial sum of the row half of the time: the tie the two rules differ at
        p = [data.draw(st.integers(1, 1024)) / 1024 for _ in counts]
        got = top_p_keep(probs, torch.tensor(p)[:, None], boundary)
        want = [top_p_keep_one(row.tolist(), pr, boundary) for row, pr in zip(probs, p)]
        assert got.tolist() == want


@settings(max_examples=200, deadline=None)
@given(rows, st.data())
def test_top_k_and_min_p_match_their_oracles(counts, data):
    probs = _probs(counts)
    k = [data.draw(st.integers(-1, len(counts[0]) + 1)) for _ in counts]
    for ties in (True, False):
        got = top_k_keep(probs, torch.tensor(k)[:, None], ties)
        assert got.tolist() == [top_k_keep_one(row.tolist(), kk, ties) for row, kk in zip(probs, k)]
    m = [data.draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])) for _ in counts]
    got = min_p_keep(probs, torch.tensor(m)[:, None])
    assert got.tolist() == [min_p_keep_one(row.tolist(), mm) for row, mm in zip(probs, m)]


def test_the_two_top_p_boundaries_differ_only_at_a_tie():
    probs = torch.tensor([[0.5, 0.25, 0.15, 0.1]])
    at_tie, off_tie = torch.tensor([[0.75]]), torch.tensor([[0.7]])
    assert top_p_keep(probs, at_tie, "reach").tolist() == [[True, True, False, False]]
    assert top_p_keep(probs, at_tie, "exceed").tolist() == [[True, True, True, False]]
    assert top_p_keep(probs, off_tie, "reach").tolist() == top_p_keep(probs, off_tie, "exceed").tolist()
    torch.testing.assert_close(
        renormalise(probs, top_p_keep(probs, at_tie, "reach")), torch.tensor([[2 / 3, 1 / 3, 0, 0]])
    )
    with pytest.raises(ValueError, match="boundary"):
        top_p_keep(probs, at_tie, "nearest")


@pytest.mark.parametrize(
    ("top_k", "top_p"),
    [(0, 0.75), (3, 1.0), (3, 0.75), (2, 0.5), (3, 0.6)],
    ids=["top-p tie", "top-k", "both, tie", "both", "both, off tie"],
)
def test_engine_sampling_distribution_is_transformers_plain_sampler(top_k, top_p):
    """The reference engine samples plain and speculative tokens from :func:`process_logits`; its support equals
    transformers' ``TopKLogitsWarper`` then ``TopPLogitsWarper`` (the engine's models are transformers'), ties at the
    top-p boundary included."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    logits = probs.log()[None]
    got = process_logits(logits[None], torch.ones(1), torch.tensor([top_k]), torch.tensor([top_p]))[0, 0]
    scores = logits.clone()
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    want = torch.softmax(scores, -1)[0]
    assert (got > 0).tolist() == (want > 0).tolist()
    torch.testing.assert_close(got, want)
