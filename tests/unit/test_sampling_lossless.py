"""Lossless tree sampling: the emitted tokens follow the processed target distribution.

A fixed 2-level tree over a 6-token vocabulary with several children per node is verified
>= 1e5 times (batched copies of the same tree) with ``sample_verify`` for several
(temperature, top-k, top-p) settings, and 2e4 times with the literal recursive-rejection reference
``rejection_verify_one``.  The exact law of the emitted sequence is known: the first token follows
the target distribution at the root; when it is a child's token the walk moves to that child and
the next token follows the target distribution there, and so on; the first token that is not a
child's ends the round (it is the bonus).  Chi-square tests (fixed seeds, so deterministic) check
the first-token marginal, the second token given that the first was a child, and the law of the
whole emitted sequence.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from sage_plugin.core.tree import DraftTree
from sage_plugin.core.verify import sample_verify
from tests.oracles import children_ref, process_logits_ref, rejection_verify_one

VOCAB = 6
# root(5) -> 2, 0, 4 ; 2 -> 1, 3 ; 0 -> 2 ; 4 -> 0, 5, 1
TOKENS = [5, 2, 0, 4, 1, 3, 2, 0, 5, 1]
PARENTS = [-1, 0, 0, 0, 1, 1, 2, 3, 3, 3]
DEPTHS = [0, 1, 1, 1, 2, 2, 2, 2, 2, 2]
N = len(TOKENS)
P_MIN = 0.01

SETTINGS = {
    "plain": (1.0, 0, 1.0),
    "temp_topk": (0.7, 3, 1.0),
    "temp_topp": (1.3, 0, 0.8),
    "all_filters": (0.9, 4, 0.9),
}


def target_logits() -> torch.Tensor:
    g = torch.Generator().manual_seed(2024)
    logits = torch.randn(N, VOCAB, generator=g, dtype=torch.float64) * 1.2
    # make the tree's own tokens likely enough that deep walks happen
    for i in range(N):
        for c in range(N):
            if PARENTS[c] == i:
                logits[i, TOKENS[c]] += 0.8
    return logits.float()


def processed(setting: str) -> list[list[float]]:
    temp, top_k, top_p = SETTINGS[setting]
    logits = target_logits().double().tolist()
    out = []
    for row in logits:
        p = process_logits_ref(row, temp, top_k, top_p)
        # the setting must stay away from top-p boundaries (float32 vs float64 agree on support)
        z = process_logits_ref(row, temp, top_k, None)
        mass = sorted(z, reverse=True)
        cums = [sum(mass[: i + 1]) for i in range(VOCAB)]
        assert all(abs(c - top_p) > 1e-3 for c in cums) or top_p >= 1.0
        out.append(p)
    return out


def exact_law(probs: list[list[float]]) -> dict[tuple[int, ...], float]:
    """Probability of every emitted sequence (accepted draft tokens + bonus)."""
    kids = children_ref(PARENTS)
    law: dict[tuple[int, ...], float] = {}

    def walk(u: int, prefix: tuple[int, ...], weight: float) -> None:
        child_of = {TOKENS[c]: c for c in kids[u]}
        for y, p in enumerate(probs[u]):
            if p <= 0.0:
                continue
            if y in child_of:
                walk(child_of[y], prefix + (y,), weight * p)
            else:
                law[prefix + (y,)] = law.get(prefix + (y,), 0.0) + weight * p

    walk(0, (), 1.0)
    assert abs(sum(law.values()) - 1.0) < 1e-9
    return law


def batched_tree(bsz: int) -> DraftTree:
    row = lambda v: torch.tensor(v, dtype=torch.int64).expand(bsz, -1)  # noqa: E731
    return DraftTree(
        tokens=row(TOKENS),
        parents=row(PARENTS),
        depths=row(DEPTHS),
        num_nodes=torch.full((bsz,), N, dtype=torch.int64),
        draft_logp=torch.zeros(bsz, N),
        ranks=torch.zeros(bsz, N, dtype=torch.int64),
        max_depth=2,
        node_conf=torch.full((bsz, N), float("nan")),
    )


def run_sample_verify(setting: str, calls: int = 5, bsz: int = 20_000, seed: int = 0) -> Counter:
    temp, top_k, top_p = SETTINGS[setting]
    tree = batched_tree(bsz)
    logits = target_logits().expand(bsz, -1, -1)
    gen = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    for _ in range(calls):
        res = sample_verify(
            tree,
            logits,
            torch.full((bsz,), temp),
            torch.full((bsz,), top_k, dtype=torch.int64),
            torch.full((bsz,), top_p),
            generator=gen,
        )
        steps = torch.arange(res.emitted.shape[1])
        live = steps[None] <= res.num_accepted[:, None]
        assert bool(((res.emitted >= 0) == live).all()), "tau + 1 tokens, then -1 padding"
        # count distinct emitted rows (few) without a Python loop over the batch
        rows, freq = torch.unique(res.emitted, dim=0, return_counts=True)
        for row, c in zip(rows.tolist(), freq.tolist(), strict=True):
            counts[tuple(x for x in row if x >= 0)] += c
    return counts


def run_rejection_reference(setting: str, n: int = 20_000, seed: int = 0) -> Counter:
    probs = processed(setting)
    rng = random.Random(seed)
    return Counter(tuple(rejection_verify_one(TOKENS, PARENTS, probs, rng)) for _ in range(n))


def chi2_full_law(counts: Counter, law: dict) -> float:
    """p-value of the emitted-sequence counts against ``law`` (sparse cells merged)."""
    assert set(counts) <= set(law), f"impossible sequences emitted: {set(counts) - set(law)}"
    total = sum(counts.values())
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for seq, p in law.items():
        if p * total >= 5:
            obs.append(counts.get(seq, 0))
            exp.append(p * total)
        else:
            rest_o += counts.get(seq, 0)
            rest_e += p * total
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    return chisquare(obs, exp).pvalue


def chi2_first_token(counts: Counter, p_root: list[float]) -> float:
    first = Counter()
    for seq, c in counts.items():
        first[seq[0]] += c
    total = sum(first.values())
    for y, p in enumerate(p_root):
        if p == 0.0:
            assert first.get(y, 0) == 0, f"token {y} has target probability 0 but was emitted first"
    cells = [y for y, p in enumerate(p_root) if p > 0]
    return chisquare([first.get(y, 0) for y in cells], [p_root[y] * total for y in cells]).pvalue


def chi2_second_given_child(counts: Counter, probs: list[list[float]]) -> float:
    """Second token given that the first was a child's token c: ~ target distribution at c."""
    child_of_root = {TOKENS[c]: c for c in range(N) if PARENTS[c] == 0}
    obs, exp, groups = [], [], 0
    for tok, node in child_of_root.items():
        seconds = Counter()
        for seq, c in counts.items():
            if seq[0] == tok:
                assert len(seq) >= 2, "an accepted child must be followed by another token"
                seconds[seq[1]] += c
        n = sum(seconds.values())
        p = probs[node]
        for y, q in enumerate(p):
            if q == 0.0:
                assert seconds.get(y, 0) == 0
        cells = [y for y, q in enumerate(p) if q > 0]
        if n == 0 or len(cells) < 2:
            continue
        groups += 1
        obs += [seconds.get(y, 0) for y in cells]
        exp += [p[y] * n for y in cells]
    assert groups >= 2
    return chisquare(obs, exp, ddof=groups - 1).pvalue


