"""SAGE selection inside a fixed beam (:mod:`sage_plugin.core.beam_selection`) against the shared naive oracle
(:func:`tests.oracles.select_in_beam_ref`, built on the same SAGE rule oracle as the tree builder)."""

from __future__ import annotations

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sage_plugin.config import AlgorithmConfig
from sage_plugin.core.beam_selection import ShapedSelection, eagle_beam_candidates, select_shaped
from tests.oracles import select_in_beam_ref
from tests.oracles.rules import Margin

from .config_cases import SELECTION_SWITCHES as SWITCHES


class _RuleMargin(Margin):
    """The closest call of a threshold or width rounding only: the dyadic path probabilities order the budget cut
    exactly (equal ones by position, in both implementations), while ``theta0 * l / D`` is no dyadic number."""

    def note(self, gap: float, where: str) -> None:
        if not where.startswith("N_max"):
            super().note(gap, where)


def _random_beam(draw, bsz: int, topk: int, steps: int):
    """EAGLE-layout scores and parent_list with dyadic probabilities (exact products, no float ties to argue)."""
    scores, parents = [], []
    for _ in range(bsz):

        def children():
            w = sorted(draw(st.lists(st.integers(1, 32), min_size=topk, max_size=topk)), reverse=True)
            tot = max(sum(w), 32)
            return [x / tot if tot == 32 else x / 64 for x in w]

        row = children()  # level 1
        plist = [-1]
        prev = list(range(topk))
        for _ in range(1, steps):
            beam = draw(st.lists(st.sampled_from(prev), min_size=topk, max_size=topk, unique=True))
            plist += beam
            start = len(row)
            for b in beam:
                row += [row[b] * p for p in children()]
            prev = list(range(start, len(row)))
        scores.append(row)
        parents.append(plist)
    return torch.tensor(scores, dtype=torch.float32), torch.tensor(parents, dtype=torch.int64)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), bsz=st.integers(1, 3), topk=st.integers(1, 4), steps=st.integers(1, 4))
def test_select_shaped_matches_reference_and_is_a_tree(data, bsz, topk, steps):
    scores, plist = _random_beam(data.draw, bsz, topk, steps)
    m = scores.shape[1]
    cfg = AlgorithmConfig(
        **{k: data.draw(st.sampled_from(v)) for k, v in SWITCHES.items()},
        n_max=data.draw(st.integers(1, 12)),
        theta0=data.draw(st.sampled_from([0.0, 0.1, 0.3])),
    )
    d_plan = torch.tensor(data.draw(st.lists(st.integers(1, 6), min_size=bsz, max_size=bsz)))
    w_plan = torch.tensor(data.draw(st.lists(st.integers(1, 4), min_size=bsz, max_size=bsz)))
    n_select = data.draw(st.integers(1, m))
    static_first = None
    if data.draw(st.booleans()):  # some requests in their first round keep the static tree's nodes
        cfg = cfg.replace(
            static_tree=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]], k=4, w_min=1, w_max=4
        )
        static_first = torch.tensor(data.draw(st.lists(st.booleans(), min_size=bsz, max_size=bsz)))
    cands = eagle_beam_candidates(scores, plist, topk)
    got = select_shaped(cands, d_plan, w_plan, n_select, cfg, static_first)
    assert got.index.shape == (bsz, n_select)
    refs, margin = [], _RuleMargin()
    for b in range(bsz):
        refs.append(
            select_in_beam_ref(
                cfg,
                scores[b].tolist(),
                cands.parent[b].tolist(),
                cands.rank[b].tolist(),
                cands.depth.tolist(),
                int(d_plan[b]),
                int(w_plan[b]),
                n_select,
                static_first is not None and bool(static_first[b]),
                margin,
            )
        )
    assume(margin.value >= 1e-4)  # a decision float rounding could flip (a probability exactly at a threshold)
    for b, (ref_idx, ref_shaped) in enumerate(refs):
        assert got.index[b].tolist() == ref_idx
        assert int(got.shaped[b]) == ref_shaped
        chosen = set(ref_idx)
        for c in ref_idx:  # ancestor-closed: the verified nodes form a tree
            p = int(cands.parent[b, c])
            assert p < 0 or p in chosen


def test_layout_of_eagle_beam():
    # t = 2, steps = 3: 2 + 4 + 4 candidates; step-2 beam = candidates 2 and 5
    scores = torch.rand(1, 10)
    plist = torch.tensor([[-1, 0, 1, 2, 5]])
    c = eagle_beam_candidates(scores, plist, 2)
    assert c.parent.tolist() == [[-1, -1, 0, 0, 1, 1, 2, 2, 5, 5]]
    assert c.depth.tolist() == [1, 1, 2, 2, 2, 2, 3, 3, 3, 3] and c.levels == 3
    assert c.rank.tolist() == [[0, 1] * 5]


