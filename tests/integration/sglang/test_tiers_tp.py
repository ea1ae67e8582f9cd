"""Tiers under tensor parallelism: every rank runs the same tier at every step.

Two real ``torch.distributed`` gloo ranks (spawned processes) each drive a :class:`SageTierController` over a
recording worker through the same decode steps (batch sizes, accept lengths: what SGLang's ranks share), but each
times its steps differently, as real ranks do.  Fed through :class:`RankZeroTimes` (rank 0's timings broadcast every
few steps) both ranks apply the same tier sequence and end with the same cost table; fed their own timings, the same
ranks diverge (the control that shows the check can fail).  The server run (TP=2 on CPU, outputs equal to plain TP=2)
is ``test_e2e_serving.py::test_tensor_parallel_tiers_equal_plain``; the head split of a restricted draft vocabulary
across ranks is checked in ``test_draft_head_tp.py``.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import random
import types

import pytest
import torch

pytest.importorskip("sglang")

from sage_plugin.runtimes.sglang.tiers import RankZeroTimes, SageTierController  # noqa: E402
from sage_plugin.runtimes.sglang.tpsync import sync_due, sync_verify_input  # noqa: E402
from sage_plugin.serving.tiers import TierChooser, parse_tiers  # noqa: E402

from .test_tiers_capture import RecordingWorker  # noqa: E402

TIERS = ((0, 1), (1, 2), (3, 5), (6, 11))
STEPS = 240


def _drive(rank: int, broadcast, steps: int = STEPS) -> tuple[list[tuple[int, int]], dict, int]:
    """One rank's decode steps: the applied tiers, the chooser's summary, shares made."""
    chooser = TierChooser(parse_tiers(TIERS), probe_every=4, alpha_bins=0, acceptance="pooled")
    shared = None if broadcast is None else RankZeroTimes(chooser, rank, broadcast, every=8)
    ctl = SageTierController(RecordingWorker(6, 11), chooser, shared)
    ctl.init_states()
    shared_rng, own_rng = random.Random(0), random.Random(100 + rank)  # rank-identical inputs / this rank's clock
    for _ in range(steps):
        bs = shared_rng.choice((1, 2, 4, 8))
        ctl.activate_step_by_batch(bs)
        tier = ctl.active
        # each rank's clock: the same step costs plus its own host noise and a per-rank bias on deep tiers
        ms = 40 + 6 * tier.draft_tokens + 3 * tier.steps + own_rng.uniform(0, 12) + (9 * rank if tier.steps > 2 else 0)
        ctl.record_cost(tier, bs, ms / 1000)
        ctl.record_overhead(own_rng.uniform(0.001, 0.004))
        ctl.end_step()
        accepted = [min(tier.steps, shared_rng.choice((0, 0, 1, 1, 2, 3, 5))) for _ in range(bs)]
        ctl.on_verify_complete(accepted, bs)
    return ctl.worker.applied, chooser.summary(), 0 if shared is None else shared.shares


def _tree_of(rank: int) -> types.SimpleNamespace:
    """A verify input as SGLang builds it, with rank-specific draft tokens and scores (a non-contiguous positions
    view, a bool mask, no draft probabilities)."""
    g = torch.Generator().manual_seed(rank)
    return types.SimpleNamespace(
        draft_token=torch.randint(0, 1000, (8,), generator=g),
        custom_mask=torch.rand(2, 16, generator=g) > 0.5,
        positions=torch.arange(24).reshape(8, 3)[:, 1] + rank,
        retrieve_index=torch.randint(0, 8, (2, 4), generator=g),
        retrieve_next_token=torch.randint(-1, 4, (2, 4), generator=g),
        retrieve_next_sibling=torch.randint(-1, 4, (2, 4), generator=g),
        retrieve_cum_len=None,
        draft_probs=None,
        spec_steps=3,
    )


def _sync_trees(rank: int, broadcast) -> dict:
    tree, parents, top = _tree_of(rank), torch.tensor([rank, 7]), torch.tensor([[rank]])
    sync_verify_input((tree, parents, top), broadcast)
    mine = {k: v for k, v in vars(tree).items() if isinstance(v, torch.Tensor)}
    return {"tree": mine, "rank0": {k: getattr(_tree_of(0), k) for k in mine}, "topology": (parents, top)}


def _rank_main(rank: int, world: int, init: str, job: str, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        broadcast = lambda t: dist.broadcast(t, src=0)  # noqa: E731
        result = _sync_trees(rank, broadcast) if job == "trees" else _drive(rank, broadcast if job == "share" else None)
        # by value: a queue would share the tensors' storage through a descriptor server that this process takes
        # down when it exits, possibly before the parent reads them (FileNotFoundError in the parent)
        out.put((rank, pickle.dumps(result)))
    finally:
        dist.destroy_process_group()


def _run_ranks(tmp_path, share: bool | str, world: int = 2) -> dict[int, tuple]:
    job = share if isinstance(share, str) else ("share" if share else "own")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{tmp_path / ('store_' + job)}"
    procs = [ctx.Process(target=_rank_main, args=(r, world, init, job, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = {rank: pickle.loads(blob) for rank, blob in (out.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def test_every_rank_runs_rank_zeros_tier_sequence(tmp_path):
    res = _run_ranks(tmp_path, share=True)
    (seq0, summary0, shares0), (seq1, summary1, shares1) = res[0], res[1]
    assert shares0 == shares1 == STEPS // 8
    assert seq0 == seq1
    assert len(set(seq0)) >= 3, seq0  # the tiers were really chosen between, not one shape throughout
    assert summary0 == summary1


def test_ranks_fed_their_own_timings_diverge(tmp_path):
    """The control: without the share the same ranks choose different tiers (so the test above can fail)."""
    res = _run_ranks(tmp_path, share=False)
    assert res[0][0] != res[1][0]


def test_a_share_carries_what_rank_zero_measured_in_order():
    """One process, a stand-in broadcast: the receiving rank's chooser gets rank 0's samples, its own are ignored."""
    sent: list = []

    def as_rank0(t):
        sent.append(t.clone())

    def as_rank1(t):
        t.copy_(sent.pop(0))

    (seq0, s0, _), (seq1, s1, _) = _drive(0, as_rank0, 64), _drive(1, as_rank1, 64)
    assert seq0 == seq1 and s0 == s1 and not sent


def test_share_arguments_are_checked():
    chooser = TierChooser(parse_tiers(TIERS))
    with pytest.raises(ValueError, match="every and capacity"):
        RankZeroTimes(chooser, 0, lambda t: None, every=0)


def test_tp_sync_gives_every_rank_rank_zeros_tree(tmp_path):
    """``tp_sync``: two gloo ranks with different trees both end with rank 0's (every tensor, the non-contiguous
    positions view written back in place, the topology tensors too); without the sync they differ."""
    res = _run_ranks(tmp_path, "trees")
    assert not torch.equal(_tree_of(0).draft_token, _tree_of(1).draft_token)
    for rank in (0, 1):
        tree, rank0 = res[rank]["tree"], res[rank]["rank0"]
        assert set(tree) == {"draft_token", "custom_mask", "positions", "retrieve_index", "retrieve_next_token",
                             "retrieve_next_sibling"}  # fmt: skip
        for name, t in tree.items():
            assert torch.equal(t, rank0[name]), (rank, name)
        parents, top = res[rank]["topology"]
        assert parents.tolist() == [0, 7] and top.tolist() == [[0]]


@pytest.mark.parametrize(
    ("mode", "world", "hip", "greedy", "due"),
    [("auto", 2, False, True, False), ("auto", 2, False, False, True), ("auto", 2, True, True, True),
     ("tree", 2, False, True, True), ("off", 2, True, False, False), ("tree", 1, True, False, False)],
)  # fmt: skip
def test_tp_sync_is_due_where_sglang_broadcasts_its_verify(mode, world, hip, greedy, due):
    assert sync_due(mode, world, hip, greedy) is due
