"""Batched tree layout helpers (sage_plugin.core.tree, and the test-only conversions in tests/oracles/tree_formats.py)
against per-request references."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.config import MC_SIM_7B_63
from sage_plugin.core.tree import DraftTree, ancestor_mask, codes_of_choices, path_code, tree_from_choices
from tests.oracles import ancestor_mask_ref, positions_ref, retrieve_arrays_ref
from tests.oracles.tree_formats import (
    choices_from_tree,
    flatten_tree,
    parents_from_retrieve_arrays,
    to_retrieve_arrays,
    tree_positions,
)


@st.composite
def ragged_parents(draw, max_batch=4, max_nodes=12):
    """A padded batch of random trees: ``(parents [B, N], depths [B, N], num_nodes [B], max_depth)``.

    Node 0 is the root, ``parent[i] < i`` on real nodes, -1 on padding.
    """
    bsz = draw(st.integers(1, max_batch))
    sizes = [draw(st.integers(1, max_nodes)) for _ in range(bsz)]
    width = max(sizes) + draw(st.integers(0, 2))
    parents = torch.full((bsz, width), -1, dtype=torch.int64)
    depths = torch.full((bsz, width), -1, dtype=torch.int64)
    for b, n in enumerate(sizes):
        depths[b, 0] = 0
        for i in range(1, n):
            # bias towards recent parents so deep chains occur too
            p = draw(st.one_of(st.integers(0, i - 1), st.just(i - 1)))
            parents[b, i] = p
            depths[b, i] = depths[b, p] + 1
    max_depth = int(depths.max())
    return parents, depths, torch.tensor(sizes, dtype=torch.int64), max_depth


@settings(max_examples=80, deadline=None)
@given(ragged_parents())
def test_ancestor_mask_matches_reference(data):
    parents, _, num_nodes, max_depth = data
    mask = ancestor_mask(parents, max_depth)
    assert mask.dtype == torch.bool and mask.shape == (*parents.shape, parents.shape[1])
    for b in range(parents.shape[0]):
        assert mask[b].tolist() == ancestor_mask_ref(parents[b].tolist())
    # a larger hop bound changes nothing
    assert torch.equal(mask, ancestor_mask(parents, max_depth + 3))


@settings(max_examples=60, deadline=None)
@given(ragged_parents(), st.lists(st.integers(0, 10_000), min_size=4, max_size=4))
def test_positions_match_reference(data, prefixes):
    _, depths, _, _ = data
    prefix = torch.tensor(prefixes[: depths.shape[0]], dtype=torch.int64)
    pos = tree_positions(depths, prefix)
    for b in range(depths.shape[0]):
        assert pos[b].tolist() == positions_ref(depths[b].tolist(), prefixes[b])


@settings(max_examples=80, deadline=None)
@given(ragged_parents())
def test_retrieve_arrays_match_reference_and_round_trip(data):
    parents, _, num_nodes, _ = data
    idx, nxt, sib = to_retrieve_arrays(parents, num_nodes)
    for b in range(parents.shape[0]):
        r_idx, r_nxt, r_sib = retrieve_arrays_ref(parents[b].tolist(), int(num_nodes[b]), b)
        assert idx[b].tolist() == r_idx
        assert nxt[b].tolist() == r_nxt
        assert sib[b].tolist() == r_sib
    assert torch.equal(parents_from_retrieve_arrays(nxt, sib), parents)


def test_retrieve_arrays_docstring_example():
    idx, nxt, sib = to_retrieve_arrays(torch.tensor([[-1, 0, 0, 1, 3]]), torch.tensor([5]))
    assert idx.tolist() == [[0, 1, 2, 3, 4]]
    assert nxt.tolist() == [[1, 3, -1, 4, -1]]
    assert sib.tolist() == [[-1, 2, -1, -1, -1]]


@st.composite
def choice_sets(draw):
    """A random ancestor-closed set of rank paths (k, paths)."""
    k = draw(st.integers(2, 6))
    paths: set[tuple[int, ...]] = set()
    frontier = [()]
    for _ in range(draw(st.integers(1, 25))):
        parent = draw(st.sampled_from(sorted(frontier, key=lambda p: (len(p), p))))
        if len(parent) >= 5:
            continue
        child = parent + (draw(st.integers(0, k - 1)),)
        if child not in paths:
            paths.add(child)
            frontier.append(child)
    if not paths:
        paths.add((0,))
    order = draw(st.permutations(sorted(paths)))
    return k, [list(p) for p in order]


@settings(max_examples=80, deadline=None)
@given(choice_sets())
def test_choices_round_trip(data):
    _, choices = data
    parents, depths, ranks = tree_from_choices(choices)
    assert len(parents) == len(depths) == len(ranks) == len(choices) + 1
    # level order, depths consistent
    for i in range(1, len(parents)):
        assert 0 <= parents[i] < i
        assert depths[i] == depths[parents[i]] + 1
        assert depths[i] >= depths[i - 1]
    assert choices_from_tree(parents, ranks) == sorted(choices, key=lambda p: (len(p), p))
    # padding after the real nodes is ignored
    assert choices_from_tree(parents + [-1, -1], ranks + [-1, -1]) == sorted(choices, key=lambda p: (len(p), p))


def test_mc_sim_7b_63_round_trip_and_shape():
    parents, depths, ranks = tree_from_choices(MC_SIM_7B_63)
    assert [depths.count(d) for d in range(1, 6)] == [4, 8, 8, 3, 2]
    assert choices_from_tree(parents, ranks) == sorted([list(p) for p in MC_SIM_7B_63], key=lambda p: (len(p), p))
    assert tree_from_choices([[0], [1], [0, 0]]) == ([-1, 0, 0, 1], [0, 1, 1, 2], [-1, 0, 1, 0])


@settings(max_examples=60, deadline=None)
@given(choice_sets())
def test_path_codes_unique_and_consistent(data):
    k, choices = data
    codes = codes_of_choices(choices, k)
    assert len(set(codes)) == len(codes)
    assert 0 not in codes  # 0 is the root's code
    for path, code in zip(choices, codes, strict=True):
        c = torch.tensor(0)
        for r in path:
            c = path_code(c, torch.tensor(r), k)
        assert int(c) == code


def test_path_code_unique_exhaustive_small():
    k = 3
    seen = {}
    paths = [()]
    for _ in range(4):
        paths = [p + (r,) for p in paths for r in range(k)]
        for p in paths:
            code = codes_of_choices([p], k)[0]
            assert code not in seen, (p, seen.get(code))
            seen[code] = p
    assert int(path_code(path_code(torch.tensor(0), torch.tensor(1), 10), torch.tensor(0), 10)) == 23


@settings(max_examples=50, deadline=None)
@given(ragged_parents(), st.integers(0, 2**31 - 1))
def test_flatten_tree_csr(data, seed):
    parents, depths, num_nodes, max_depth = data
    g = torch.Generator().manual_seed(seed)
    bsz, width = parents.shape
    valid = torch.arange(width) < num_nodes[:, None]
    tokens = torch.where(valid, torch.randint(0, 100, (bsz, width), generator=g), -1)
    tree = DraftTree(
        tokens=tokens,
        parents=parents,
        depths=depths,
        num_nodes=num_nodes,
        draft_logp=torch.where(valid, -torch.rand(bsz, width, generator=g), float("-inf")),
        ranks=torch.where(valid, 0, -1),
        max_depth=max_depth,
        node_conf=torch.full((bsz, width), float("nan")),
    )
    assert torch.equal(tree.valid(), valid)
    f_tokens, f_parents, f_depths, cu = flatten_tree(tree)
    assert cu.tolist()[0] == 0 and cu.tolist()[-1] == int(num_nodes.sum()) == f_tokens.numel()
    for b in range(bsz):
        lo, hi = int(cu[b]), int(cu[b + 1])
        n = int(num_nodes[b])
        assert hi - lo == n
        assert f_tokens[lo:hi].tolist() == tokens[b, :n].tolist()
        assert f_parents[lo:hi].tolist() == parents[b, :n].tolist()  # local indices
        assert f_depths[lo:hi].tolist() == depths[b, :n].tolist()


@pytest.mark.parametrize("max_depth", [3, 5])
def test_ancestor_mask_docstring_example(max_depth):
    mask = ancestor_mask(torch.tensor([[-1, 0, 0, 1, 3]]), max_depth)[0].int().tolist()
    assert mask == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]
