"""SAGE's beam level in one op call (core/beam_level.py; the op: kernels/beam_level.py, kernels/csrc/beam_level.cpp)
against the operator path.

Both paths are driven like the reference engine drives them: level after level on the same draft distributions, the
frontier trimmed to its live width or padded with empty columns between levels.  Distributions are drawn with ties
(values on a coarse grid), impossible tokens (-inf), pools that overflow, and a vocabulary subset; the pool (every
column but the trash column, which nothing reads) and every returned frontier must be identical.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sage_plugin.core.sage as sage_module
from sage_plugin.config import AlgorithmConfig
from sage_plugin.core.level_expansion import DraftPool, Frontier, new_pool
from sage_plugin.core.policy import RoundPlan
from sage_plugin.core.sage import SagePolicy
from sage_plugin.kernels.beam_level import beam_ops


@pytest.fixture(autouse=True, scope="module")
def _kernel() -> None:
    """Skip where the kernel cannot be built: checked when the tests run, so collecting them loads no library."""
    if beam_ops() is None:
        pytest.skip("the beam_level kernel cannot be built here")


FIELDS = ("tokens", "parents", "depths", "logp", "logp_topk", "joint", "joint_topk", "ranks", "codes", "conf", "count")


def _pool_columns(pool: DraftPool) -> dict[str, torch.Tensor]:
    return {f: getattr(pool, f) if f == "count" else getattr(pool, f)[:, :-1] for f in FIELDS}


def _logprobs(gen: torch.Generator, bsz: int, width: int, vocab: int, grid: float, impossible: float) -> torch.Tensor:
    """``[B, F, V]`` log-softmax rows on a coarse grid (ties), a share of tokens impossible (-inf)."""
    raw = torch.randn(bsz, width, vocab, generator=gen) * 2.0
    raw = torch.round(raw / grid) * grid if grid else raw
    raw[torch.rand(bsz, width, vocab, generator=gen) < impossible] = float("-inf")
    raw[..., 0] = torch.where(torch.isinf(raw[..., 0]), torch.zeros_like(raw[..., 0]), raw[..., 0])  # a live token
    return torch.log_softmax(raw, -1)


def _drive(cfg: AlgorithmConfig, fused: bool, seed: int, bsz: int, levels: int, vocab: int, grid: float, impossible: float,
           pad: bool, use_vocab: bool) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:  # fmt: skip
    policy = SagePolicy(cfg, fused=fused)
    gen = torch.Generator().manual_seed(seed)
    width = torch.randint(1, cfg.k + 1, (bsz,), generator=gen)
    zeros = torch.zeros(bsz)
    plan = RoundPlan(torch.full((bsz,), levels), width, zeros, zeros, torch.zeros(bsz, dtype=torch.bool))
    ids = torch.randperm(1000, generator=gen)[:vocab] if use_vocab else None
    pool, frontier = new_pool(torch.randint(0, 1000, (bsz,), generator=gen), policy.pool_capacity, policy.k)
    frontiers = []
    for level in range(1, levels + 1):
        logprobs = _logprobs(gen, bsz, frontier.idx.shape[1], vocab, grid, impossible)
        frontier = policy.step(plan, pool, frontier, logprobs, level, vocab=ids)
        frontiers.append(frontier.idx.clone())
        live = int(frontier.valid.sum(1).max())
        if live == 0:
            break
        if pad:  # the reference engine pads a level to a cheaper width; the padding columns are empty
            extra = int(torch.randint(0, 3, (), generator=gen))
            frontier = Frontier(torch.cat([frontier.idx[:, :live], frontier.idx.new_full((bsz, extra), -1)], 1))
        else:
            frontier = Frontier(frontier.idx[:, :live])
    return frontiers, _pool_columns(pool)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    bsz=st.integers(1, 3),
    k=st.sampled_from([2, 3, 4, 10]),
    n_max=st.integers(2, 40),
    beam_depth=st.integers(1, 6),
    grid=st.sampled_from([0.0, 0.5, 2.0]),
    impossible=st.sampled_from([0.0, 0.3, 0.9]),
    pad=st.booleans(),
    use_vocab=st.booleans(),
    budget_order=st.sampled_from(["best_first", "parent_order"]),
    calibrated=st.booleans(),
    static=st.booleans(),
)
def test_the_kernel_builds_the_operator_paths_pool_and_frontiers(
    seed, bsz, k, n_max, beam_depth, grid, impossible, pad, use_vocab, budget_order, calibrated, static
):
    """``static``: the static first tree configured (k = 10), whose widest level widens the frontier past ``k``."""
    cfg = AlgorithmConfig(
        k=k, w_min=1, w_max=k, n_max=n_max, beam_depth=beam_depth, budget_order=budget_order,
        first_round_static=static and k == 10,
        calibration=((0.9, 0.5, 0.2), (0.3, 0.6, 0.95)) if calibrated else (),
    )  # fmt: skip
    args = (seed, bsz, beam_depth, 12 if k <= 4 else 40, grid, impossible, pad, use_vocab)
    want_frontiers, want_pool = _drive(cfg, False, *args)
    got_frontiers, got_pool = _drive(cfg, True, *args)
    assert len(got_frontiers) == len(want_frontiers)
    for got, want in zip(got_frontiers, want_frontiers):
        assert torch.equal(got, want)
    for field in FIELDS:
        assert torch.equal(got_pool[field], want_pool[field]) or (
            got_pool[field].is_floating_point() and torch.allclose(got_pool[field], want_pool[field], equal_nan=True)
            and torch.equal(got_pool[field].isnan(), want_pool[field].isnan())
        ), field  # fmt: skip


def test_a_level_the_kernel_takes_never_reaches_the_operator_path(monkeypatch):
    """After the first round every beam level is one kernel call: the operator path's ``propose`` never runs, and the
    fused policy's pool equals the operator path's (float fields bit for bit)."""
    cfg = AlgorithmConfig(k=4, w_min=1, w_max=4, n_max=12, beam_depth=4, first_round_static=False)
    want_frontiers, want_pool = _drive(cfg, False, 7, 2, 4, 16, 0.5, 0.2, True, False)

    def refuse(*args, **kwargs):
        raise AssertionError("the operator path ran")

    monkeypatch.setattr(sage_module, "propose", refuse)
    got_frontiers, got_pool = _drive(cfg, True, 7, 2, 4, 16, 0.5, 0.2, True, False)
    assert all(torch.equal(a, b) for a, b in zip(got_frontiers, want_frontiers))
    assert all(torch.equal(got_pool[f], want_pool[f]) for f in FIELDS if f != "conf")
    assert torch.equal(got_pool["conf"].isnan(), want_pool["conf"].isnan())


def test_first_rounds_and_the_planned_topology_keep_the_operator_path():
    """A batch with a request in its first round (the static tree) runs operator by operator, as does the planned
    topology's replay and a pool other than the beam."""
    assert not SagePolicy(AlgorithmConfig(topology="planned")).fused
    assert not SagePolicy(AlgorithmConfig(rerank_pool="kept")).fused
    assert SagePolicy(AlgorithmConfig()).fused and not SagePolicy(AlgorithmConfig(), fused=False).fused
    cfg = AlgorithmConfig(k=10, n_max=12)
    policy = SagePolicy(cfg)
    pool, frontier = new_pool(torch.tensor([5, 6]), policy.pool_capacity, policy.k)
    zeros = torch.zeros(2)
    first = RoundPlan(torch.full((2,), 3), torch.tensor([2, 2]), zeros, zeros, torch.tensor([True, False]))
    calls = []
    original = sage_module.propose
    sage_module.propose = lambda *a, **kw: calls.append(1) or original(*a, **kw)
    try:
        policy.step(first, pool, frontier, torch.log_softmax(torch.randn(2, 1, 16), -1), 1)
    finally:
        sage_module.propose = original
    assert calls == [1]


