"""Reference engine: losslessness against plain decoding, batching, stops, sampling.

Tiny random Llamas cover the policy x batch x stop matrix quickly; the draft is a noisy copy of
the target so acceptance is partial (some rounds accept deep paths, some reject at the root).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sage_plugin.config import AlgorithmConfig, SageConfig
from sage_plugin.core.policies import build_policy
from sage_plugin.engines.lm import GenRequest, TextModel
from sage_plugin.engines.speculative import SamplingParams, SpecEngine

POLICIES = ("sage", "eagle2", "static", "chain")
VOCAB = 128


def _tiny(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def engine() -> SpecEngine:
    target = _tiny(0)
    # Sharpen the output so greedy text is not a flat random walk, then perturb a copy as draft.
    with torch.no_grad():
        target.lm_head.weight.mul_(6.0)
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05 * p.abs().mean())
    return SpecEngine(TextModel(target), TextModel(draft))


def _requests(n: int) -> list[GenRequest]:
    gen = torch.Generator().manual_seed(7)
    return [
        GenRequest(torch.randint(0, VOCAB, (int(5 + 3 * i),), generator=gen).tolist(), request_id=str(i))
        for i in range(n)
    ]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_equals_plain_decoding(engine, policy, batch):
    reqs = _requests(3)
    sp = SamplingParams(max_new_tokens=40)
    ref = {o.request_id: o.tokens for o in engine.generate(reqs, sp, None)}
    got = []
    # the paper's fixed budgets: with node_budget="auto" SAGE's trees follow this machine's timings (tested below)
    cfg = AlgorithmConfig(policy=policy, node_budget="fixed")
    for i in range(0, len(reqs), batch):
        got += engine.generate(reqs[i : i + batch], sp, build_policy(cfg))
    for out in got:
        assert out.tokens == ref[out.request_id]
        assert len(out.tokens) == 40 and out.finish_reason == "length"
    taus = [r.tau for o in got for r in o.rounds]
    assert max(taus) >= 2, "the noisy-copy draft should get multi-token accepts"
    # decode tokens = 1 (prefill) + sum over rounds of (tau + 1), truncated at max_new_tokens
    for o in got:
        assert 1 + sum(r.tau + 1 for r in o.rounds) >= len(o.tokens)


@pytest.mark.parametrize("policy", ("sage", "eagle2"))
def test_stop_token_inside_accepted_block(engine, policy):
    reqs = _requests(3)
    free = engine.generate(reqs, SamplingParams(max_new_tokens=30), None)
    # the stop token: the token whose first occurrence in request 0's plain output is latest
    toks = free[0].tokens
    first = {t: toks.index(t) for t in set(toks)}
    stop = max(first, key=first.get)
    assert first[stop] >= 3, f"degenerate tiny-model output {toks}"

    sp = SamplingParams(max_new_tokens=30, stop_token_ids=(stop,))
    ref = engine.generate(reqs, sp, None)
    got = engine.generate(reqs, sp, build_policy(AlgorithmConfig(policy=policy)))
    assert [o.tokens for o in got] == [o.tokens for o in ref]
    assert got[0].finish_reason == "stop" and got[0].tokens[-1] == stop
    assert stop not in got[0].tokens[:-1]


def test_ragged_max_new_tokens_and_batch_drop(engine):
    """Requests finishing at different rounds leave the batch without disturbing the others."""
    reqs = _requests(4)
    for n in (1, 2, 17):
        sp = SamplingParams(max_new_tokens=n)
        ref = engine.generate(reqs, sp, None)
        got = engine.generate(reqs, sp, build_policy(AlgorithmConfig()))
        assert [o.tokens for o in got] == [o.tokens for o in ref]
        assert all(len(o.tokens) == n for o in got)


def test_sampling_is_seeded_and_runs_every_policy(engine):
    reqs = _requests(2)
    sp = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=20, seed=3)
    for policy in POLICIES:
        a = engine.generate(reqs, sp, build_policy(AlgorithmConfig(policy=policy)))
        b = engine.generate(reqs, sp, build_policy(AlgorithmConfig(policy=policy)))
        assert [o.tokens for o in a] == [o.tokens for o in b]
        assert all(len(o.tokens) == 20 for o in a)
        assert all(0 <= t < VOCAB for o in a for t in o.tokens)


def test_plain_decoding_matches_hf_generate(engine):
    model = engine.target.model
    for req in _requests(3):
        ours = engine.generate([req], SamplingParams(max_new_tokens=25), None)[0].tokens
        ids = torch.tensor([req.prompt_ids])
        hf = model.generate(ids, max_new_tokens=25, do_sample=False, eos_token_id=None, pad_token_id=0)[
            0, ids.shape[1] :
        ]
        assert ours == hf.tolist()


def test_sage_adapts_shape_and_history(engine):
    reqs = _requests(2)
    cfg = AlgorithmConfig(history_window=3, node_budget="fixed", rerank_pool="kept")  # the paper's shapes, no cost cut
    out = engine.generate(reqs, SamplingParams(max_new_tokens=60), build_policy(cfg))
    rounds = out[0].rounds
    assert rounds[0].nodes == 25, "round 1 uses the static mc_sim_7b_63 tree"
    later = rounds[1:]
    assert len({(r.plan_depth, r.plan_width) for r in later}) > 1, "depth/width should follow alpha"
    assert all(r.nodes <= 64 for r in rounds)
    for r in later:
        # Eq. 10/11 with D_max in [D_min, D_cap]
        assert 3 <= r.plan_depth <= 10 and 2 <= r.plan_width <= 10
    # the beam pool (the default) keeps Eq. 11's width and grows to beam_depth, past d_cap; the rerank cuts the depth
    beam = AlgorithmConfig(history_window=3, node_budget="fixed")
    rounds = engine.generate(reqs, SamplingParams(max_new_tokens=24), build_policy(beam))[0].rounds
    assert rounds[0].nodes == 25 and all(r.nodes <= 64 for r in rounds)
    assert all(r.plan_depth == beam.beam_depth == 16 and 2 <= r.plan_width <= 10 for r in rounds[1:])
    assert len({r.plan_width for r in rounds[1:]}) > 1, "width should follow alpha"


def test_round_cost_is_measured_once_per_batch_size(engine):
    fresh = SpecEngine(engine.target, engine.draft)
    pol = build_policy(AlgorithmConfig())
    sp = SamplingParams(max_new_tokens=8)
    fresh.generate(_requests(2), sp, pol)
    assert fresh.last_profile_s > 0
    ((key, cost),) = fresh.round_costs.items()
    # the curve covers the verified tree (the beam's pool holds more candidates than it verifies)
    assert key == fresh.cost_key(pol, 2) == (2, pol.tree_capacity - 1, pol.frontier_capacity, True, 0)
    assert pol.tree_capacity < pol.pool_capacity
    v = cost.verify_ms
    assert v.shape == (pol.tree_capacity,) and bool(torch.isfinite(v[:2]).all()) and bool((v[1:] >= v[:-1]).all())
    assert cost.draft_ms > 0
    fresh.generate(_requests(2), sp, pol)
    assert fresh.last_profile_s == 0.0 and len(fresh.round_costs) == 1
    fresh.generate(_requests(2), sp, build_policy(AlgorithmConfig(node_budget="fixed")))
    assert fresh.last_profile_s == 0.0 and len(fresh.round_costs) == 1, "fixed budget: nothing to measure"


def test_in_loop_cost_refresh_times_the_rounds_and_stays_lossless(engine):
    """``cost_refresh`` 1: every round's verify and draft forwards are timed into the kept samples and the entry
    re-priced after every round; outputs stay those of plain decoding.  ``cost_refresh`` 0 keeps no samples."""
    reqs = _requests(3)
    sp = SamplingParams(max_new_tokens=30)
    ref = {o.request_id: o.tokens for o in engine.generate(reqs, sp, None)}
    fresh = SpecEngine(engine.target, engine.draft)
    pol = build_policy(AlgorithmConfig(cost_refresh=1))
    out = fresh.generate(reqs, sp, pol)
    assert {o.request_id: o.tokens for o in out} == ref
    ((key, samples),) = fresh.cost_samples.items()
    assert samples.rounds == max(len(o.rounds) for o in out) and samples.used <= set(range(pol.tree_capacity))
    assert samples.used, "verify forwards were timed in the loop"
    timed_before = sum(len(d) for d in samples.verify.values())
    out = fresh.generate(reqs, sp, pol)
    assert fresh.last_profile_s == 0.0 and {o.request_id: o.tokens for o in out} == ref
    assert samples.rounds > max(len(o.rounds) for o in out), "the same samples keep counting"
    assert sum(len(d) for d in samples.verify.values()) >= timed_before
    assert fresh.round_costs[key].verify_ms.tolist() == samples.cost().verify_ms.tolist(), "re-priced last round"
    fresh.generate(reqs, sp, build_policy(AlgorithmConfig()))
    assert len(fresh.round_costs) == 2 and len(fresh.cost_samples) == 1, "refresh 0 measures its own, kept curve"


@pytest.mark.parametrize("batch", [1, 3])
def test_sage_cost_cut_stays_lossless_and_sizes_trees_to_the_cost(engine, batch):
    """Pinned round costs: flat (draft forwards free too) keeps SAGE's trees, a mild per-token cost cuts them, a
    steep one leaves the root; a flat verify with a draft forward that costs 10% of a round keeps the static tree
    without ``lookahead`` and drafts fewer levels with it (the forward is priced), all lossless.

    (The random tiny draft is under-confident, path probabilities ~0.01-0.1, hence the small mild cost.)
    """
    from sage_plugin.core.cost import RoundCost

    reqs = _requests(3)
    sp = SamplingParams(max_new_tokens=30)
    ref = {o.request_id: o.tokens for o in engine.generate(reqs, sp, None)}
    n = build_policy(AlgorithmConfig()).pool_capacity - 1
    nodes, forwards = {}, {}
    for case, per_token_ms, draft_ms, lookahead in (
        ("flat", 0.0, 0.0, True), ("mild", 0.05, 1.0, True), ("steep", 200.0, 1.0, True),
        ("forward", 0.0, 1.0, True), ("forward-myopic", 0.0, 1.0, False),
    ):  # fmt: skip
        pol = build_policy(AlgorithmConfig(lookahead=lookahead, price_level_host=False))  # the pinned costs alone
        fresh = SpecEngine(engine.target, engine.draft)
        for b in range(1, batch + 1):
            cost = RoundCost(10.0 + per_token_ms * torch.arange(n + 1, dtype=torch.float32), draft_ms)
            fresh.round_costs[fresh.cost_key(pol, b)] = cost
        got = []
        for i in range(0, len(reqs), batch):
            got += fresh.generate(reqs[i : i + batch], sp, pol)
            assert fresh.last_profile_s == 0.0, "pinned costs are not re-measured"
        for out in got:
            assert out.tokens == ref[out.request_id], case
        nodes[case] = [r.nodes for o in got for r in o.rounds]
        forwards[case] = sum(r.draft_forwards for o in got for r in o.rounds) / len(nodes[case])
        if case == "steep":
            assert all(r.draft_forwards == 1 for o in got for r in o.rounds), "no level is drafted past the cut"
        if case in ("flat", "forward-myopic"):
            assert got[0].rounds[0].nodes == 25, f"{case}: round 1 keeps the whole static tree"
    assert max(nodes["steep"]) == 0, "a node costing 20 plain steps is never verified"
    assert 0 < max(nodes["mild"]) and sum(nodes["mild"]) / len(nodes["mild"]) < sum(nodes["flat"]) / len(nodes["flat"])
    assert forwards["forward"] < forwards["forward-myopic"], forwards  # the look-ahead prices the next forward


def test_level_host_time_is_measured_and_priced_with_each_forward(engine):
    """``price_level_host``: the engine times each drafted level's host work (a sample per level with a forward)
    and prices it with the forward: under a flat verify and a free draft forward, levels whose host work costs 5 ms
    (a pre-filled clock) are drafted less than free ones, the default clock keeps measuring, all lossless."""
    from sage_plugin.core.cost import RoundCost
    from sage_plugin.engines.rounds import LevelClock

    reqs = _requests(3)
    sp = SamplingParams(max_new_tokens=30)
    ref = {o.request_id: o.tokens for o in engine.generate(reqs, sp, None)}
    forwards = {}
    for case, seeded in (("free", None), ("priced", 5.0), ("measured", 0.0)):
        pol = build_policy(AlgorithmConfig(price_level_host=case != "free"))
        fresh = SpecEngine(engine.target, engine.draft)
        fresh.round_costs[fresh.cost_key(pol, 1)] = RoundCost(torch.full((pol.pool_capacity,), 10.0), 0.0)
        if seeded:
            clock = fresh.level_clocks.setdefault(pol, LevelClock())
            clock.samples.extend([seeded] * 64)
        got = [out for r in reqs for out in fresh.generate([r], sp, pol)]
        assert [o.tokens for o in got] == [ref[r.request_id] for r in reqs], case
        rounds = [r for o in got for r in o.rounds]
        forwards[case] = sum(r.draft_forwards for r in rounds) / len(rounds)
        if case == "free":
            assert pol not in fresh.level_clocks, "without price_level_host no clock is kept"
        if case == "measured":  # one sample per drafted level (forwards past the catch-up), each a host time
            samples = fresh.level_clocks[pol].samples
            assert len(samples) == min(64, sum(r.draft_forwards - 1 for r in rounds))
            assert all(0.0 < ms < 1e4 for ms in samples)
    assert forwards["priced"] < forwards["free"], forwards


def test_a_level_price_that_stops_every_level_is_re_measured(engine):
    """``LevelClock.price``: a price too high to draft at (64 levels of 50 ms, a slow spell, under a flat 10 ms
    verify and a free draft forward) is not kept for good: a probe round every 17 drafts levels again; one slow first
    sample (a process's one-off costs) prices nothing until five levels are timed, so the run drafts as usual.  Before
    either, such a clock stopped every level past the catch-up for the rest of the process.  All lossless."""
    from sage_plugin.core.cost import RoundCost
    from sage_plugin.engines.rounds import LevelClock

    reqs = _requests(3)
    sp = SamplingParams(max_new_tokens=30)
    ref = {o.request_id: o.tokens for o in engine.generate(reqs, sp, None)}
    for case, seed in (("stale", [50.0] * 64), ("first", [50.0])):
        pol = build_policy(AlgorithmConfig())
        fresh = SpecEngine(engine.target, engine.draft)
        fresh.round_costs[fresh.cost_key(pol, 1)] = RoundCost(torch.full((pol.pool_capacity,), 10.0), 0.0)
        fresh.level_clocks.setdefault(pol, LevelClock()).samples.extend(seed)
        got = [out for r in reqs for out in fresh.generate([r], sp, pol)]
        assert [o.tokens for o in got] == [ref[r.request_id] for r in reqs], case
        rounds = [r for o in got for r in o.rounds]
        drafted = sum(r.draft_forwards > 1 for r in rounds)
        if case == "stale":
            assert 0 < drafted <= len(rounds) // 17 + 1, (drafted, len(rounds))
        else:
            assert drafted > len(rounds) / 2, (drafted, len(rounds))


@pytest.mark.parametrize("batch", [1, 3])
def test_padded_forwards_stay_lossless_and_run_at_the_padded_sizes(engine, batch):
    """A pinned cost where every verify pads to 12 nodes and every draft forward to width 6: outputs equal plain
    decoding, and every verify / draft forward of a round has exactly that many columns."""
    from sage_plugin.core.cost import RoundCost

    reqs = _requests(3)
    sp = SamplingParams(max_new_tokens=30)
    ref = {o.request_id: o.tokens for o in engine.generate(reqs, sp, None)}
    pol = build_policy(AlgorithmConfig(n_max=16, w_max=6, k=6))
    n = pol.pool_capacity - 1
    verify_run = tuple([0] + [max(q, 12) for q in range(1, n + 1)])
    draft_run = tuple([0] + [max(w, 6) for w in range(1, pol.frontier_capacity + 1)])
    mild = 10.0 + 0.05 * torch.arange(n + 1, dtype=torch.float32)  # cuts trees (as in the test above)
    fresh = SpecEngine(copy.copy(engine.target), copy.copy(engine.draft))
    for b in range(1, batch + 1):
        fresh.round_costs[fresh.cost_key(pol, b)] = RoundCost(mild, 0.5, verify_run, draft_run)
    widths = {"target": [], "draft": []}
    for name in widths:
        model = getattr(fresh, name)
        model.forward = (lambda f, log: lambda st, ids, *a: log.append(ids.shape[1]) or f(st, ids, *a))(
            model.forward, widths[name]
        )
    got = []
    for i in range(0, len(reqs), batch):
        got += fresh.generate(reqs[i : i + batch], sp, pol)
    for out in got:
        assert out.tokens == ref[out.request_id]
    rounds = [r for o in got for r in o.rounds]
    assert any(0 < r.nodes < 12 for r in rounds), "some trees are smaller than the padded size"
    assert set(widths["target"]) == {13}, widths["target"]  # root + 12 nodes, whatever the tree
    # catch-ups (1-2 tokens) and tree levels alike, but the first catch-up of a call: its pending buffer holds 1
    calls = len(range(0, len(reqs), batch))
    assert set(widths["draft"]) == {1, 6} and widths["draft"].count(1) == calls, widths["draft"]


def test_static_tuned_picks_the_fastest_fixed_tree_it_timed(engine):
    """``static-tuned`` times every candidate (static cuts and chains) and returns the fastest, whose config is the
    candidate's own; the tuned tree stays lossless."""
    from sage_plugin.bench.tune import CHAIN_DEPTHS, STATIC_SIZES, tune_static, tuning_candidates

    base = SageConfig()
    sp = SamplingParams(max_new_tokens=6)
    fit = tune_static(engine, base, _requests(2), sp)
    label, cfg, tok_s = fit.label, fit.config, fit.tok_s
    cands = tuning_candidates(base)
    assert set(tok_s) == set(cands) == {f"static@{n}" for n in STATIC_SIZES} | {f"chain@{d}" for d in CHAIN_DEPTHS}
    assert all(v > 0 for v in tok_s.values())
    assert tok_s[label] == max(tok_s.values()) and cfg == cands[label]
    assert len(cands["static@4"].algorithm.static_tree) == 4 and cands["chain@3"].algorithm.chain_depth == 3
    reqs = _requests(3)
    ref = [o.tokens for o in engine.generate(reqs, SamplingParams(max_new_tokens=20), None)]
    got = [o.tokens for o in engine.generate(reqs, SamplingParams(max_new_tokens=20), build_policy(cfg.algorithm))]
    assert got == ref


class _TuningRecorder:
    """A stand-in engine for ``tune_static``: records ``(candidate label, request)`` per call and reports
    ``seconds(label, request, call number)`` as the call's decode time (10 decode tokens a call)."""

    def __init__(self, base: SageConfig, seconds) -> None:
        from sage_plugin.bench.tune import tuning_candidates

        self.labels = {repr(cfg.algorithm): label for label, cfg in tuning_candidates(base).items()}
        self.seconds, self.calls, self.last_decode_s = seconds, [], 0.0

    def generate(self, requests, params, policy):
        from types import SimpleNamespace

        label = self.labels[repr(policy.cfg)]
        self.calls.append((label, requests[0]))
        self.last_decode_s = self.seconds(label, requests[0], len(self.calls))
        return [SimpleNamespace(tokens=[0] * 11)]


def test_static_tuning_takes_turns_request_by_request():
    """The candidates are timed in turns per request, the order reversed at every request, after one warm-up each:
    a machine slowing down during the tuning charges every candidate alike (here each call is slower than the one
    before, and a fixed tree that is faster by 1% still wins)."""
    from sage_plugin.bench.tune import tune_static

    base = SageConfig()
    rec = _TuningRecorder(base, lambda label, req, n: (1.0 + 0.01 * n) * (0.99 if label == "chain@2" else 1.0))
    labels, calls = rec.labels, rec.calls
    reqs = ["r0", "r1", "r2", "r3"]
    fit = tune_static(rec, base, reqs, SamplingParams(max_new_tokens=10))
    best, tok_s = fit.label, fit.tok_s
    n = len(labels)
    order = list(labels.values())
    assert calls[:n] == [(label, "r0") for label in order]  # warm-ups
    timed = calls[n:]
    for i, req in enumerate(reqs):
        turn = timed[i * n : (i + 1) * n]
        assert [c[1] for c in turn] == [req] * n
        assert [c[0] for c in turn] == (order if i % 2 == 0 else order[::-1])
    assert best == "chain@2" and len(tok_s) == n


def test_static_tuning_screens_then_times_its_finalists_on_every_prompt():
    """Every candidate is timed on the screening prompts, the three fastest of them on the rest as well (in turns),
    and the pick is the finalist fastest over all the prompts: a candidate that was lucky on the screening prompts
    alone does not win."""
    from sage_plugin.bench.tune import tune_static, tuning_candidates

    base = SageConfig()
    # seconds per request: chain@2 leads the screen (r0, r1) but is slow later; static@6 is second and steady
    lucky = {"r0": 0.80, "r1": 0.80, "r2": 1.50, "r3": 1.50}
    steady, third = 0.90, 0.95
    rec = _TuningRecorder(
        base, lambda label, req, n: {"chain@2": lucky[req], "static@6": steady, "chain@3": third}.get(label, 1.0)
    )
    labels, calls = rec.labels, rec.calls
    reqs = ["r0", "r1", "r2", "r3"]
    fit = tune_static(rec, base, reqs, SamplingParams(max_new_tokens=10), screen=2, finalists=3)
    n = len(labels)
    assert fit.finalists == ("chain@2", "static@6", "chain@3")
    stage2 = calls[n + 2 * n :]
    assert [c[1] for c in stage2] == ["r2"] * 3 + ["r3"] * 3
    assert [c[0] for c in stage2] == ["chain@2", "static@6", "chain@3", "chain@3", "static@6", "chain@2"]
    assert fit.label == "static@6" and fit.config == tuning_candidates(base)["static@6"]
    assert fit.tok_s["static@6"] == pytest.approx(40 / (4 * steady))
    assert fit.tok_s["chain@2"] == pytest.approx(40 / 4.6) and fit.tok_s["chain@4"] == pytest.approx(20 / 2.0)


def test_calibration_is_fitted_on_teacher_forced_candidates_and_stays_lossless(engine):
    """``collect_candidates``: k candidates per generated position, at most one of them the target's token, the
    target's token counted where the draft ranked it; SAGE with the fitted table still equals plain decoding."""
    from sage_plugin.bench.calibrate import calibrate, collect_candidates

    reqs, k = _requests(3), 4
    sp = SamplingParams(max_new_tokens=12)
    plain = engine.generate(reqs, sp, None)
    alpha, prob, ok = collect_candidates(engine, reqs, sp, k)
    positions = sum(len(o.tokens) for o in plain)
    assert len(alpha) == len(prob) == len(ok) == k * positions
    groups = [slice(i, i + k) for i in range(0, len(ok), k)]
    assert all(sum(ok[g]) <= 1 and prob[g] == sorted(prob[g], reverse=True) for g in groups)
    assert all(len(set(alpha[g])) == 1 and 0.0 <= alpha[g][0] <= 1.0 for g in groups)
    # the first generated position of request 0, by hand
    n0 = len(reqs[0].prompt_ids)
    row = torch.log_softmax(engine.draft.sequence_logits(reqs[0].prompt_ids + plain[0].tokens)[n0 - 1], -1)
    top = torch.topk(row, k)
    assert prob[:k] == pytest.approx(top.values.exp().tolist(), rel=1e-5)
    assert ok[:k] == (top.indices == plain[0].tokens[0]).tolist()
    table, n = calibrate(engine, reqs, sp, k, alpha_bins=2, prob_bins=4)
    assert n == k * positions and len(table) == 2 and all(len(r) == 4 for r in table)
    cfg = AlgorithmConfig(k=k, w_max=k).replace(calibration=[list(r) for r in table])
    got = engine.generate(reqs, SamplingParams(max_new_tokens=30), build_policy(cfg))
    ref = engine.generate(reqs, SamplingParams(max_new_tokens=30), None)
    assert [o.tokens for o in got] == [o.tokens for o in ref]


def test_restricted_draft_head_matches_full_head_on_its_ids_and_stays_lossless(engine):
    """A draft model with ``head_ids`` returns the full model's logits on those ids, -inf elsewhere,
    and speculative decoding with it still equals plain decoding."""
    from sage_plugin.engines.kv import SeqState

    draft_model = engine.draft.model
    head_ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(5))[: VOCAB // 2].sort().values
    restricted = TextModel(draft_model, head_ids)
    req = _requests(1)[0]
    states = [SeqState.from_prefills([a.prefill(req)]) for a in (engine.draft, restricted)]
    new = torch.tensor([[3, 9, 27]])
    pos = states[0].next_pos[:, None] + torch.arange(3)
    causal = torch.ones(3, 3, dtype=torch.bool).tril()[None]
    full = engine.draft.forward(states[0], new, pos, states[0].attention_mask(causal, torch.ones(1, 3, dtype=bool)))
    part = restricted.forward(states[1], new, pos, states[1].attention_mask(causal, torch.ones(1, 3, dtype=bool)))
    torch.testing.assert_close(part[..., head_ids], full[..., head_ids], rtol=1e-5, atol=1e-5)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[head_ids] = False
    assert torch.isneginf(part[..., outside]).all()
    # forward_head: the same logits, only the head's columns, and their ids (what the engine's draft steps read)
    state = SeqState.from_prefills([restricted.prefill(req)])
    small, ids = restricted.forward_head(state, new, pos, state.attention_mask(causal, torch.ones(1, 3, dtype=bool)))
    assert torch.equal(ids, head_ids) and small.shape == (1, 3, len(head_ids))
    torch.testing.assert_close(small, part[..., head_ids], rtol=1e-5, atol=1e-5)
    full_mask = states[0].attention_mask(causal, torch.ones(1, 3, dtype=bool))
    _, no_ids = engine.draft.forward_head(states[0], new, pos, full_mask)  # a full head: no ids to map
    assert no_ids is None

    eng = SpecEngine(engine.target, restricted)
    assert eng.draft_head
    for got in _every_policy_equals_plain(engine, eng):
        assert sum(r.nodes for o in got for r in o.rounds) > 0


def _every_policy_equals_plain(engine: SpecEngine, eng: SpecEngine) -> list[list]:
    """Each policy's outputs on ``eng`` (at its paper budget), asserted equal to plain decoding on ``engine``."""
    reqs = _requests(3)
    sp = SamplingParams(max_new_tokens=24)
    ref = [o.tokens for o in engine.generate(reqs, sp, None)]
    runs = []
    for policy in POLICIES:
        runs.append(eng.generate(reqs, sp, build_policy(AlgorithmConfig(policy=policy, node_budget="fixed"))))
        assert [o.tokens for o in runs[-1]] == ref, policy
    return runs


def test_policy_overhead_is_measured_without_changing_the_output(engine):
    """The policy's host time is measured (part of decode time) and the output is the same as plain decoding's."""
    reqs = _requests(3)
    sp = SamplingParams(max_new_tokens=24)
    ref = engine.generate(reqs, sp, None)
    assert engine.last_policy_s == 0.0
    policy = build_policy(AlgorithmConfig(policy="sage", node_budget="fixed"))
    got = engine.generate(reqs, sp, policy)
    assert [o.tokens for o in got] == [o.tokens for o in ref]
    assert 0 < engine.last_policy_s < engine.last_decode_s
    # what the bench divides by: one target forward per request per round, so the batch ran max(...) rounds
    assert all(o.target_forwards == len(o.rounds) for o in got)


def test_a_bfloat16_draft_stays_lossless(engine):
    """``cpu_draft_dtype: bfloat16`` (the default): the draft's linear weights (its restricted head's rows too) are
    stored in bfloat16 and every policy still emits plain decoding's tokens; ``float32`` leaves the draft as loaded."""
    from sage_plugin.engines.lm import RowsLinear, store_draft_weights, use_fast_linears

    head_ids = torch.arange(0, VOCAB, 2)
    kept = TextModel(use_fast_linears(copy.deepcopy(engine.draft.model)), head_ids)
    assert store_draft_weights(kept, "float32") == "float32"
    assert all(p.dtype == torch.float32 for p in kept.model.parameters()) and kept._head_w.dtype == torch.float32
    draft = TextModel(use_fast_linears(copy.deepcopy(engine.draft.model)), head_ids)
    assert store_draft_weights(draft, "bfloat16") == "bfloat16"
    linears = [m for m in draft.model.modules() if isinstance(m, RowsLinear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert draft._head_w.dtype == torch.bfloat16
    for got in _every_policy_equals_plain(engine, SpecEngine(engine.target, draft)):
        assert max(r.tau for o in got for r in o.rounds) >= 2  # the bfloat16 draft still agrees with the target
