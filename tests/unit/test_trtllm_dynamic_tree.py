"""SAGE's node policy on a fake of TensorRT-LLM main's ``Eagle3OneModelDynamicTreeWorker`` (no TensorRT-LLM).

The fake has the recorded methods (checked against ``contract.py`` when the policy is installed), buffers and module
functions with the shapes of ``eagle3_dynamic_tree.py`` @ ``DYNAMIC_TREE_COMMIT``; a driver runs its draft loop
(sample -> update_draft_tokens_and_scores per layer -> resampling_final_draft_tokens) on random logits.
"""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sage_plugin.config import ConfigError, SageConfig
from sage_plugin.core.beam_selection import eagle_beam_candidates, select_shaped
from sage_plugin.runtimes.trtllm import dynamic_tree
from sage_plugin.runtimes.trtllm.contract import TREE_WORKER_READ, ContractMismatchError
from sage_plugin.runtimes.trtllm.dynamic_tree import install_dynamic_tree_policy, uninstall_dynamic_tree_policy
from sage_plugin.serving.slots import SlotState

V = 50


def _sample_softmax_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.topk(torch.softmax(logits, dim=-1), k=k, dim=-1)
    return indices, values


def _select_topk_draft_tokens(new_tokens, new_scores, previous_scores, k):
    tokens = new_tokens.reshape(-1, k * k)
    scores = (new_scores * previous_scores.unsqueeze(2)).reshape(-1, k * k)
    values, indices = torch.topk(scores, k=k, dim=-1)
    return torch.gather(tokens, 1, indices), values, indices, indices // k, tokens, scores


def _resample_final_tokens(history_scores, history_tokens, k):
    indices = torch.sort(torch.topk(history_scores, k=k, dim=-1).indices).values
    return torch.gather(history_tokens, 1, indices), indices


class FakeDynamicTreeWorker:
    """The recorded interface and buffers of the dynamic-tree worker (draft-side bookkeeping only)."""

    def __init__(self, k: int, depth: int, total: int, max_batch: int, num_slots: int) -> None:
        self.K, self.max_draft_len, self.max_total_draft_tokens, self._max_batch_size = k, depth, total, max_batch
        width = k + k * k * (depth - 1)
        self.draft_tokens_buffer = torch.zeros(max_batch, k * depth, dtype=torch.int32)
        self.history_draft_tokens_buffer = torch.zeros(max_batch, width, dtype=torch.int32)
        self.history_score_buffer = torch.zeros(max_batch, width, dtype=torch.float32)
        self.history_draft_tokens_parent_buffer = torch.zeros(
            max_batch, max(k * (depth - 1) + 1, k + 1), dtype=torch.int64
        )
        self._parent_init_arange = torch.arange(-1, k, dtype=torch.int64)
        self._num_accepted_tokens_buf = torch.ones(max_batch, dtype=torch.int32)
        storage = SimpleNamespace(all_ids_buf=torch.zeros(num_slots, dtype=torch.long))
        self.spec_tree_manager = SimpleNamespace(slot_storage=storage)

    def sample(self, logits, max_top_k):
        return _sample_softmax_topk(logits, max_top_k)

    def update_draft_tokens_and_scores(
        self, cur_draft_idx, new_draft_tokens, new_draft_scores, previous_draft_scores, batch_size, attn_metadata=None
    ):
        k = self.K
        if cur_draft_idx == 0:
            scores = new_draft_scores.reshape(batch_size, k)
            tokens = new_draft_tokens.reshape(batch_size, k).to(torch.int32)
            self.draft_tokens_buffer[:batch_size, :k] = tokens
            self.history_draft_tokens_buffer[:batch_size, :k] = tokens
            self.history_score_buffer[:batch_size, :k] = scores
            self.history_draft_tokens_parent_buffer[:batch_size, : k + 1] = self._parent_init_arange
            return scores
        real, values, indices, _, tokens, scores = _select_topk_draft_tokens(
            new_draft_tokens, new_draft_scores, previous_draft_scores, k
        )
        self.draft_tokens_buffer[:batch_size, cur_draft_idx * k : (cur_draft_idx + 1) * k] = real.to(torch.int32)
        start = k + (cur_draft_idx - 1) * k * k
        self.history_draft_tokens_buffer[:batch_size, start : start + k * k] = tokens.to(torch.int32)
        self.history_score_buffer[:batch_size, start : start + k * k] = scores
        if cur_draft_idx < self.max_draft_len - 1:
            nxt = cur_draft_idx * k + 1
            self.history_draft_tokens_parent_buffer[:batch_size, nxt : nxt + k] = (
                indices + k * k * (cur_draft_idx - 1) + k
            )
        return values

    def resampling_final_draft_tokens(self, batch_size):
        return _resample_final_tokens(
            self.history_score_buffer[:batch_size],
            self.history_draft_tokens_buffer[:batch_size],
            self.max_total_draft_tokens,
        )


