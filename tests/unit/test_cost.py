"""Hardware-aware node budget (``core.cost`` and SAGE's ``node_budget="auto"``) against naive per-request loops."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sage_plugin.config import AlgorithmConfig, ConfigError
from sage_plugin.core.cost import RoundCost, best_count, cheapest_at_least, expected_yield, next_level_can_pay
from sage_plugin.core.level_expansion import budget_top_n, new_pool
from sage_plugin.core.policies import build_policy

NEG = float("-inf")


def _rows(draw_lists):
    width = max(len(r) for r in draw_lists)
    return torch.tensor([r + [NEG] * (width - len(r)) for r in draw_lists], dtype=torch.float32)


logp_rows = st.lists(
    st.lists(st.floats(-6.0, 0.0, allow_nan=False, width=32), min_size=0, max_size=9), min_size=1, max_size=4
).filter(lambda rows: max(len(r) for r in rows) > 0)


def _yields_ref(rows, n):
    """Expected tokens of a round verifying each row's ``q`` likeliest nodes, for q = 0..n: ``[yield(0), ...]``."""
    out = [float(len(rows))] * (n + 1)
    for r in rows:
        tops = list(itertools.accumulate(sorted((math.exp(x) for x in r), reverse=True)))
        for q in range(1, n + 1):
            out[q] += tops[min(q, len(tops)) - 1] if tops else 0.0
    return out


@settings(max_examples=150, deadline=None)
@given(rows=logp_rows, draft_ms=st.floats(0.0, 10.0), base=st.floats(1.0, 50.0), slope=st.floats(0.0, 20.0))
def test_expected_yield_and_best_count_match_naive(rows, draft_ms, base, slope):
    node_logp = _rows(rows)
    n = node_logp.shape[1]
    got = expected_yield(node_logp)
    ref = _yields_ref(rows, n)
    assert got.tolist() == pytest.approx(ref, rel=1e-5)
    round_ms = draft_ms + base + slope * torch.arange(n + 1, dtype=torch.float32) ** 1.3
    rates = [ref[q] / float(round_ms[q]) for q in range(n + 1)]
    q = int(best_count(node_logp, round_ms))
    assert rates[q] == pytest.approx(max(rates), rel=1e-5)
    # a smaller tree within float32 noise of the best one is a near-tie the float64 oracle cannot order
    assume(all(abs(r - rates[q]) > 1e-5 * rates[q] for r in rates[:q]))
    assert all(r < rates[q] for r in rates[:q]), "ties go to the smaller tree"


def test_exact_tie_goes_to_the_smaller_tree():
    """Yield 1 / cost 2 and yield 1.5 / cost 3 are the same rate exactly: the cut keeps the smaller tree."""
    node_logp = torch.tensor([[math.log(0.5)]])
    assert int(best_count(node_logp, torch.tensor([2.0, 3.0]))) == 0
    assert int(best_count(node_logp, torch.tensor([2.0, 2.9]))) == 1


@settings(max_examples=150, deadline=None)
@given(rows=logp_rows, q=st.integers(0, 10))
def test_the_cut_top_q_mask_matches_naive(rows, q):
    """The cut's node choice (``budget_top_n`` over the nodes, one q for the batch) against a per-request sort."""
    node_logp = _rows(rows)
    mask = budget_top_n(node_logp > NEG, node_logp, torch.tensor(q).expand(node_logp.shape[0]))
    for b, r in enumerate(rows):
        order = sorted(range(len(r)), key=lambda i: (-r[i], i))[:q]  # stable: earlier index first on ties
        assert [i for i in range(node_logp.shape[1]) if mask[b, i]] == sorted(order)


def test_worked_example_of_the_module_docstring():
    node_logp = torch.log(torch.tensor([[0.8, 0.5, 0.1]]))
    cost = RoundCost(torch.tensor([35.0, 37.0, 45.0, 53.0]), 3.0)
    round_ms = cost.round_ms(forwards=2, nodes=3)
    assert round_ms.tolist() == [41.0, 43.0, 51.0, 59.0]
    assert expected_yield(node_logp).tolist() == pytest.approx([1.0, 1.8, 2.3, 2.4])
    assert int(best_count(node_logp, round_ms)) == 2


