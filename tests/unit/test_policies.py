"""Tree policies (sage / eagle2 / static / chain) driven like a runtime, against ``build_tree_ref``.

A synthetic, deterministic "draft model" gives a distribution for every token path (seeded by a
hash of the request, its round and the path), and a synthetic target picks the draft's top-1 most
of the time, so trees are accepted deep and SAGE's alpha / D_max move over the rounds.  The fast
batched policy and the naive per-request reference are run side by side for several rounds, with
requests joining the batch at different rounds (mixed first-round / later-round rows).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.config import MC_SIM_7B_63, AlgorithmConfig
from sage_plugin.core.level_expansion import new_pool
from sage_plugin.core.policies import POLICIES, PolicyState, build_policy, policy_class
from sage_plugin.core.sage import pool_of
from sage_plugin.core.verify import greedy_verify
from tests.oracles import build_tree_ref, greedy_verify_ref, init_state_ref, observe_ref
from tests.oracles.tree_formats import choices_from_tree

VOCAB = 24


SHARPNESS = (0.5, 1.0, 1.6, 2.4, 3.2)


class World:
    """Deterministic synthetic draft and target models over ``VOCAB`` tokens."""

    def __init__(self, seed: int, vocab: int = VOCAB, sparse: float = 0.0) -> None:
        self.seed = seed
        self.vocab = vocab
        self.sparse = sparse  # share of distributions with only 1..4 tokens of positive probability
        self._lp = lru_cache(maxsize=None)(self._draft_logprobs)
        self._am = lru_cache(maxsize=None)(self._target_argmax)

    def _draft_logprobs(self, ctx, path) -> torch.Tensor:
        rng = random.Random(f"{self.seed}|draft|{ctx}|{path}")
        sharp = rng.choice(SHARPNESS)
        z = torch.tensor([rng.gauss(0.0, 1.0) * sharp for _ in range(self.vocab)], dtype=torch.float64)
        if rng.random() < self.sparse:  # zero-probability tokens inside the top-k
            keep = rng.sample(range(self.vocab), rng.randint(1, 4))
            z = torch.where(torch.isin(torch.arange(self.vocab), torch.tensor(keep)), z, float("-inf"))
        return torch.log_softmax(z, -1).float()

    def draft_logprobs(self, ctx, path) -> torch.Tensor:
        """float32 ``[V]`` draft log-probabilities after ``path`` (what the fast path sees)."""
        return self._lp(ctx, tuple(path))

    def draft_probs(self, ctx, path) -> list[float]:
        """The same distribution as float64 probabilities (what the reference sees)."""
        return [math.exp(x) for x in self.draft_logprobs(ctx, path).double().tolist()]

    def target_argmax(self, ctx, path) -> int:
        """The target's greedy token after ``path``: mostly the draft's top-1 or top-2."""
        return self._am(ctx, tuple(path))

    def _target_argmax(self, ctx, path) -> int:
        rng = random.Random(f"{self.seed}|target|{ctx}|{path}")
        u = rng.random()
        order = torch.argsort(self.draft_logprobs(ctx, path), descending=True).tolist()
        if u < 0.65:
            return order[0]
        if u < 0.8:
            return order[1]
        return rng.randrange(self.vocab)

    def first_root(self, req: int) -> int:
        return random.Random(f"{self.seed}|root|{req}").randrange(self.vocab)


@dataclass
class Round:
    """What one round produced for one request (fast or reference)."""

    depth: int
    width: int
    nodes: dict  # path -> (rank, logp, conf or None, depth)
    order: list  # paths in node order (root excluded)
    tau: int
    emitted: list
    d_max_next: int
    alpha_next: float
    raw: dict | None = None  # fast only: per-request tree rows


def _pool_paths(pool, b, indices):
    """Token paths (root excluded) of pool nodes ``indices`` of request ``b``."""
    toks = pool.tokens[b].tolist()
    pars = pool.parents[b].tolist()
    out = []
    for j in indices:
        path = []
        while j > 0:
            path.append(toks[j])
            j = pars[j]
        out.append(tuple(reversed(path)))
    return out


def tree_paths(tokens, parents, n):
    paths = [()]
    for i in range(1, n):
        paths.append(paths[parents[i]] + (tokens[i],))
    return paths


def run_fast(cfg: AlgorithmConfig, world: World, reqs, rounds: int, starts=None) -> dict:
    """Drive the batched policy like a runtime; requests join at ``starts`` (global rounds)."""
    pol = build_policy(cfg)
    starts = starts or [0] * len(reqs)
    states = {r: pol.init_state(1, "cpu") for r in reqs}
    roots = {r: world.first_root(r) for r in reqs}
    done = {r: 0 for r in reqs}
    out = {r: [] for r in reqs}
    for g in range(max(starts) + rounds):
        active = [r for r, s in zip(reqs, starts, strict=True) if s <= g < s + rounds]
        if not active:
            continue
        bsz = len(active)
        st_ = PolicyState.cat([states[r] for r in active])
        ctxs = [(r, done[r], roots[r]) for r in active]
        root_lp = torch.stack([world.draft_logprobs(c, ()) for c in ctxs])
        plan = pol.plan(st_, root_lp)
        pool, fr = new_pool(torch.tensor([roots[r] for r in active]), pol.pool_capacity, pol.k)
        lp = root_lp[:, None]
        for level in range(1, pol.max_depth + 1):
            fr = pol.step(plan, pool, fr, lp, level)
            if level == pol.max_depth or not bool(fr.valid.any()):
                break
            idx = fr.idx.tolist()
            lp = torch.zeros(bsz, len(idx[0]), world.vocab)
            for b in range(bsz):
                live = [j for j in idx[b] if j >= 0]
                for f, path in enumerate(_pool_paths(pool, b, live)):
                    lp[b, f] = world.draft_logprobs(ctxs[b], path)
                assert idx[b][: len(live)] == live, "frontier padding must trail"
        tree = pol.finalize(plan, pool)
        width = tree.width
        source = getattr(tree, "source", None)
        if source is not None:  # each node's pool slot holds the same token
            valid = tree.valid()
            assert torch.equal(pool.tokens.gather(1, source.clamp(min=0))[valid], tree.tokens[valid])
            assert bool((source[~valid] == -1).all())
        tl = torch.zeros(bsz, width, world.vocab)
        tok_l, par_l, dep_l = tree.tokens.tolist(), tree.parents.tolist(), tree.depths.tolist()
        nn = tree.num_nodes.tolist()
        for b in range(bsz):
            for i, path in enumerate(tree_paths(tok_l[b], par_l[b], nn[b])):
                tl[b, i, world.target_argmax(ctxs[b], path)] = 5.0
        res = greedy_verify(tree, tl)
        new = pol.observe(st_, plan, tree, res.accepted_nodes, res.num_accepted)
        conf_l, rank_l, logp_l = tree.node_conf.tolist(), tree.ranks.tolist(), tree.draft_logp.tolist()
        for b, r in enumerate(active):
            paths = tree_paths(tok_l[b], par_l[b], nn[b])
            nodes = {}
            for i in range(1, nn[b]):
                conf = conf_l[b][i]
                nodes[paths[i]] = (rank_l[b][i], logp_l[b][i], None if math.isnan(conf) else conf, dep_l[b][i])
            tau = int(res.num_accepted[b])
            fields = ("tokens", "parents", "depths", "draft_logp", "ranks", "node_conf")
            raw = {f: getattr(tree, f)[b].clone() for f in fields}
            raw.update(
                num_nodes=nn[b],
                root_conf=conf_l[b][0],
                first_round=bool(plan.first_round[b]),
                plan_depth=int(plan.depth[b]),
                root=roots[r],
                max_depth=tree.max_depth,
            )
            out[r].append(
                Round(
                    depth=int(plan.depth[b]),
                    width=int(plan.width[b]),
                    nodes=nodes,
                    order=paths[1:],
                    tau=tau,
                    emitted=res.emitted[b, : tau + 1].tolist(),
                    d_max_next=int(new.history.d_max[b]),
                    alpha_next=float(new.alpha[b]),
                    raw=raw,
                )
            )
            states[r] = new.index(torch.tensor([b]))
            roots[r] = int(res.bonus[b])
            done[r] += 1
    return out


def run_ref(cfg: AlgorithmConfig, world: World, req: int, rounds: int):
    """The naive per-request loop; returns ``(rounds, ambiguous_from)``."""
    state = init_state_ref(cfg)
    root = world.first_root(req)
    out = []
    for rnd in range(rounds):
        ctx = (req, rnd, root)
        tree = build_tree_ref(
            cfg,
            root,
            world.draft_probs(ctx, ()),
            lambda p, c=ctx: world.draft_probs(c, p),
            state.alpha,
            state.history.d_max,
            state.first_round,
        )
        if tree.ambiguous():
            return out, tree.margin_where
        am = [world.target_argmax(ctx, n.path) for n in tree.nodes]
        path, tau, bonus, emitted = greedy_verify_ref(tree.tokens, tree.parents, am)
        state = observe_ref(cfg, state, tree, path, tau)
        nodes = {n.path: (n.rank, math.log(n.prob), n.conf, n.depth) for n in tree.nodes[1:]}
        out.append(
            Round(
                tree.depth,
                tree.width,
                nodes,
                [n.path for n in tree.nodes[1:]],
                tau,
                emitted,
                state.history.d_max,
                state.alpha,
            )
        )
        root = bonus
    return out, None


def policy_budget(cfg: AlgorithmConfig, first_round: bool) -> int:
    if cfg.policy == "sage":
        static = first_round and cfg.first_round_static
        pooled = pool_of(cfg) != "kept"  # every child pooled: only the rerank bounds the tree
        built = len(cfg.static_tree) if static else 1024 if pooled else cfg.n_max
        total = cfg.rerank_nodes or (cfg.n_max if pool_of(cfg) != "kept" else 0)
        return min(built, total) if total else built
    return policy_class(cfg.policy).max_nodes_for(cfg)


def check_invariants(cfg: AlgorithmConfig, rnd: Round):
    """Budget, ancestor closure, level order, depth bounds, padding, distinct siblings."""
    raw = rnd.raw
    n = raw["num_nodes"]
    tok, par, dep = raw["tokens"].tolist(), raw["parents"].tolist(), raw["depths"].tolist()
    assert 1 <= n <= policy_budget(cfg, raw["first_round"]) + 1
    assert par[0] == -1 and dep[0] == 0 and tok[0] == raw["root"]
    assert raw["plan_depth"] <= raw["max_depth"] == cfg.max_tree_depth
    for i in range(1, n):
        assert 0 <= par[i] < i, "parents precede children"
        assert dep[i] == dep[par[i]] + 1
        assert dep[i] >= dep[i - 1], "level order"
        assert dep[i] <= raw["plan_depth"], "depth within the round's plan"
    # padding
    assert all(t == -1 for t in tok[n:]) and all(p == -1 for p in par[n:]) and all(d == -1 for d in dep[n:])
    # siblings carry distinct tokens
    seen = set()
    for i in range(1, n):
        assert (par[i], tok[i]) not in seen
        seen.add((par[i], tok[i]))


def compare(fast: list, ref: list, tag=""):
    for t, (f, r) in enumerate(zip(fast, ref, strict=False)):
        where = f"{tag} round {t}"
        assert (f.depth, f.width) == (r.depth, r.width), where
        assert set(f.nodes) == set(r.nodes), where
        for path, (rank, logp, conf, depth) in r.nodes.items():
            f_rank, f_logp, f_conf, f_depth = f.nodes[path]
            assert (f_rank, f_depth) == (rank, depth), (where, path)
            assert f_logp == pytest.approx(logp, abs=1e-5), (where, path)
            assert (f_conf is None) == (conf is None), (where, path, f_conf, conf)
            if conf is not None:
                assert f_conf == pytest.approx(conf, abs=2e-5), (where, path)
        assert f.tau == r.tau and f.emitted == r.emitted, where
        assert f.d_max_next == r.d_max_next, where
        assert f.alpha_next == pytest.approx(r.alpha_next, abs=2e-5), where


def check_policy(
    cfg: AlgorithmConfig, seed: int, rounds: int = 4, nreq: int = 3, single: bool = True, sparse: float = 0.0
):
    world = World(seed, sparse=sparse)
    reqs = list(range(nreq))
    fast = run_fast(cfg, world, reqs, rounds, starts=list(range(nreq)))
    compared = 0
    for r in reqs:
        for rnd in fast[r]:
            check_invariants(cfg, rnd)
        ref, ambiguous = run_ref(cfg, world, r, rounds)
        compare(fast[r][: len(ref)], ref, f"req {r}")
        compared += len(ref)
    if single:  # a batch gives the same trees as single-request runs
        for r in reqs:
            alone = run_fast(cfg, world, [r], rounds)[r]
            for t, (a, b) in enumerate(zip(alone, fast[r], strict=True)):
                for f in ("tokens", "parents", "depths", "ranks"):
                    assert torch.equal(a.raw[f], b.raw[f]), (r, t, f)
                assert torch.allclose(a.raw["draft_logp"], b.raw["draft_logp"], atol=1e-6)
                assert torch.allclose(a.raw["node_conf"], b.raw["node_conf"], atol=1e-6, equal_nan=True)
                assert (a.tau, a.emitted, a.d_max_next) == (b.tau, b.emitted, b.d_max_next)
                assert a.alpha_next == pytest.approx(b.alpha_next, abs=1e-6)
    return fast, compared


# ---------------------------------------------------------------------------------------------
# SAGE with the open-point switches
# ---------------------------------------------------------------------------------------------

SAGE_BASE = dict(policy="sage", d_min=2, d_max=5, d_cap=7, history_window=2, history_lo=1.0, history_hi=2.0)

SAGE_VARIANTS = {
    "default": {},
    "threshold_conditional": dict(threshold_on="conditional"),
    "rounding_ceil": dict(rounding="ceil"),
    "rounding_floor": dict(rounding="floor"),
    "prob_space_topk": dict(prob_space="topk"),
    "parent_prob_joint": dict(parent_prob="joint"),
    "budget_parent_order": dict(budget_order="parent_order", threshold_on="conditional"),
    "no_keep_top1": dict(keep_top1=False),
    "alpha_fresh": dict(alpha_source="fresh"),
    "alpha_path_mean": dict(alpha_source="path_mean"),
    "no_history": dict(use_history=False),
    "no_static_first": dict(first_round_static=False),
    "no_clamp_topk_joint": dict(clamp_level_width=False, prob_space="topk", parent_prob="joint"),
    "no_entropy_bonus_tau": dict(use_entropy=False, history_tau="drafts_plus_bonus", history_cooldown="none"),
    # calibrated path values: a table that reorders nodes (flat rows, a low-alpha row that trusts nothing)
    "rerank": dict(rerank_nodes=5),
    "rerank_calibrated": dict(rerank_nodes=3, calibration=((0.1, 0.5, 0.9),)),
    # every child pooled: SAGE's rule (n_max counting drafted nodes) or the W-best beam grows, pruned to the N best
    "rerank_children": dict(rerank_nodes=6, rerank_pool="children"),
    "rerank_children_parent_order": dict(rerank_nodes=9, rerank_pool="children", budget_order="parent_order"),
    "rerank_beam": dict(rerank_nodes=7, rerank_pool="beam"),
    "beam_n_max": dict(rerank_pool="beam"),
    "beam_shallow": dict(rerank_pool="beam", beam_depth=3, first_round_static=False),  # shallower than d_cap
    "rerank_beam_calibrated": dict(rerank_nodes=4, rerank_pool="beam", calibration=((0.2, 0.6, 0.9),)),
    "calibrated": dict(calibration=((0.05, 0.3, 0.3, 0.6, 0.9), (0.2, 0.2, 0.5, 0.8, 1.0))),
    "calibrated_joint": dict(calibration=((0.1, 0.4, 0.7, 0.7, 0.95),), threshold_on="joint", parent_prob="joint"),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(SAGE_VARIANTS))
@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    k=st.sampled_from([4, 6, 10]),
    n_max=st.integers(3, 40),
    theta0=st.sampled_from([0.0, 0.02, 0.1, 0.3]),
)
def test_sage_matches_reference(variant, seed, k, n_max, theta0):
    cfg = AlgorithmConfig(
        **SAGE_BASE, **SAGE_VARIANTS[variant], k=k, w_min=min(2, k), w_max=k, n_max=n_max, theta0=theta0
    )
    check_policy(cfg, seed, single=variant in ("default", "budget_parent_order", "calibrated", "rerank", "rerank_beam"))


def test_sage_d_max_moves_and_first_round_is_static():
    cfg = AlgorithmConfig(**SAGE_BASE, theta0=0.0, n_max=30)
    fast, compared = check_policy(cfg, seed=7, rounds=8, nreq=2, single=False)
    assert compared >= 8
    for r in fast:
        first = fast[r][0]
        assert first.raw["first_round"] and first.depth == 5
        assert sorted(choices_from_tree(first.raw["parents"].tolist(), first.raw["ranks"].tolist())[:25]) == sorted(
            list(p) for p in MC_SIM_7B_63
        )
        assert not any(rd.raw["first_round"] for rd in fast[r][1:])
    assert len({rd.d_max_next for r in fast for rd in fast[r]}) > 1, "the controller never moved D_max"


# ---------------------------------------------------------------------------------------------
# Baselines
# ---------------------------------------------------------------------------------------------


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.sampled_from([3, 4, 6]), depth=st.integers(1, 5), total=st.integers(1, 40))
def test_eagle2_matches_reference(seed, k, depth, total):
    cfg = AlgorithmConfig(
        policy="eagle2",
        k=k,
        w_min=2,
        w_max=k,
        eagle_depth=depth,
        eagle_total_tokens=total,
        static_tree=((0,), (1,), (0, 0)),
    )
    check_policy(cfg, seed, rounds=2)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.sampled_from([3, 4, 6]), n=st.integers(1, 12),
       threshold=st.sampled_from([0.0, 0.05, 0.3, 2.0]), depth=st.integers(1, 6))  # fmt: skip
def test_topn_matches_reference(seed, k, n, threshold, depth):
    cfg = AlgorithmConfig(policy="topn", k=k, w_min=2, w_max=k, topn_nodes=n, topn_threshold=threshold,
                     topn_max_depth=depth, static_tree=((0,), (1,), (0, 0)))  # fmt: skip
    fast, _ = check_policy(cfg, seed, rounds=2)
    for r in fast:
        for rd in fast[r]:
            assert rd.raw["num_nodes"] <= n + 1


def test_the_oracle_covers_every_registered_policy():
    from tests.oracles import SELECTORS

    assert set(SELECTORS) == set(POLICIES)


def test_eagle2_paper_defaults():
    cfg = AlgorithmConfig(policy="eagle2")  # depth 7, top-k 10, 60 nodes
    fast, compared = check_policy(cfg, seed=4, rounds=2, nreq=2, single=False)
    assert compared >= 3
    assert all(rd.raw["num_nodes"] == 61 for r in fast for rd in fast[r])


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), depth=st.integers(1, 7))
def test_chain_matches_reference(seed, depth):
    cfg = AlgorithmConfig(policy="chain", chain_depth=depth)
    fast, _ = check_policy(cfg, seed, rounds=3)
    for r in fast:
        for rd in fast[r]:
            assert rd.raw["num_nodes"] == depth + 1
            assert rd.raw["ranks"][1 : depth + 1].tolist() == [0] * depth


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_static_matches_reference_and_is_mc_sim_7b_63(seed):
    cfg = AlgorithmConfig(policy="static")
    fast, _ = check_policy(cfg, seed, rounds=2)
    for r in fast:
        for rd in fast[r]:
            dep = rd.raw["depths"].tolist()
            assert [dep.count(d) for d in range(1, 6)] == [4, 8, 8, 3, 2]
            assert choices_from_tree(rd.raw["parents"].tolist(), rd.raw["ranks"].tolist()) == sorted(
                [list(p) for p in MC_SIM_7B_63], key=lambda p: (len(p), p)
            )


def test_static_custom_tree():
    choices = ((0,), (2,), (0, 1), (2, 0), (0, 1, 3))
    cfg = AlgorithmConfig(policy="static", k=4, w_max=4, static_tree=choices)
    fast, _ = check_policy(cfg, seed=11, rounds=2)
    for r in fast:
        for rd in fast[r]:
            assert choices_from_tree(rd.raw["parents"].tolist(), rd.raw["ranks"].tolist()) == sorted(
                [list(p) for p in choices], key=lambda p: (len(p), p)
            )


@pytest.mark.parametrize("policy", ["sage", "eagle2", "static", "chain"])
@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_max=st.integers(3, 30))
def test_zero_probability_candidates(policy, seed, n_max):
    """Draft distributions with fewer than k tokens of positive probability: impossible tokens are
    never candidates (the static topology then loses the missing rank paths)."""
    cfg = AlgorithmConfig(
        policy=policy,
        k=6,
        w_max=6,
        n_max=n_max,
        theta0=0.0,
        d_min=2,
        d_max=4,
        d_cap=5,
        history_window=2,
        history_lo=1.0,
        history_hi=2.0,
        eagle_depth=4,
        eagle_total_tokens=n_max,
        chain_depth=5,
        static_tree=((0,), (1,), (2,), (0, 0), (0, 5), (1, 0), (0, 0, 0), (0, 0, 3)),
    )
    fast, _ = check_policy(cfg, seed, rounds=3, single=policy == "sage", sparse=0.4)
    for r in fast:
        for rd in fast[r]:
            n = rd.raw["num_nodes"]
            assert bool(torch.isfinite(rd.raw["draft_logp"][:n]).all())


# ---------------------------------------------------------------------------------------------
# The worked example of the policies module docstring
# ---------------------------------------------------------------------------------------------


def _example_world():
    # tokens: a b c d e f g h + fillers; k = 4, W = 2, D = 2, theta0 = 0.1
    names = "abcdefghijkl"
    t = {c: i for i, c in enumerate(names)}
    dists = {
        (): {"a": 0.60, "b": 0.30, "c": 0.06, "d": 0.04},
        ("a",): {"e": 0.90, "f": 0.05, "i": 0.03, "j": 0.02},
        ("b",): {"g": 0.50, "h": 0.40, "k": 0.06, "l": 0.04},
    }

    def probs(path):
        d = dists.get(tuple(names[x] for x in path), {"i": 0.4, "j": 0.3, "k": 0.2, "l": 0.1})
        p = [1e-9] * len(names)
        for c, v in d.items():
            p[t[c]] = v
        s = sum(p)
        return [x / s for x in p]

    return names, t, probs


def test_policies_docstring_worked_example():
    names, t, probs = _example_world()
    cfg = AlgorithmConfig(
        policy="sage", k=4, d_min=2, d_max=2, w_min=2, w_max=2, theta0=0.1, use_history=False, first_round_static=False,
        rerank_pool="kept",  # the example is the paper's levels (Eq. 10-12), not the beam pool
    )  # fmt: skip
    expected = {("a",), ("b",), ("a", "e"), ("b", "g")}
    # reference
    ref = build_tree_ref(cfg, 0, probs(()), probs, 0.5, 2, True)
    assert not ref.ambiguous()
    assert (ref.depth, ref.width) == (2, 2)
    assert {tuple(names[x] for x in p) for p in ref.paths} == expected
    # fast path
    pol = build_policy(cfg)
    st_ = pol.init_state(1, "cpu")
    root_lp = torch.log(torch.tensor([probs(())]))
    plan = pol.plan(st_, root_lp)
    assert (int(plan.depth[0]), int(plan.width[0])) == (2, 2)
    pool, fr = new_pool(torch.tensor([11]), pol.pool_capacity, pol.k)
    lp = root_lp[:, None]
    for level in range(1, pol.max_depth + 1):
        fr = pol.step(plan, pool, fr, lp, level)
        if level == pol.max_depth or not bool(fr.valid.any()):
            break
        paths = _pool_paths(pool, 0, [j for j in fr.idx[0].tolist() if j >= 0])
        lp = torch.full((1, fr.idx.shape[1], len(names)), -30.0)
        for f, path in enumerate(paths):
            lp[0, f] = torch.log(torch.tensor(probs(path)))
    tree = pol.finalize(plan, pool)
    n = int(tree.num_nodes[0])
    assert n == 5
    got = tree_paths(tree.tokens[0].tolist(), tree.parents[0].tolist(), n)[1:]
    assert {tuple(names[x] for x in p) for p in got} == expected
    assert [names[x] for x in tree.tokens[0, 1:n].tolist()] == ["a", "b", "e", "g"]  # best-first, level order


# ---------------------------------------------------------------------------------------------
# Deep when confident: a perfect draft (the target's greedy token is always the draft's top-1)
# ---------------------------------------------------------------------------------------------


class PerfectWorld(World):
    """Every draft distribution puts ``top1`` on one token (picked per path) and spreads the rest evenly; the target's
    greedy token is always that top-1, so every node on the top-1 path is accepted."""

    def __init__(self, seed: int, top1: float) -> None:
        super().__init__(seed)
        self.top1 = top1

    def _draft_logprobs(self, ctx, path) -> torch.Tensor:
        best = random.Random(f"{self.seed}|best|{ctx}|{path}").randrange(self.vocab)
        p = torch.full((self.vocab,), (1.0 - self.top1) / (self.vocab - 1), dtype=torch.float64)
        p[best] = self.top1
        return p.log().float()

    def _target_argmax(self, ctx, path) -> int:
        return int(self.draft_logprobs(ctx, path).argmax())


@pytest.mark.parametrize("top1", [0.5, 0.6, 0.7])
def test_sage_levels_go_deep_with_a_perfect_draft(top1):
    """SAGE's levels (Eq. 10-12 with the default options, the tree they keep) build the top-1 path to the planned
    depth D every round, so a perfect draft's rounds accept D tokens (deep when confident, Eq. 10).  The joint reading
    of theta_l (open point 4) stops that path where its probability top1^l falls under theta0 * l / D, short of D: why
    the default compares theta_l with the node's own probability (see sage_plugin.config)."""
    world = PerfectWorld(3, top1)
    default = AlgorithmConfig(
        rerank_pool="kept"
    )  # the levels' own tree (no cost passed here: every built node verified)
    assert default.threshold_on == "conditional"
    rounds = {}
    for reading in ("conditional", "joint"):
        cfg = default.replace(threshold_on=reading)
        rounds[reading] = [rd for r, rds in run_fast(cfg, world, [0, 1], rounds=12).items() for rd in rds[1:]]
    for rd in rounds["conditional"]:
        assert rd.tau == rd.depth >= default.d_min, "the whole planned depth is built and accepted"
    assert max(rd.depth for rd in rounds["conditional"]) > 5, "deeper than the static tree's 5 levels"
    short = [rd for rd in rounds["joint"] if rd.tau < rd.depth]
    assert short, "the joint reading cuts the perfect top-1 path short of D"
    mean = {k: sum(rd.tau for rd in v) / len(v) for k, v in rounds.items()}
    assert mean["conditional"] > mean["joint"]