def draft_loop(worker, batch_size: int, num_contexts: int, gen: torch.Generator, sharp: float = 3.0):
    """The worker's ``_forward_draft_loop`` bookkeeping on random draft logits; returns the final resampling."""
    attn = SimpleNamespace(num_contexts=num_contexts)
    tokens, scores = worker.sample(torch.randn(batch_size, V, generator=gen) * sharp, worker.K)
    previous = worker.update_draft_tokens_and_scores(0, tokens, scores, None, batch_size, attn)
    for layer in range(1, worker.max_draft_len):
        logits = torch.randn(batch_size * worker.K, V, generator=gen) * sharp
        tokens, scores = worker.sample(logits, worker.K)
        shape = (batch_size, worker.K, worker.K)
        previous = worker.update_draft_tokens_and_scores(
            layer, tokens.reshape(shape), scores.reshape(shape), previous, batch_size, attn
        )
    return worker.resampling_final_draft_tokens(batch_size)


CFG = SageConfig(k=4, w_min=1, w_max=4, d_min=1, d_max=3, d_cap=3, n_max=6, first_round_static=False)


@pytest.fixture
def worker_cls():
    class Worker(FakeDynamicTreeWorker):  # a fresh class per test: the patch is a class-attribute patch
        sample = FakeDynamicTreeWorker.sample
        update_draft_tokens_and_scores = FakeDynamicTreeWorker.update_draft_tokens_and_scores
        resampling_final_draft_tokens = FakeDynamicTreeWorker.resampling_final_draft_tokens

    yield Worker
    uninstall_dynamic_tree_policy(Worker)


def test_install_patches_two_methods_once_and_uninstall_restores(worker_cls):
    original = {n: worker_cls.__dict__[n] for n in dynamic_tree.PATCHED}
    install_dynamic_tree_policy(CFG, worker_cls)
    install_dynamic_tree_policy(CFG.replace(theta0=0.2), worker_cls)  # guarded: updates the config only
    assert worker_cls._sage_originals == original and worker_cls._sage_config.algorithm.theta0 == 0.2
    assert worker_cls.sample is FakeDynamicTreeWorker.sample
    uninstall_dynamic_tree_policy(worker_cls)
    assert {n: worker_cls.__dict__[n] for n in dynamic_tree.PATCHED} == original


def test_install_checks_the_contract_and_the_tier(worker_cls):
    with pytest.raises(ConfigError, match=r"^alpha_source: TensorRT-LLM dynamic tree honours only"):
        install_dynamic_tree_policy(CFG.replace(alpha_source="path_mean"), worker_cls)

    class Drifted(worker_cls):
        def resampling_final_draft_tokens(self, batch_size, num_contexts=0): ...

    with pytest.raises(ContractMismatchError, match="resampling_final_draft_tokens"):
        install_dynamic_tree_policy(CFG, Drifted)


def _reference(worker, ref: SlotState, bs: int, ctx: int, accept: torch.Tensor, total: int, cfg=CFG) -> torch.Tensor:
    """What SAGE should choose: the core's SlotState and select_shaped on the worker's history (ctx rows: top-M)."""
    slots = worker.spec_tree_manager.slot_storage.all_ids_buf[:bs]
    if ctx < bs:
        ref.observe(slots[ctx:], accept[ctx:bs].long())
    if ctx:
        ref.reset(slots[:ctx])
    shape = ref.plan(slots, worker.history_score_buffer[:bs, : worker.K])
    cands = eagle_beam_candidates(
        worker.history_score_buffer[:bs], worker.history_draft_tokens_parent_buffer[:bs], worker.K
    )
    index = select_shaped(cands, shape.depth, shape.width, total, cfg.algorithm).index
    top = torch.sort(torch.topk(worker.history_score_buffer[:bs], total).indices).values
    return torch.cat([top[:ctx], index[ctx:]])