def test_round_cost_from_samples_interpolates_and_is_monotone():
    cost = RoundCost.from_samples([0, 1, 3, 7], [10.0, 12.0, 11.0, 20.0], draft_ms=2.0, max_nodes=9)
    v = cost.verify_ms.tolist()
    assert len(v) == 10
    assert v[:2] == [10.0, 12.0]
    assert v[2] == 12.0 and v[3] == 12.0  # 11.5 and 11 (noise) lifted to the running max
    assert v[4] == pytest.approx(13.25) and v[5] == pytest.approx(15.5)  # linear from (3, 11) to (7, 20)
    assert v[7] == 20.0 and v[8] == 20.0 and v[9] == 20.0
    assert all(a <= b for a, b in zip(v, v[1:]))
    # counts past the measured curve cost its last value
    assert cost.round_ms(forwards=1, nodes=12).tolist()[-1] == 22.0


@given(ms=st.lists(st.floats(1.0, 500.0, allow_nan=False), min_size=1, max_size=40))
def test_cheapest_at_least_matches_naive(ms):
    """Suffix minimum: run[q] is the smallest q' >= q of least cost, and its price is that cost."""
    price, run = cheapest_at_least(ms)
    for q in range(len(ms)):
        best = min(ms[q:])
        assert run[q] == q + ms[q:].index(best)
        assert price[q] == best
    assert all(a <= b for a, b in zip(price, price[1:]))


def test_round_cost_padded_runs_cheaper_sizes():
    """This CPU's shape (SmolLM2 verify ms by node count): 2-3 and 6-7 tokens cost more than 8."""
    counts, ms = list(range(9)), [60.0, 100.0, 119.0, 87.0, 91.0, 105.0, 126.0, 84.0, 90.0]
    cost = RoundCost.from_samples(counts, ms, 3.0, max_nodes=10, pad=True,
                                  draft_widths=[1, 2, 3, 4], draft_width_ms=[9.0, 14.0, 13.0, 12.0])  # fmt: skip
    assert cost.verify_ms.tolist() == [60.0, 84.0, 84.0, 84.0, 84.0, 84.0, 84.0, 84.0, 90.0, 90.0, 90.0]
    assert [cost.verify_nodes(q) for q in range(12)] == [0, 7, 7, 7, 7, 7, 7, 7, 8, 9, 10, 11]
    assert [cost.draft_width(w) for w in range(6)] == [0, 1, 4, 4, 4, 5]
    unpadded = RoundCost.from_samples(counts, ms, 3.0, max_nodes=10)
    assert unpadded.verify_ms.tolist()[:4] == [60.0, 100.0, 119.0, 119.0] and unpadded.verify_nodes(3) == 3


def test_config_node_budget_is_validated():
    assert AlgorithmConfig().node_budget == "auto"
    with pytest.raises(ConfigError, match="node_budget must be one of auto, fixed"):
        AlgorithmConfig(node_budget="gpu")


def _build(cfg: AlgorithmConfig, seed: int, bsz: int = 3):
    """Drive SAGE over random draft distributions; return (policy, plan, pool)."""
    pol = build_policy(cfg)
    gen = torch.Generator().manual_seed(seed)
    vocab = 40

    def logprobs(width):
        return torch.log_softmax(torch.randn(bsz, width, vocab, generator=gen) * 3.0, -1)

    state = pol.init_state(bsz, "cpu")
    state = type(state)(state.alpha, torch.zeros_like(state.first_round), state.history, state.planned)
    lp = logprobs(1)
    plan = pol.plan(state, lp[:, 0])
    pool, fr = new_pool(torch.zeros(bsz, dtype=torch.int64), pol.pool_capacity, pol.k)
    for level in range(1, pol.max_depth + 1):
        fr = pol.step(plan, pool, fr, lp, level)
        if level == pol.max_depth or not bool(fr.valid.any()):
            break
        lp = logprobs(fr.idx.shape[1])
    return pol, plan, pool


