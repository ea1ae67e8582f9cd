"""Tree verification (sage_plugin.core.verify) against per-request references."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sage_plugin.core.tree import DraftTree
from sage_plugin.core.verify import greedy_verify, process_logits, sample_verify, walk_tree
from tests.oracles import greedy_verify_ref, process_logits_ref

VOCAB = 12


def make_tree(parents_rows, tokens_rows, width, max_depth=None):
    """A padded :class:`DraftTree` from per-request lists."""
    bsz = len(parents_rows)
    tokens = torch.full((bsz, width), -1, dtype=torch.int64)
    parents = torch.full((bsz, width), -1, dtype=torch.int64)
    depths = torch.full((bsz, width), -1, dtype=torch.int64)
    for b, (par, tok) in enumerate(zip(parents_rows, tokens_rows, strict=True)):
        d = [0]
        for i in range(1, len(par)):
            d.append(d[par[i]] + 1)
        n = len(par)
        tokens[b, :n] = torch.tensor(tok)
        parents[b, :n] = torch.tensor(par)
        depths[b, :n] = torch.tensor(d)
    num = torch.tensor([len(p) for p in parents_rows], dtype=torch.int64)
    valid = torch.arange(width) < num[:, None]
    return DraftTree(
        tokens=tokens,
        parents=parents,
        depths=depths,
        num_nodes=num,
        draft_logp=torch.where(valid, -1.0, float("-inf")),
        ranks=torch.where(valid, 0, -1),
        max_depth=int(depths.max()) if max_depth is None else max_depth,
        node_conf=torch.full((bsz, width), float("nan")),
    )


@st.composite
def verify_cases(draw, max_batch=4, max_nodes=14):
    """Random trees with distinct sibling tokens and a target argmax per node that often picks a
    child's token (so accepted paths are long)."""
    seed = draw(st.integers(0, 2**31 - 1))
    rng = random.Random(seed)
    bsz = draw(st.integers(1, max_batch))
    par_rows, tok_rows, am_rows = [], [], []
    for _ in range(bsz):
        n = rng.randint(1, max_nodes)
        par, tok = [-1], [rng.randrange(VOCAB)]
        kids: dict[int, list[int]] = {0: []}
        for i in range(1, n):
            p = rng.choice([i - 1, rng.randrange(i)]) if rng.random() < 0.8 else rng.randrange(i)
            used = {tok[c] for c in kids[p]}
            free = [t for t in range(VOCAB) if t not in used]
            par.append(p)
            tok.append(rng.choice(free))
            kids[p].append(i)
            kids[i] = []
        am = []
        for i in range(n):
            if kids[i] and rng.random() < 0.75:
                am.append(tok[rng.choice(kids[i])])
            else:
                am.append(rng.randrange(VOCAB))
        par_rows.append(par)
        tok_rows.append(tok)
        am_rows.append(am)
    width = max(len(p) for p in par_rows) + draw(st.integers(0, 2))
    return par_rows, tok_rows, am_rows, width


def logits_from_argmax(am_rows, width, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(am_rows), width, VOCAB, generator=g)
    for b, am in enumerate(am_rows):
        for i, t in enumerate(am):
            logits[b, i, t] = 10.0
    return logits


def check_against_reference(res, par_rows, tok_rows, am_rows, max_depth):
    for b in range(len(par_rows)):
        path, tau, bonus, emitted = greedy_verify_ref(tok_rows[b], par_rows[b], am_rows[b])
        assert int(res.num_accepted[b]) == tau
        assert int(res.bonus[b]) == bonus
        assert res.accepted_nodes[b].tolist() == path + [-1] * (max_depth + 1 - len(path))
        assert res.emitted[b].tolist() == emitted + [-1] * (max_depth + 1 - len(emitted))
        # emitted: tau + 1 valid tokens, then padding
        row = res.emitted[b].tolist()
        assert all(t >= 0 for t in row[: tau + 1]) and all(t == -1 for t in row[tau + 1 :])


@settings(max_examples=80, deadline=None)
@given(verify_cases())
def test_greedy_verify_matches_reference(case):
    par_rows, tok_rows, am_rows, width = case
    tree = make_tree(par_rows, tok_rows, width)
    res = greedy_verify(tree, logits_from_argmax(am_rows, width))
    assert res.accepted_nodes.shape == res.emitted.shape == (len(par_rows), tree.max_depth + 1)
    check_against_reference(res, par_rows, tok_rows, am_rows, tree.max_depth)


@settings(max_examples=40, deadline=None)
@given(verify_cases(), st.integers(0, 3))
def test_greedy_verify_batched_equals_single(case, extra_depth):
    par_rows, tok_rows, am_rows, width = case
    max_depth = max(max(_depths(p)) for p in par_rows) + extra_depth
    logits = logits_from_argmax(am_rows, width)
    batched = greedy_verify(make_tree(par_rows, tok_rows, width, max_depth), logits)
    for b in range(len(par_rows)):
        single = greedy_verify(make_tree([par_rows[b]], [tok_rows[b]], width, max_depth), logits[b : b + 1])
        for f in ("accepted_nodes", "num_accepted", "bonus", "emitted"):
            assert torch.equal(getattr(single, f)[0], getattr(batched, f)[b]), f