def test_confident_request_goes_deep_unsure_request_goes_wide():
    """Same beam, two plans: D=3/W=1 (confident) selects the chain, D=1/W=3 (unsure) the root's children."""
    topk = 3
    p = torch.tensor([0.5, 0.3, 0.2])
    lvl1 = p
    lvl2 = (lvl1[:, None] * p[None]).flatten()  # beam = the three root children
    lvl3 = (lvl2[[0, 1, 2], None] * p[None]).flatten()  # beam = a->a, a->b, a->c (candidates 3, 4, 5)
    scores = torch.cat([lvl1, lvl2, lvl3])[None].repeat(2, 1)
    plist = torch.tensor([[-1, 0, 1, 2, 3, 4, 5]]).repeat(2, 1)
    cands = eagle_beam_candidates(scores, plist, topk)
    cfg = AlgorithmConfig(theta0=0.0, rerank_pool="kept")  # the paper's levels choose the verified nodes
    sel = select_shaped(cands, torch.tensor([3, 1]), torch.tensor([1, 3]), 3, cfg)
    assert sel.index[0].tolist() == [0, 3, 12]  # a, a->a, a->a->a
    assert sel.index[1].tolist() == [0, 1, 2]  # a, b, c


def test_beam_pool_verifies_the_most_probable_paths_whatever_the_plan():
    """``rerank_pool: beam`` (default): the n best paths of the beam (SGLang's own top-N), for any plan; the shape
    only counts how many of them it kept.  ``children``: the children of what the shape grows come before the others;
    ``kept``: the shape's nodes first."""
    topk = 3
    p = torch.tensor([0.5, 0.3, 0.2])
    lvl2 = (p[:, None] * p[None]).flatten()  # 3 a->a .25, 4 a->b .15, 5 a->c .1, 6 b->a .15, ...
    lvl3 = (lvl2[[0, 1, 2], None] * p[None]).flatten()  # beam = a->a, a->b, a->c: 12 a->a->a .125
    scores = torch.cat([p, lvl2, lvl3])[None].repeat(2, 1)
    plist = torch.tensor([[-1, 0, 1, 2, 3, 4, 5]]).repeat(2, 1)
    cands = eagle_beam_candidates(scores, plist, topk)
    depth, width = torch.tensor([3, 1]), torch.tensor([1, 3])  # a chain plan (kept a, a->a, a->a->a); a wide one

    def select(n: int, pool: str) -> ShapedSelection:
        return select_shaped(cands, depth, width, n, AlgorithmConfig(theta0=0.0, rerank_pool=pool))

    beam = select(4, "beam")
    assert beam.index.tolist() == [[0, 1, 2, 3]] * 2  # a .5, b .3, c .2, a->a .25
    assert beam.shaped.tolist() == [2, 3]  # the chain plan kept a, a->a of them; the wide one a, b, c
    assert select(6, "beam").index.tolist() == [[0, 1, 2, 3, 4, 6]] * 2  # then a->b, b->a (.15 each)
    # the chain plan grows a and a->a only: b->a is no candidate, a->a->a (.125) is
    assert select(6, "children").index[0].tolist() == [0, 1, 2, 3, 4, 12]
    assert select(4, "kept").index[0].tolist() == [0, 1, 3, 12]  # a, a->a, a->a->a, then b


def test_first_round_keeps_the_static_tree_the_beam_holds():
    """A first-round request keeps exactly the static rank paths present in the beam, whatever its plan."""
    topk = 2
    scores = torch.tensor([[0.6, 0.3, 0.54, 0.03, 0.15, 0.12]])
    plist = torch.tensor([[-1, 0, 1]])
    cands = eagle_beam_candidates(scores, plist, topk)
    cfg = AlgorithmConfig(static_tree=((0,), (1,), (0, 1), (1, 1)), k=2, w_min=1, w_max=2)
    for pool in ("beam", "children", "kept"):
        cfg = cfg.replace(rerank_pool=pool)
        sel = select_shaped(cands, torch.tensor([1]), torch.tensor([1]), 4, cfg, torch.tensor([True]))
        assert sel.index.tolist() == [[0, 1, 3, 5]] and sel.shaped.tolist() == [4]  # a, b, a->rank 1, b->rank 1
        plain = select_shaped(cands, torch.tensor([1]), torch.tensor([1]), 4, cfg, torch.tensor([False]))
        assert plain.index.tolist() == [[0, 1, 2, 4]]  # the plan (D = 1, W = 1) keeps a; the rest by path value
