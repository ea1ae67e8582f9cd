"""Top-k entropy and confidence (SAGE Eq. 7-9) against the by-hand reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.core.entropy import topk_confidence, topk_entropy
from tests.oracles import topk_confidence_ref, topk_entropy_ref


@st.composite
def logit_batches(draw):
    """``([B, V] logits float64, k)`` with varied sharpness (some rows nearly one-hot)."""
    vocab = draw(st.integers(2, 40))
    k = draw(st.integers(2, vocab))
    rows = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([draw(st.sampled_from([0.0, 0.1, 1.0, 3.0, 10.0])) for _ in range(rows)], dtype=torch.float64)
    logits = torch.randn(rows, vocab, generator=g, dtype=torch.float64) * scale[:, None]
    return logits, k


@settings(max_examples=60, deadline=None)
@given(logit_batches())
def test_batched_matches_reference(batch):
    logits, k = batch
    logprobs = torch.log_softmax(logits, -1).float()
    probs = [[math.exp(x) for x in row] for row in logprobs.double().tolist()]
    ent = topk_entropy(logprobs, k)
    conf = topk_confidence(logprobs, k)
    assert ent.shape == conf.shape == (logits.shape[0],)
    assert conf.dtype == torch.float32
    for i, p in enumerate(probs):
        assert float(ent[i]) == pytest.approx(topk_entropy_ref(p, k), abs=2e-5)
    assert conf.tolist() == pytest.approx(topk_confidence_ref(probs, k), abs=2e-5)
    assert bool(((conf >= 0) & (conf <= 1)).all())
    assert bool(((ent >= -1e-6) & (ent <= math.log(k) + 1e-5)).all())


@settings(max_examples=40, deadline=None)
@given(logit_batches(), st.floats(-50.0, 50.0))
def test_invariant_to_additive_constant(batch, shift):
    logits, k = batch
    logits = logits.float()
    a = topk_confidence(logits, k)
    b = topk_confidence(logits + shift, k)
    assert torch.allclose(a, b, atol=2e-5)
    # logits and log-softmax give the same answer (Eq. 7 renormalises over the top-k)
    assert torch.allclose(a, topk_confidence(torch.log_softmax(logits, -1), k), atol=2e-5)


def test_leading_dimensions_are_batched():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 4, 11, generator=g)
    out = topk_confidence(logits, 5)
    assert out.shape == (2, 3, 4)
    flat = topk_confidence(logits.reshape(-1, 11), 5).reshape(2, 3, 4)
    assert torch.equal(out, flat)


@pytest.mark.parametrize("k", [2, 3, 10])
def test_one_hot_is_fully_confident(k):
    logits = torch.full((3, 16), -1e9)
    logits[torch.arange(3), torch.tensor([0, 7, 15])] = 0.0
    assert torch.allclose(topk_confidence(logits, k), torch.ones(3))
    # a true one-hot log-distribution (-inf elsewhere) too
    lp = torch.full((16,), float("-inf"))
    lp[4] = 0.0
    assert float(topk_confidence(lp, k)) == pytest.approx(1.0)
    assert float(topk_entropy(lp, k)) == pytest.approx(0.0)


@pytest.mark.parametrize("k", [2, 4, 10])
def test_flat_topk_has_zero_confidence(k):
    # the top-k are equal, the rest far below: the renormalised top-k is uniform
    logits = torch.cat([torch.zeros(k), torch.full((5,), -3.0)])
    assert float(topk_confidence(logits, k)) == pytest.approx(0.0, abs=1e-6)
    assert float(topk_entropy(logits, k)) == pytest.approx(math.log(k), abs=1e-5)
    # a fully uniform distribution over more than k tokens too
    assert float(topk_confidence(torch.zeros(3 * k), k)) == pytest.approx(0.0, abs=1e-6)


def test_docstring_example_values():
    lp = torch.log(torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0]))
    assert float(topk_entropy(lp, 4)) == pytest.approx(math.log(4), abs=1e-6)
    assert topk_confidence(torch.tensor([[0.0, 0.0, 0.0], [0.0, -1e9, -1e9]]), 3).tolist() == pytest.approx([0.0, 1.0])
