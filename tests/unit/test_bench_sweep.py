"""The equal-budget sweep (``sage bench --sweep-nodes``) and the per-category report, on synthetic data."""

from __future__ import annotations

import pytest
import torch

from sage_plugin.bench.report import category_table, summarize
from sage_plugin.bench.run import MethodResult
from sage_plugin.bench.sweep import oracle_tau, sweep_methods, sweep_summary, sweep_table
from sage_plugin.config import AlgorithmConfig, ConfigError, SageConfig
from sage_plugin.engines.speculative import RoundLog


def test_sweep_methods_hold_every_budget():
    methods = sweep_methods(SageConfig(), [4, 32])
    specs = {s.name: s.config.algorithm for s in methods}
    names = ("eagle2", "topn", "static", "sage", "sage-paper", "sage-paper-calibrated", "sage-rerank", "sage-children",
             "sage-auto")  # fmt: skip
    assert set(specs) == {f"{m}@{n}" for m in names for n in (4, 32)}
    assert {s.name for s in methods if s.tuned} == {"sage-paper-calibrated@4", "sage-paper-calibrated@32"}
    assert specs["sage-paper-calibrated@4"] == specs["sage-paper@4"]  # until the bench fits its table
    assert specs["sage-rerank@4"].max_tree_nodes == 4 and specs["sage-rerank@4"].n_max == 64
    assert specs["sage-rerank@4"].rerank_pool == "kept" and specs["sage-children@4"].rerank_pool == "children"
    for n in (4, 32):
        assert specs[f"eagle2@{n}"].max_tree_nodes == n and specs[f"topn@{n}"].max_tree_nodes == n
        for m in ("sage-paper", "sage", "sage-auto", "sage-children"):
            assert specs[f"{m}@{n}"].max_tree_nodes == n, m  # no 25-node round 1
        assert specs[f"sage-paper@{n}"].node_budget == "fixed" and specs[f"sage-paper@{n}"].rerank_pool == "kept"
        assert specs[f"sage@{n}"] == AlgorithmConfig(
            n_max=n, first_round_static=False, node_budget="fixed"
        )  # the defaults
        assert specs[f"sage-auto@{n}"].node_budget == "auto"
    static4 = specs["static@4"].static_tree
    assert static4 == ((0,), (1,), (2,), (3,))  # level order: the first 4 rank paths
    cut = specs["static@32"].static_tree
    assert len(cut) == 25 and all(len(p) == 1 or p[:-1] in cut for p in cut)  # the whole tree, ancestor-closed


def test_sweep_methods_keep_the_named_ones():
    specs = sweep_methods(SageConfig(), [8], ["eagle2", "sage", "oracle"])
    assert [s.name for s in specs] == ["eagle2@8", "sage@8"]
    with pytest.raises(ConfigError, match="--sweep-methods: unknown sage-beam"):
        sweep_methods(SageConfig(), [8], ["sage-beam"])


def _logits_with_topk(ranks: list[bool], vocab: int = 8):
    """A fake draft whose top-2 at output position j contains the next output token iff ``ranks[j]``."""

    def logits(seq: list[int]) -> torch.Tensor:
        out = torch.zeros(len(seq), vocab)
        for pos in range(len(seq) - 1):
            nxt = seq[pos + 1]
            j = pos - PROMPT  # output index whose successor is drafted here
            hit = 0 <= j < len(ranks) and ranks[j]
            out[pos, nxt if hit else (nxt + 1) % vocab] = 5.0
            out[pos, (nxt + 2) % vocab] = 4.0
        return out

    return logits


PROMPT = 3


def test_oracle_accepts_the_longest_run_the_draft_contains():
    prompt, out = [1, 2, 3], [4, 5, 6, 7, 0, 1, 2]  # 6 decode tokens after the prefill's first
    hits = [True, True, False, True, True, True]
    fn = _logits_with_topk(hits)
    # budget 8: round 1 accepts 2 then a bonus (3 tokens), round 2 accepts 3 (the rest): 2 forwards -> tau 3.0
    assert oracle_tau(fn, [prompt], [out], k=2, n=8) == 6 / 2
    # budget 1: at most one draft per round: 2 + 1 + 2 + ... rounds
    assert oracle_tau(fn, [prompt], [out], k=2, n=1) == 6 / 4
    assert oracle_tau(_logits_with_topk([False] * 6), [prompt], [out], k=2, n=8) == 1.0


def _result(name, taus, nodes, rids=("a", "b"), forwards=(2, 2), tokens=(5, 3)):
    r = MethodResult(name, decode_tokens=sum(t - 1 for t in tokens), target_forwards=sum(forwards))
    for rid, f, t in zip(rids, forwards, tokens):
        r.outputs[rid], r.forwards[rid] = list(range(t)), f
        r.rounds += [(rid, RoundLog(taus, nodes, 1, 0.5, 0.5, 3, 2, 1)) for _ in range(f)]
    r.compared, r.exact = len(rids), len(rids)
    return r


def test_sweep_summary_and_table():
    results = {"ar": _result("ar", 0, 0), "eagle2@4": _result("eagle2@4", 1, 4), "sage@4": _result("sage@4", 1, 3)}
    sweep = sweep_summary(results, [4], {4: 2.5})
    assert sweep["eagle2"]["4"] == {"tau": 1.5, "mean_nodes": 4.0, "exact_match": 1.0}
    assert sweep["oracle"]["4"]["tau"] == 2.5 and "ar" not in sweep
    table = sweep_table(sweep, [4]).splitlines()
    assert table[0] == "| method | N = 4 |" and "| sage | 1.50 (3.0) |" in table and "| oracle | 2.50 |" in table


def test_per_category_tau():
    results = {"ar": _result("ar", 0, 0), "sage": _result("sage", 1, 3, forwards=(1, 2))}
    summary = summarize(results, {}, {"a": "writing", "b": "math"})
    per = summary["methods"]["sage"]["per_category"]
    rounds = {"accepted_per_round": 1.0, "alpha": 0.5}  # every round of _result: one accepted draft, root alpha 0.5
    assert per == {"math": {"tau": 1.0, **rounds, "requests": 1, "exact_match": 1.0},
                   "writing": {"tau": 4.0, **rounds, "requests": 1, "exact_match": 1.0}}  # fmt: skip
    table = category_table(summary).splitlines()
    assert table[0] == "| category | requests | ar | sage |" and table[2] == "| math | 1 | 1.00 | 1.00 |"