@pytest.mark.parametrize("pool", ["beam", "children", "kept"])
def test_selected_nodes_are_select_shaped_and_shapes_are_fixed(worker_cls, pool):
    cfg = CFG.replace(rerank_pool=pool)
    install_dynamic_tree_policy(cfg, worker_cls)
    k, depth, total, bs = 4, 3, 6, 5
    worker, plain = worker_cls(k, depth, total, 8, 6), FakeDynamicTreeWorker(k, depth, total, 8, 6)
    ref = SlotState(cfg.algorithm, 7)
    gen = torch.Generator().manual_seed(0)
    differs = 0
    for step, (ctx, slots) in enumerate([(2, [0, 3, 1, 2, 6]), (0, [0, 3, 1, 2, 6]), (1, [4, 3, 1, 2, 6])]):
        worker.spec_tree_manager.slot_storage.all_ids_buf[:bs] = torch.tensor(slots)
        accept = torch.randint(1, depth + 2, (8,), generator=gen, dtype=torch.int32)
        worker._num_accepted_tokens_buf.copy_(accept)
        seed = int(torch.randint(0, 1 << 30, (1,), generator=gen))
        tokens, index = draft_loop(worker, bs, ctx, torch.Generator().manual_seed(seed))
        plain_tokens, plain_index = draft_loop(plain, bs, ctx, torch.Generator().manual_seed(seed))
        assert torch.equal(index, _reference(worker, ref, bs, ctx, accept, total, cfg)), step
        assert torch.equal(tokens, worker.history_draft_tokens_buffer[:bs].gather(1, index))
        assert tokens.shape == plain_tokens.shape == (bs, total) and tokens.dtype == plain_tokens.dtype
        assert index.shape == plain_index.shape and index.dtype == plain_index.dtype
        assert torch.equal(index[:ctx], plain_index[:ctx])  # context rows keep the worker's own choice
        differs += int(not torch.equal(index, plain_index))
        assert torch.equal(ref.history.window, worker._sage_policy.slots.history.window)
    if pool == "beam":  # the beam pooled: the most probable paths, the worker's own top-M
        assert not differs
    else:
        assert differs, "SAGE's choice should differ from the plain top-M somewhere"


def test_before_the_tree_manager_exists_the_worker_runs_unchanged(worker_cls):
    install_dynamic_tree_policy(CFG, worker_cls)
    worker, plain = worker_cls(4, 3, 6, 4, 4), FakeDynamicTreeWorker(4, 3, 6, 4, 4)
    worker.spec_tree_manager = None
    out = draft_loop(worker, 3, 0, torch.Generator().manual_seed(5))
    ref = draft_loop(plain, 3, 0, torch.Generator().manual_seed(5))
    assert all(torch.equal(a, b) for a, b in zip(out, ref)) and "_sage_policy" not in worker.__dict__


@contextlib.contextmanager
def no_host_sync():
    """Any device -> host read of a tensor value raises (what a captured CUDA graph cannot contain)."""
    names = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def refuse(*_, **__):
        raise AssertionError("host sync in the per-step path")

    try:
        for n in names:
            setattr(torch.Tensor, n, refuse)
        yield
    finally:
        for n, fn in saved.items():
            setattr(torch.Tensor, n, fn)


def test_per_step_path_is_sync_free(worker_cls):
    install_dynamic_tree_policy(CFG, worker_cls)
    worker = worker_cls(4, 3, 6, 4, 4)
    worker.spec_tree_manager.slot_storage.all_ids_buf[:3] = torch.tensor([2, 0, 1])
    draft_loop(worker, 3, 1, torch.Generator().manual_seed(1))  # first step creates the policy's buffers
    gen = torch.Generator().manual_seed(2)
    with no_host_sync():
        draft_loop(worker, 3, 0, gen)
        draft_loop(worker, 3, 2, gen)
    source = Path(dynamic_tree.__file__).read_text()
    calls = [
        n.func.attr
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    ]
    assert not {"item", "tolist", "cpu", "numpy"} & set(calls)


def test_policy_reads_only_recorded_worker_attributes():
    functions = [n for n in ast.parse(Path(dynamic_tree.__file__).read_text()).body if isinstance(n, ast.FunctionDef)]
    read = {  # the module functions that run on the worker (the patched methods and _policy)
        n.attr
        for f in functions
        for n in ast.walk(f)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ("self", "worker")
    }
    assert read - {"__dict__", "_sage_policy"} <= TREE_WORKER_READ, read - TREE_WORKER_READ
    fake = FakeDynamicTreeWorker(2, 2, 3, 1, 1)
    assert all(hasattr(fake, name) for name in TREE_WORKER_READ)