@pytest.mark.parametrize("pool_kind", ["kept", "beam"])
@pytest.mark.parametrize("seed", range(6))
def test_sage_auto_cut_is_the_naive_best_first_cut_and_a_tree(seed, pool_kind):
    cfg = AlgorithmConfig(rerank_pool=pool_kind)
    pol, plan, pool = _build(cfg, seed)
    full = pol.finalize(plan, pool)  # no measured cost: the whole tree (kept, the paper's) or its n_max best (beam)
    n_nodes = pol.pool_capacity - 1
    round_ms = RoundCost(30.0 + 4.0 * torch.arange(n_nodes + 1, dtype=torch.float32), 3.0).round_ms(4, n_nodes)
    cut = pol.finalize(plan, pool, round_ms)
    bsz = pool.count.shape[0]
    rows = []
    for b in range(bsz):
        cnt = int(pool.count[b])
        rows.append([float(pool.joint[b, i]) for i in range(1, cnt)])
    rates = [y / float(round_ms[q]) for q, y in enumerate(_yields_ref(rows, n_nodes))]
    q = max(range(n_nodes + 1), key=lambda i: (rates[i], -i))
    assert 0 < q < max(len(r) for r in rows), "a 4 ms/token verify cost must cut these trees"
    for b in range(bsz):
        kept = sorted(range(1, 1 + len(rows[b])), key=lambda i: (-rows[b][i - 1], i))[:q]
        n = int(cut.num_nodes[b])
        assert n == 1 + min(q, len(rows[b]))
        assert sorted(cut.source[b, 1:n].tolist()) == sorted(kept)
        parents = cut.parents[b, :n].tolist()
        assert parents[0] == -1 and all(0 <= parents[i] < i for i in range(1, n)), "ancestor-closed, level order"
        assert int(full.num_nodes[b]) == 1 + (len(rows[b]) if pool_kind == "kept" else min(len(rows[b]), cfg.n_max))


def test_sage_auto_keeps_everything_on_a_flat_cost_and_fixed_ignores_cost():
    pol, plan, pool = _build(AlgorithmConfig(), 11)
    n_nodes = pol.pool_capacity - 1
    flat = RoundCost(torch.full((n_nodes + 1,), 30.0), 3.0).round_ms(4, n_nodes)
    steep = RoundCost(30.0 + 100.0 * torch.arange(n_nodes + 1, dtype=torch.float32), 3.0).round_ms(4, n_nodes)
    full = pol.finalize(plan, pool)
    assert torch.equal(pol.finalize(plan, pool, flat).num_nodes, full.num_nodes)
    assert bool(pol.keep_drafting(pool, 1, flat))
    assert int(pol.finalize(plan, pool, steep).num_nodes.max()) == 1, "a token costing 3 plain steps never pays"
    assert not bool(pol.keep_drafting(pool, 1, steep))
    fixed_pol, fplan, fpool = _build(AlgorithmConfig(node_budget="fixed"), 11)
    assert not fixed_pol.wants_cost
    assert torch.equal(fixed_pol.finalize(fplan, fpool, steep).num_nodes, full.num_nodes)
    for policy in ("eagle2", "static", "chain"):
        assert not build_policy(AlgorithmConfig(policy=policy)).wants_cost


def test_keep_drafting_asks_whether_the_newest_level_is_in_the_cut():
    pol, plan, pool = _build(AlgorithmConfig(), 3, bsz=1)
    n_nodes = pol.pool_capacity - 1
    deepest = int(pool.depths[0, : int(pool.count[0])].max())
    assert deepest >= 2
    mild = RoundCost(30.0 + 0.5 * torch.arange(n_nodes + 1, dtype=torch.float32), 3.0).round_ms(4, n_nodes)
    cut = pol.finalize(plan, pool, mild)
    in_cut_depths = set(cut.depths[0, 1 : int(cut.num_nodes[0])].tolist())
    for level in range(1, deepest + 1):
        assert bool(pol.keep_drafting(pool, level, mild)) == (level in in_cut_depths)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), bsz=st.integers(1, 3), draft_ms=st.floats(0.0, 30.0), slope=st.floats(0.0, 3.0))
def test_next_level_bound_matches_a_naive_oracle(seed, bsz, draft_ms, slope):
    """The look-ahead bound against lists: the rate now, and with one virtual child per node of the level carrying its
    parent's probability under one more forward."""
    pol, _, pool = _build(AlgorithmConfig(), seed, bsz=bsz)
    n_nodes = pol.pool_capacity - 1
    cost = RoundCost(30.0 + slope * torch.arange(n_nodes + 1, dtype=torch.float32), draft_ms)
    now_ms, next_ms = cost.round_ms(3, n_nodes), cost.round_ms(4, n_nodes)
    deepest = int(pool.depths.max())
    for level in range(1, deepest + 1):
        rows, virt = [], []
        for b in range(bsz):
            cnt = int(pool.count[b])
            rows.append([float(pool.joint[b, i]) for i in range(1, cnt)])
            virt.append(rows[-1] + [float(pool.joint[b, i]) for i in range(1, cnt) if int(pool.depths[b, i]) == level])
        now = max(y / float(now_ms[q]) for q, y in enumerate(_yields_ref(rows, n_nodes)))
        bound = max(y / float(next_ms[q]) for q, y in enumerate(_yields_ref(virt, n_nodes)))
        if abs(bound - now) > 1e-6 * now:  # float32 ties are the kernel's to break
            assert bool(next_level_can_pay(pool, level, now_ms, next_ms)) == (bound > now), (level, bound, now)