def test_the_worked_example():
    """core/beam_level.py's docstring example."""
    cfg = AlgorithmConfig(k=2, w_min=1, w_max=2, n_max=4, beam_depth=2, first_round_static=False)
    policy = SagePolicy(cfg)
    pool, frontier = new_pool(torch.tensor([9]), policy.pool_capacity, policy.k)
    zeros = torch.zeros(1)
    plan = RoundPlan(torch.tensor([2]), torch.tensor([1]), zeros, zeros, torch.tensor([False]))
    logprobs = torch.full((1, 1, 5), float("-inf"))
    logprobs[0, 0, 3], logprobs[0, 0, 1] = -0.1, -2.3
    out = policy.step(plan, pool, frontier, logprobs, 1)
    assert out.idx.tolist() == [[1, -1]]
    assert pool.tokens[0, :3].tolist() == [9, 3, 1] and pool.codes[0, :3].tolist() == [0, 1, 2]
    assert pool.joint[0, 1:3].tolist() == pytest.approx([-0.1, -2.3]) and int(pool.count[0]) == 3


def _random_pool(gen: torch.Generator, bsz: int, capacity: int, grid: float) -> DraftPool:
    pool, _ = new_pool(torch.zeros(bsz, dtype=torch.int64), capacity, 2)
    pool.count[:] = torch.randint(1, capacity + 1, (bsz,), generator=gen)
    values = -torch.rand(bsz, capacity + 1, generator=gen) * 6.0
    pool.joint[:] = torch.round(values / grid) * grid if grid else values
    pool.depths[:] = torch.randint(1, 5, (bsz, capacity + 1), generator=gen)
    return pool


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    bsz=st.integers(1, 3),
    capacity=st.integers(2, 40),
    grid=st.sampled_from([0.0, 0.25, 1.0]),
    level=st.integers(1, 4),
    ms_len=st.integers(1, 45),
    ahead=st.sampled_from([None, 0.0, 2.0, 20.0]),
)
def test_the_cost_check_in_one_call_decides_as_the_operator_path(seed, bsz, capacity, grid, level, ms_len, ahead):
    """``level_pays`` through the kernel: the same decision as ``cost.level_pays`` on random pools (ties, short and
    long cost curves, with and without the look-ahead)."""
    from sage_plugin.core import beam_level as fused
    from sage_plugin.core.cost import level_pays

    gen = torch.Generator().manual_seed(seed)
    pool = _random_pool(gen, bsz, capacity, grid)
    round_ms = 30.0 + torch.cumsum(torch.rand(ms_len, generator=gen) * 4.0, 0)
    nxt = None if ahead is None else round_ms + ahead
    want = level_pays(pool, level, round_ms, nxt)
    got = fused.level_pays(pool, level, round_ms, nxt)
    assert got.dtype == torch.bool and got.dim() == 0 and bool(got) == bool(want)


def test_the_cost_check_in_one_call_answers_both_ways():
    """Cheap verification keeps drafting, an expensive next level stops: the kernel answers as cost.py's worked
    example does."""
    from sage_plugin.core import beam_level as fused

    pool, _ = new_pool(torch.zeros(1, dtype=torch.int64), 4, 2)
    pool.count[:] = 3
    pool.joint[0, 1:3] = torch.tensor([0.8, 0.5]).log()
    pool.depths[0, 1:3] = torch.tensor([1, 2])
    flat = torch.full((4,), 70.0)
    assert bool(fused.level_pays(pool, 2, flat, flat + 5.0))
    pool.joint[0, 2] = torch.tensor(0.04).log()
    assert not bool(fused.level_pays(pool, 2, flat, flat + 5.0))