@pytest.fixture(scope="module")
def sampled(_one_torch_thread):
    return {s: run_sample_verify(s, seed=i) for i, s in enumerate(SETTINGS)}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sample_verify_first_token_marginal(sampled, setting):
    probs = processed(setting)
    counts = sampled[setting]
    assert sum(counts.values()) >= 100_000
    assert chi2_first_token(counts, probs[0]) > P_MIN


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sample_verify_second_token_given_child(sampled, setting):
    assert chi2_second_given_child(sampled[setting], processed(setting)) > P_MIN


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sample_verify_full_sequence_law(sampled, setting):
    counts = sampled[setting]
    law = exact_law(processed(setting))
    assert chi2_full_law(counts, law) > P_MIN
    # sanity: deep walks happen (the test exercises acceptance at both levels)
    assert sum(c for s, c in counts.items() if len(s) == 3) > 1000


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_literal_rejection_reference_matches_law(setting):
    counts = run_rejection_reference(setting, seed=1)
    probs = processed(setting)
    assert chi2_full_law(counts, exact_law(probs)) > P_MIN
    assert chi2_first_token(counts, probs[0]) > P_MIN


def test_filtered_tokens_are_never_emitted(sampled):
    # top-k 3 at the root: only three first tokens possible
    probs = processed("temp_topk")
    allowed = {y for y, p in enumerate(probs[0]) if p > 0}
    assert len(allowed) == 3
    assert {s[0] for s in sampled["temp_topk"]} <= allowed