def _depths(par):
    d = [0]
    for i in range(1, len(par)):
        d.append(d[par[i]] + 1)
    return d


def test_long_path_is_found():
    # a chain of 6 where the target agrees everywhere: tau = 6, bonus from the last node
    par = [-1, 0, 1, 2, 3, 4, 5]
    tok = [3, 4, 5, 6, 7, 8, 9]
    am = [4, 5, 6, 7, 8, 9, 1]
    res = greedy_verify(make_tree([par], [tok], 7), logits_from_argmax([am], 7))
    assert int(res.num_accepted[0]) == 6 and int(res.bonus[0]) == 1
    assert res.emitted[0].tolist() == [4, 5, 6, 7, 8, 9, 1]


def test_module_docstring_example():
    # tokens [The, cat, dog, sat, on] = [0, 1, 2, 3, 4]; argmax per node [cat, sat, ran, in, the]
    par, tok, am = [-1, 0, 0, 1, 3], [0, 1, 2, 3, 4], [1, 3, 5, 6, 0]
    res = greedy_verify(make_tree([par], [tok], 5), logits_from_argmax([am], 5))
    assert res.accepted_nodes[0].tolist() == [0, 1, 3, -1]
    assert int(res.num_accepted[0]) == 2 and int(res.bonus[0]) == 6
    assert res.emitted[0].tolist() == [1, 3, 6, -1]


@settings(max_examples=40, deadline=None)
@given(verify_cases())
def test_walk_tree_with_sampled_tokens_matches_reference(case):
    par_rows, tok_rows, am_rows, width = case
    tree = make_tree(par_rows, tok_rows, width)
    chosen = torch.zeros(len(par_rows), width, dtype=torch.int64)
    for b, am in enumerate(am_rows):
        chosen[b, : len(am)] = torch.tensor(am)
    check_against_reference(walk_tree(tree, chosen), par_rows, tok_rows, am_rows, tree.max_depth)


@settings(max_examples=40, deadline=None)
@given(verify_cases(), st.integers(0, 2**31 - 1))
def test_sample_verify_temperature_zero_is_greedy(case, seed):
    par_rows, tok_rows, am_rows, width = case
    tree = make_tree(par_rows, tok_rows, width)
    bsz = len(par_rows)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bsz, width, VOCAB, generator=g) * 3
    greedy = greedy_verify(tree, logits)
    gen = torch.Generator().manual_seed(seed)
    top_k = torch.randint(0, VOCAB + 2, (bsz,), generator=g)
    top_p = torch.rand(bsz, generator=g) * 0.9 + 0.1
    sampled = sample_verify(tree, logits, torch.zeros(bsz), top_k, top_p, generator=gen)
    for f in ("accepted_nodes", "num_accepted", "bonus", "emitted"):
        assert torch.equal(getattr(sampled, f), getattr(greedy, f)), f
    # mixed batch: greedy rows stay greedy when other rows sample
    temp = torch.tensor([0.0 if b % 2 == 0 else 1.0 for b in range(bsz)])
    mixed = sample_verify(tree, logits, temp, top_k, top_p, generator=gen)
    for b in range(0, bsz, 2):
        assert torch.equal(mixed.emitted[b], greedy.emitted[b])


@st.composite
def logits_cases(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    vocab = draw(st.integers(2, 16))
    bsz = draw(st.integers(1, 3))
    nodes = draw(st.integers(1, 3))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bsz, nodes, vocab, generator=g, dtype=torch.float64) * draw(st.sampled_from([0.5, 2.0, 5.0]))
    temp = [draw(st.sampled_from([0.3, 0.7, 1.0, 1.6])) for _ in range(bsz)]
    top_k = [draw(st.one_of(st.none(), st.integers(0, vocab + 2))) for _ in range(bsz)]
    top_p = [draw(st.one_of(st.none(), st.floats(0.05, 1.0))) for _ in range(bsz)]
    return logits.float(), temp, top_k, top_p


def _top_p_is_clear(p_sorted_mass: list[float], top_p: float) -> bool:
    return all(abs(m - top_p) > 1e-4 for m in p_sorted_mass)


