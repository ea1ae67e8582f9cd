"""A restricted draft vocabulary under tensor parallelism (``SageDraftWorker.init_lm_head``).

With ``--tp-size`` > 1 the draft's head is a vocabulary shard per rank and SGLang's ``LogitsProcessor`` all-gathers
each rank's logits in rank order.  The worker gathers the whole head once, gives rank ``r`` the ``r``-th equal chunk
of the draft vocabulary's rows (:func:`rank_head_ids`, padded by repeating the last id) and sets SGLang's hot-token
map to the padded ids, so the gathered logits are the full-head logits of the draft vocabulary in map order.  Checked
here against the naive product over every world size 1-4, with a stand-in tensor-parallel group; the server run is
``test_e2e_serving.py::test_tensor_parallel_tiers_equal_plain``.
"""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("sglang")

from sage_plugin.config import SageConfig  # noqa: E402
from sage_plugin.runtimes.sglang import draft_worker as worker_mod  # noqa: E402
from sage_plugin.runtimes.sglang.draft_weights import rank_head_ids  # noqa: E402
from sage_plugin.runtimes.sglang.worker import SageDraftWorker  # noqa: E402


class FakeTP:
    """The tensor-parallel group of one rank: ``all_gather`` along dim 0 of every rank's shard."""

    def __init__(self, shards: list[torch.Tensor], rank: int) -> None:
        self.shards, self.rank_in_group, self.world_size = shards, rank, len(shards)

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        assert dim == 0 and torch.equal(t, self.shards[self.rank_in_group])
        return torch.cat(self.shards, 0)


def _rank_worker(shard: torch.Tensor, ids: torch.Tensor) -> SageDraftWorker:
    w = object.__new__(SageDraftWorker)
    model = types.SimpleNamespace(lm_head=types.SimpleNamespace(weight=shard))
    w.draft_runner = types.SimpleNamespace(model=model)
    w.hot_token_id = ids.clone()
    w.sage_cfg = SageConfig(
        cpu_draft_dtype="float32"
    )  # the head's products compared as float32 (bfloat16: test_draft_weights.py)
    w.target_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=torch.nn.Module()))
    w.device = "cpu"  # a worker's device (init_lm_head offers a CPU draft to the lean decoder)
    return w


@settings(max_examples=40, deadline=None)
@given(
    world=st.integers(1, 4),
    per_rank=st.integers(1, 12),
    n=st.integers(1, 30),
    seed=st.integers(0, 2**16),
)
def test_gathered_rank_logits_are_the_draft_vocabularys_full_head_logits(world, per_rank, n, seed):
    g = torch.Generator().manual_seed(seed)
    vocab = world * per_rank
    head = torch.randn(vocab, 8, generator=g, dtype=torch.float64)
    ids = torch.sort(torch.randperm(vocab, generator=g)[: min(n, vocab)]).values
    hidden = torch.randn(3, 8, generator=g, dtype=torch.float64)
    shards = list(head.chunk(world))
    logits, maps = [], []
    for rank in range(world):
        w = _rank_worker(shards[rank], ids)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(worker_mod, "get_tp_group", lambda rank=rank: FakeTP(shards, rank))
            w.init_lm_head()
        logits.append(hidden @ w.draft_runner.model.lm_head.weight.T)  # this rank's columns
        maps.append(w.hot_token_id)
    for m in maps[1:]:
        assert torch.equal(m, maps[0])  # every rank maps top-k indices back with the same ids
    gathered = torch.cat(logits, -1)  # what the LogitsProcessor's all-gather hands the draft's top-k
    assert gathered.shape[-1] % world == 0 and gathered.shape[-1] - ids.numel() < world
    torch.testing.assert_close(gathered, hidden @ head[maps[0]].T)  # (products over other row sets: not bitwise)
    # the top token through the map is the top token of the draft vocabulary over the whole head
    assert torch.equal(maps[0][gathered.argmax(-1)], ids[(hidden @ head[ids].T).argmax(-1)])


def test_rank_head_ids_pads_by_repeating_the_last_id():
    full, parts = rank_head_ids(torch.tensor([3, 4, 9]), 4)
    assert full.tolist() == [3, 4, 9, 9] and [p.tolist() for p in parts] == [[3], [4], [9], [9]]
    full, parts = rank_head_ids(torch.tensor([3, 4, 9]), 1)
    assert full.tolist() == [3, 4, 9] and len(parts) == 1


def test_ids_beyond_the_head_are_refused(monkeypatch):
    head = torch.randn(6, 4)
    w = _rank_worker(head, torch.tensor([1, 7]))
    monkeypatch.setattr(worker_mod, "get_tp_group", lambda: FakeTP([head], 0))
    with pytest.raises(ValueError, match="reach 7, its head has 6 rows"):
        w.init_lm_head()