def test_lookahead_stops_a_level_whose_forward_cannot_pay():
    """A cheap verify keeps every drafted level in the cut; the look-ahead still stops when one more draft forward
    costs more than the best the next level could add, and not when it is cheap; ``lookahead: false`` is the cut
    rule alone."""
    pol, _, pool = _build(AlgorithmConfig(), 5, bsz=1)
    n_nodes = pol.pool_capacity - 1
    verify = 30.0 + 0.01 * torch.arange(n_nodes + 1, dtype=torch.float32)
    cheap, dear = RoundCost(verify, 0.01), RoundCost(verify, 500.0)
    assert bool(pol.keep_drafting(pool, 1, cheap.round_ms(2, n_nodes)))
    assert bool(pol.keep_drafting(pool, 1, cheap.round_ms(2, n_nodes), cheap.round_ms(3, n_nodes)))
    assert not bool(pol.keep_drafting(pool, 1, dear.round_ms(2, n_nodes), dear.round_ms(3, n_nodes)))
    off, _, off_pool = _build(AlgorithmConfig(lookahead=False), 5, bsz=1)
    assert bool(off.keep_drafting(off_pool, 1, dear.round_ms(2, n_nodes), dear.round_ms(3, n_nodes)))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000), bsz=st.integers(1, 3), draft_ms=st.floats(0.0, 30.0), slope=st.floats(0.0, 3.0),
    n_max=st.sampled_from([4, 16, 64]),
)  # fmt: skip
def test_keep_drafting_is_the_naive_cut_and_lookahead_under_the_rerank_cap(seed, bsz, draft_ms, slope, n_max):
    """SAGE's per-level test (one ranking of the pool: ``core.cost.level_pays``) against lists: the best-first cut of
    at most ``n_max`` nodes (the beam's rerank) holds a node of the level, and the level's look-ahead bound beats the
    rate now."""
    pol, _, pool = _build(AlgorithmConfig(n_max=n_max), seed, bsz=bsz)
    n_nodes = pol.pool_capacity - 1
    cost = RoundCost(30.0 + slope * torch.arange(n_nodes + 1, dtype=torch.float32), draft_ms)
    now_ms, next_ms = cost.round_ms(3, n_nodes), cost.round_ms(4, n_nodes)
    cap = min(n_max, n_nodes)
    rows, depth_of = [], []
    for b in range(bsz):
        cnt = int(pool.count[b])
        rows.append([float(pool.joint[b, i]) for i in range(1, cnt)])
        depth_of.append([int(pool.depths[b, i]) for i in range(1, cnt)])
    rates = [y / float(now_ms[q]) for q, y in enumerate(_yields_ref(rows, cap))]
    q = max(range(cap + 1), key=lambda i: (rates[i], -i))
    if any(abs(r - rates[q]) <= 1e-6 * rates[q] for i, r in enumerate(rates) if i != q):
        return  # a float32 tie between two cut sizes is the kernel's to break
    cut_depths = set()
    for b in range(bsz):
        best = sorted(range(len(rows[b])), key=lambda i: (-rows[b][i], i))[:q]
        cut_depths |= {depth_of[b][i] for i in best}
    for level in range(1, int(pool.depths.max()) + 1):
        virt = [r + [x for x, d in zip(r, ds) if d == level] for r, ds in zip(rows, depth_of)]
        bound = max(y / float(next_ms[i]) for i, y in enumerate(_yields_ref(virt, cap)))
        if abs(bound - rates[q]) <= 1e-6 * rates[q]:
            continue
        want = level in cut_depths and bound > rates[q]
        assert bool(pol.keep_drafting(pool, level, now_ms, next_ms)) == want, (level, bound, rates[q])
        assert bool(pol.keep_drafting(pool, level, now_ms)) == (level in cut_depths)