@settings(max_examples=80, deadline=None)
@given(logits_cases())
def test_process_logits_matches_reference(case):
    logits, temp, top_k, top_p = case
    bsz, nodes, vocab = logits.shape
    k_t = torch.tensor([0 if k is None else k for k in top_k], dtype=torch.int64)
    p_t = torch.tensor([1.0 if p is None else p for p in top_p])
    probs = process_logits(logits, torch.tensor(temp), k_t, p_t)
    assert probs.shape == logits.shape and probs.dtype == torch.float32
    for b in range(bsz):
        for n in range(nodes):
            row = logits[b, n].double().tolist()
            # the reference applies top-p to the top-k-filtered distribution; skip near-boundaries
            after_k = process_logits_ref(row, temp[b], top_k[b], None)
            mass = sorted(after_k, reverse=True)
            cums = [sum(mass[: i + 1]) for i in range(len(mass))]
            assume(top_p[b] is None or _top_p_is_clear(cums, top_p[b]))
            ref = process_logits_ref(row, temp[b], top_k[b], top_p[b])
            got = probs[b, n].tolist()
            assert got == pytest.approx(ref, abs=2e-6)
            # same support: filtered tokens are exactly 0 (tokens of float-negligible mass
            # are the subject of test_process_logits_top_p_one_keeps_full_support)
            for g_, r_ in zip(got, ref, strict=True):
                if r_ == 0.0:
                    assert g_ == 0.0
                elif r_ > 1e-6:
                    assert g_ > 0.0
    # no filters: plain softmax at the temperature
    plain = process_logits(logits, torch.tensor(temp))
    assert torch.allclose(plain, torch.softmax(logits / torch.tensor(temp)[:, None, None], -1), atol=1e-6)


def test_process_logits_top_k_ties_are_kept():
    logits = torch.tensor([[[3.0, 1.0, 1.0, 0.0]]])
    probs = process_logits(logits, torch.tensor([1.0]), torch.tensor([2]))
    ref = process_logits_ref([3.0, 1.0, 1.0, 0.0], 1.0, 2)
    assert probs[0, 0].tolist() == pytest.approx(ref)
    assert ref[3] == 0.0 and ref[1] > 0 and ref[2] > 0


def test_process_logits_top_p_one_keeps_full_support():
    """``top_p = 1`` is documented to disable nucleus filtering; every token with p > 0 must stay.

    The float32 cumulative sum before the last token rounds to exactly 1.0, and the rule
    ``before >= top_p`` then drops a token whose true probability is ~1e-13 (> 0 in float32).
    """
    logits = torch.tensor([[[0.0, -30.0, -5.0]]])
    plain = torch.softmax(logits, -1)
    assert float(plain[0, 0, 1]) > 0.0
    filtered = process_logits(logits, torch.tensor([1.0]), None, torch.tensor([1.0]))
    assert float(filtered[0, 0, 1]) > 0.0, "top_p=1 removed a token of positive probability"
    assert torch.allclose(filtered, plain)


def test_process_logits_top_p_boundary_rule():
    # p = [0.5, 0.3, 0.2]: top_p 0.5 keeps only the first token (its mass reaches 0.5)
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.2]]]))
    probs = process_logits(logits, torch.tensor([1.0]), None, torch.tensor([0.5]))
    assert probs[0, 0].tolist() == pytest.approx([1.0, 0.0, 0.0])
    probs = process_logits(logits, torch.tensor([1.0]), None, torch.tensor([0.55]))
    assert probs[0, 0].tolist() == pytest.approx([0.625, 0.375, 0.0])
    ref = process_logits_ref([math.log(0.5), math.log(0.3), math.log(0.2)], 1.0, None, 0.55)
    assert ref == pytest.approx([0.625, 0.375, 0.0])


@settings(max_examples=30, deadline=None)
@given(verify_cases())
def test_narrowed_tree_verifies_the_same(case):
    par_rows, tok_rows, am_rows, width = case
    tree = make_tree(par_rows, tok_rows, width + 3)
    if not hasattr(tree, "narrow"):
        pytest.skip("DraftTree.narrow not available")
    n = int(tree.num_nodes.max())
    small = tree.narrow(n)
    assert small.width == n and torch.equal(small.num_nodes, tree.num_nodes)
    logits = logits_from_argmax(am_rows, width + 3)
    a, b = greedy_verify(tree, logits), greedy_verify(small, logits[:, :n])
    for f in ("accepted_nodes", "num_accepted", "bonus", "emitted"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


@settings(max_examples=40, deadline=None)
@given(verify_cases(), st.integers(0, 6))
def test_a_tighter_depth_bound_verifies_alike(case, slack):
    """``DraftTree.narrow(n, max_depth)`` (the engine passes the levels it drafted): any bound at or above the
    deepest node gives the same verification, on a shorter accepted path row; a looser bound than the tree's own is
    ignored."""
    par_rows, tok_rows, am_rows, width = case
    deepest = max(max(_depths(p)) for p in par_rows)
    loose = make_tree(par_rows, tok_rows, width, deepest + 10)
    tight = loose.narrow(width, deepest + slack)
    assert tight.max_depth == min(deepest + slack, deepest + 10)
    assert loose.narrow(width, deepest + 20).max_depth == deepest + 10
    logits = logits_from_argmax(am_rows, width)
    a, b = greedy_verify(loose, logits), greedy_verify(tight, logits)
    assert torch.equal(a.num_accepted, b.num_accepted) and torch.equal(a.bonus, b.bonus)
    d = tight.max_depth + 1
    assert torch.equal(a.accepted_nodes[:, :d], b.accepted_nodes) and torch.equal(a.emitted[:, :d], b.emitted)
    assert bool((a.accepted_nodes[:, d:] == -1).all()) and bool((a.emitted[:, d:] == -1).all())