@pytest.mark.parametrize("policy", ["sage", "eagle2", "topn", "chain", "static"])
def test_a_restricted_vocabulary_builds_the_full_rows_tree(policy):
    """A draft that scores only some ids (``vocab``) gives each policy its log-softmax over those ids: the pool it
    builds equals the one from the full-vocabulary row with ``-inf`` at every other id (the engine's restricted head,
    ``TextModel.forward_head``)."""
    gen = torch.Generator().manual_seed(7)
    vocab_size, bsz = 300, 2
    vocab = torch.sort(torch.randperm(vocab_size, generator=gen)[:40]).values
    cfg = AlgorithmConfig(policy=policy, first_round_static=False)
    pools = []
    for restricted in (False, True):
        pol = build_policy(cfg)
        g = torch.Generator().manual_seed(3)
        st_ = pol.init_state(bsz, "cpu")

        def rows(width, g=g, restricted=restricted):
            small = torch.log_softmax(torch.randn(bsz, width, len(vocab), generator=g) * 2.0, -1)
            if restricted:
                return small
            return torch.full((bsz, width, vocab_size), float("-inf")).index_copy_(2, vocab, small)

        root = rows(1)
        plan = pol.plan(st_, root[:, 0])
        pool, fr = new_pool(torch.tensor([5, 9]), pol.pool_capacity, pol.k)
        lp = root
        for level in range(1, min(pol.max_depth, 4) + 1):
            fr = pol.step(plan, pool, fr, lp, level, vocab=vocab if restricted else None)
            lp = rows(fr.idx.shape[1])
        pools.append(pool)
    full, small = pools
    assert torch.equal(full.tokens, small.tokens) and torch.equal(full.parents, small.parents)
    assert bool(torch.isin(small.tokens[:, 1:][small.tokens[:, 1:] >= 0], vocab).all())
    torch.testing.assert_close(full.joint, small.joint)


