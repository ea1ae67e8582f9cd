"""Calibrated path values (core/calibration.py): the table lookup, the fit, the config field, and the policy."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.config import AlgorithmConfig, ConfigError, SageConfig
from sage_plugin.core.calibration import calibrated_logp, calibration_bin, calibration_log_table, fit_calibration
from sage_plugin.core.level_expansion import new_pool, propose
from sage_plugin.core.policies import build_policy

tables = st.integers(1, 5).flatmap(
    lambda a: st.integers(1, 12).flatmap(
        lambda p: st.lists(st.lists(st.floats(1e-3, 1.0), min_size=p, max_size=p), min_size=a, max_size=a)
    )
)


@settings(max_examples=50, deadline=None)
@given(table=tables, probs=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20), alpha=st.floats(0.0, 1.0))
def test_lookup_matches_the_bin_rule(table, probs, alpha):
    log_table = calibration_log_table(table, "cpu")
    logp = torch.tensor(probs, dtype=torch.float32).log()
    got = calibrated_logp(log_table, logp, torch.tensor(alpha, dtype=torch.float32))
    for i, p in enumerate(torch.tensor(probs, dtype=torch.float32).tolist()):
        if p == 0.0:
            assert math.isinf(got[i].item()) and got[i].item() < 0
            continue
        # the float32 probability the lookup sees (exp of the float32 log), and the float32 alpha
        p32 = float(torch.tensor(p).log().exp())
        want = table[calibration_bin(float(torch.tensor(alpha)), len(table))][calibration_bin(p32, len(table[0]))]
        assert got[i].item() == pytest.approx(math.log(want), abs=1e-6)


def test_a_probability_just_below_a_bin_edge_stays_in_its_bin():
    """float32 0.9 is 0.8999999762, in bin 8 of 10, though 0.9f * 10 rounds to 9.0 in float32 (found by hypothesis
    in CI)."""
    table = [[1.0] * 9 + [0.5]]
    got = calibrated_logp(calibration_log_table(table, "cpu"), torch.tensor([0.9]).log(), torch.tensor(0.0))
    assert float(torch.tensor(0.9).log().exp()) < 0.9 and got.item() == pytest.approx(0.0, abs=1e-6)


def test_nan_alpha_reads_the_middle_row():
    log_table = calibration_log_table([[0.1, 0.1], [0.5, 0.5], [0.9, 0.9]], "cpu")
    got = calibrated_logp(log_table, torch.tensor([math.log(0.3)]), torch.tensor([float("nan")]))
    assert got.exp().item() == pytest.approx(0.5)


def test_fit_recovers_a_known_acceptance_curve_and_is_monotone():
    rng = random.Random(0)
    alpha, prob, ok = [], [], []
    for _ in range(40_000):
        a, p = rng.random(), rng.random()
        alpha.append(a)
        prob.append(p)
        ok.append(rng.random() < p * p * (0.5 + 0.5 * a))  # over-confident draft, worse when flat
    table = fit_calibration(alpha, prob, ok, alpha_bins=2, prob_bins=5, prior=1.0)
    assert len(table) == 2 and all(len(r) == 5 for r in table)
    for i, row in enumerate(table):
        assert all(x <= y for x, y in zip(row, row[1:]))
        a_mid = 0.25 + 0.5 * i
        for j, v in enumerate(row):
            lo, hi = j / 5, (j + 1) / 5
            expect = (hi**3 - lo**3) / 3 / (hi - lo) * (0.5 + 0.5 * a_mid)
            assert v == pytest.approx(expect, abs=0.03)


def test_fit_keeps_thin_bins_near_the_identity_and_in_range():
    table = fit_calibration([0.9, 0.9], [0.95, 0.05], [False, True], alpha_bins=1, prob_bins=4, prior=4.0, floor=0.01)
    (row,) = table
    assert all(0.01 <= v <= 1.0 for v in row) and all(x <= y for x, y in zip(row, row[1:]))
    assert row[1] == pytest.approx(0.375, abs=0.05)  # an empty bin: its centre


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([[0.5, 0.0]], r"calibration values must be numbers in \(0, 1\]"),
        ([[0.5, 1.5]], r"calibration values must be numbers in \(0, 1\]"),
        ([[0.5], [0.5, 0.6]], "calibration must have 1-64 rows"),
        ([0.5, 0.6], "calibration must be a list of rows"),
    ],
)
def test_bad_tables_are_one_clear_error(table, message):
    with pytest.raises(ConfigError, match=message):
        SageConfig().replace(calibration=table)


def test_calibration_needs_the_online_topology():
    with pytest.raises(ConfigError, match="calibration works with topology online"):
        SageConfig(topology="planned").replace(calibration=[[0.5]])


def test_config_round_trips_the_table():
    cfg = SageConfig().replace(calibration=[[0.1, 0.5], [0.2, 0.9]])
    assert cfg.algorithm.calibration == ((0.1, 0.5), (0.2, 0.9))
    assert SageConfig.from_mapping(cfg.to_dict()) == cfg


def test_propose_uses_the_calibrated_factor_for_the_path_value():
    """Docstring example: probability 0.6 in bin 2 of [0.05, 0.2, 0.5, 0.9] -> value 0.5 (times the root's 1)."""
    pool, frontier = new_pool(torch.tensor([0]), capacity=8, k=2)
    logprobs = torch.tensor([[[math.log(0.6), math.log(0.3), math.log(0.1)]]])
    table = calibration_log_table([[0.05, 0.2, 0.5, 0.9]], "cpu")
    c = propose(pool, frontier, logprobs, 2, 1, table)
    assert c.joint.exp()[0, 0].tolist() == pytest.approx([0.5, 0.2])
    assert c.logp.exp()[0, 0].tolist() == pytest.approx([0.6, 0.3])  # the draft's own probability is kept
    raw = propose(*new_pool(torch.tensor([0]), capacity=8, k=2), logprobs, 2, 1)
    assert raw.joint.exp()[0, 0].tolist() == pytest.approx([0.6, 0.3])


def test_calibration_reorders_the_best_first_budget():
    """Two root children (0.5 and 0.4) with one kept child each (0.85 under the first, 0.95 under the second), budget
    3: raw values pick the first child's grandchild (0.425 > 0.38); a table that trusts 0.4 and 0.5 alike (0.7) and
    0.95 more than 0.85 (1.0 vs 0.8) picks the second's (0.7 > 0.56)."""
    cfg = AlgorithmConfig(k=2, w_min=2, w_max=2, d_min=2, d_max=2, d_cap=2, n_max=3, theta0=0.0, first_round_static=False,
                     node_budget="fixed", use_history=False)  # fmt: skip
    probs = {(): [0.5, 0.4, 0.1], (0,): [0.85, 0.1, 0.05], (1,): [0.05, 0.95, 0.0]}
    trees = {}
    for name, c in {
        "raw": cfg,
        "cal": cfg.replace(calibration=[[0.3, 0.3, 0.6, 0.6, 0.7, 0.7, 0.7, 0.7, 0.8, 1.0]]),
    }.items():
        pol = build_policy(c)
        state = pol.init_state(1)
        plan = pol.plan(state, torch.tensor([probs[()]]).log())
        pool, frontier = new_pool(torch.tensor([9]), pol.pool_capacity, pol.k)
        lp = torch.tensor([[probs[()]]]).log()
        for level in (1, 2):
            frontier = pol.step(plan, pool, frontier, lp, level)
            rows = [probs[(int(pool.tokens[0, i]),)] if i >= 0 else [1.0, 0.0, 0.0] for i in frontier.idx[0].tolist()]
            lp = torch.tensor([rows]).log()
        tree = pol.finalize(plan, pool)
        n = int(tree.num_nodes[0])
        trees[name] = sorted(zip(tree.depths[0, :n].tolist(), tree.tokens[0, :n].tolist()))
    assert trees["raw"] == [(0, 9), (1, 0), (1, 1), (2, 0)]
    assert trees["cal"] == [(0, 9), (1, 0), (1, 1), (2, 1)]