def test_propose_fills_only_what_its_caller_reads():
    """``propose(parents=False, topk_rows=False)`` (every policy but SAGE's level rule and planned replay): the same
    candidates without the parents' probabilities, and no top-k rows recorded in the pool."""
    from sage_plugin.core.level_expansion import propose

    gen = torch.Generator().manual_seed(0)
    pools = [new_pool(torch.tensor([3, 5]), 40, 4) for _ in range(2)]
    lp = torch.log_softmax(torch.randn(2, 1, 30, generator=gen) * 3, -1)
    full, lean = (propose(p, f, lp, 4, 1, parents=x, topk_rows=x) for (p, f), x in zip(pools, (True, False)))
    for name in ("parent", "valid", "tokens", "logp", "logp_topk", "joint", "joint_topk", "ranks", "codes"):
        assert torch.equal(getattr(full, name), getattr(lean, name)), name
    for name in ("parent_logp", "parent_logp_topk", "parent_joint", "parent_joint_topk"):
        assert getattr(full, name) is not None and getattr(lean, name) is None, name
    assert torch.equal(pools[0][0].conf.nan_to_num(-1.0), pools[1][0].conf.nan_to_num(-1.0))
    assert bool(torch.isfinite(pools[0][0].topk_logp[:, 0]).all()) and bool(torch.isinf(pools[1][0].topk_logp).all())
