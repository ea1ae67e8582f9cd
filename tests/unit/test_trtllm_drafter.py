"""SAGE's TensorRT-LLM drafter without TensorRT-LLM: the chain it writes, the history it feeds, the slots it resets,
the draft KV it rolls back, and the ``Drafter`` subclass on each recorded base (1.2.0rc2, 1.2.x, main)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch

from sage_plugin.config import SageConfig
from sage_plugin.core.shape import plan_shape
from sage_plugin.runtimes.trtllm.drafter import DrafterSpec, SageChainDrafter, build_trtllm_drafter
from sage_plugin.runtimes.trtllm.runner import HFDraftRunner, common_prefix

from .test_trtllm_contract import DrafterEarly, DrafterLate, DrafterMain

V = 12


class TableRunner:
    """Synthetic draft: next-token logits depend on the last token only; records what it was fed."""

    def __init__(self, sharp: bool = True) -> None:
        g = torch.Generator().manual_seed(0)
        self.table = torch.randn(V, V, generator=g) * (8.0 if sharp else 0.01)
        self.vocab_size = V
        self.fed: dict = {}
        self.released: list = []

    def catch_up(self, key, tokens):
        self.fed[key] = list(tokens)
        return self.table[tokens[-1]]

    def extend(self, key, token):
        self.fed[key].append(token)
        return self.table[token]

    def release(self, key):
        self.released.append(key)


def request(rid: int, slot: int, tokens: list[int], allocated: int = 6, **extra) -> SimpleNamespace:
    req = SimpleNamespace(
        py_request_id=rid, request_id=rid, py_seq_slot=slot, py_draft_pages_allocated=allocated,
        py_draft_tokens=[0] * allocated, py_num_accepted_draft_tokens=0, py_disable_speculative_decoding=False,
        py_draft_logits=None, py_draft_use_greedy_sampling=False, is_dummy=False, _tokens=list(tokens),
    )  # fmt: skip
    req.get_tokens = lambda beam: list(req._tokens)
    req.__dict__.update(extra)
    return req


def batch(*gen) -> SimpleNamespace:
    return SimpleNamespace(context_requests=[], generation_requests=list(gen))


CFG = SageConfig(k=4, w_min=1, w_max=4, d_min=2, d_max=4, d_cap=6, alpha_source="fresh")


def test_chain_length_is_eq10_capped_by_n_max_and_allocation():
    runner = TableRunner()
    drafter = SageChainDrafter(CFG, runner, 6, num_slots=4)
    reqs = [request(0, 0, [1, 2]), request(1, 1, [3], allocated=2), request(2, 2, [5, 7])]
    drafter.prepare_draft_tokens(batch(*reqs))
    for req, rnd in zip(reqs, drafter.rounds):
        probs = torch.softmax(runner.table[req._tokens[-1]], -1).topk(CFG.algorithm.k).values
        from sage_plugin.core.entropy import topk_confidence

        alpha = topk_confidence(probs.log()[None], CFG.algorithm.k)
        depth, _ = plan_shape(CFG.algorithm, alpha, torch.tensor([CFG.algorithm.d_max]))
        assert rnd.depth == int(depth) and rnd.alpha == pytest.approx(float(alpha))
        assert len(req.py_draft_tokens) == rnd.drafted == min(int(depth), req.py_draft_pages_allocated)
        chain = [int(runner.table[req._tokens[-1]].argmax())]
        while len(chain) < rnd.drafted:
            chain.append(int(runner.table[chain[-1]].argmax()))
        assert req.py_draft_tokens == chain
        assert req.py_draft_logits.shape == (rnd.drafted, V) and req.py_draft_use_greedy_sampling


def test_n_max_caps_the_chain():
    drafter = SageChainDrafter(CFG.replace(n_max=1), TableRunner(), 6, num_slots=1)
    req = request(0, 0, [1])
    drafter.prepare_draft_tokens(batch(req))
    assert len(req.py_draft_tokens) == 1


def test_dummies_and_requests_without_draft_slots_are_left_alone():
    drafter = SageChainDrafter(CFG, TableRunner(), 6, num_slots=4)
    dummy = request(0, 0, [1], is_dummy=True)
    off = request(1, 1, [1], py_disable_speculative_decoding=True)
    empty = request(2, 2, [1], allocated=0)
    cuda_graph = request(3, 3, [1], is_dummy=False, is_cuda_graph_dummy=True)
    drafter.prepare_draft_tokens(batch(dummy, off, empty, cuda_graph))
    assert dummy.py_draft_tokens == [0] * 6 and off.py_draft_tokens == [0] * 6 and empty.py_draft_tokens == []
    assert cuda_graph.py_draft_tokens == [0] * 6 and not drafter.rounds


def test_acceptance_feeds_the_slot_history_and_is_capped_by_the_real_drafts():
    drafter = SageChainDrafter(CFG, TableRunner(), 6, num_slots=2)
    req = request(7, 1, [1, 2])
    drafter.prepare_draft_tokens(batch(req))
    drafted = len(req.py_draft_tokens)
    req.py_num_accepted_draft_tokens = drafted + 3  # zero padding "accepted" too (the target emitted token 0)
    req._tokens += [4, 5]
    drafter.prepare_draft_tokens(batch(req))
    history = drafter.sage_slots.history
    assert int(history.seen[1]) == 1 and float(history.window[1, -1]) == drafted  # tau in drafts
    assert int(history.seen[0]) == 0
    drafter.prepare_draft_tokens(batch(request(7, 1, [1, 2, 4, 5, 6], allocated=0)))  # no draft: nothing pending
    req.py_num_accepted_draft_tokens = 0
    drafter.prepare_draft_tokens(batch(req))
    assert int(history.seen[1]) == 2


def test_a_new_request_on_a_reused_slot_resets_it_and_frees_the_old_draft_state():
    runner = TableRunner()
    drafter = SageChainDrafter(CFG, runner, 6, num_slots=1)
    first = request(1, 0, [1])
    drafter.prepare_draft_tokens(batch(first))
    first.py_num_accepted_draft_tokens = 1
    drafter.prepare_draft_tokens(batch(first))
    assert int(drafter.sage_slots.history.seen[0]) == 1
    drafter.prepare_draft_tokens(batch(request(2, 0, [3])))
    assert runner.released == [1] and int(drafter.sage_slots.history.seen[0]) == 0


def test_slot_outside_the_state_is_an_error():
    drafter = SageChainDrafter(CFG, TableRunner(), 6, num_slots=2)
    with pytest.raises(ValueError, match="py_seq_slot 2 outside the drafter's 2 slots"):
        drafter.prepare_draft_tokens(batch(request(0, 2, [1])))


def test_the_draft_kv_is_rolled_back_to_the_accepted_prefix():
    """HF runner on a tiny random Llama: after a rejection the cache holds exactly the request's tokens, and the
    next-token logits equal a fresh forward over the whole sequence."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    model = LlamaForCausalLM(cfg).eval()
    runner = HFDraftRunner(model)
    prompt = [1, 2, 3]
    runner.catch_up("r", prompt)
    runner.extend("r", 4)
    runner.extend("r", 5)  # drafted 4, 5, (6); the target accepts 4 and emits 9
    logits = runner.catch_up("r", [*prompt, 4, 9])
    assert runner.cached_ids("r") == [1, 2, 3, 4, 9]
    with torch.inference_mode():
        fresh = model(torch.tensor([[1, 2, 3, 4, 9]])).logits[0, -1]
    torch.testing.assert_close(logits, fresh, rtol=1e-4, atol=1e-4)
    runner.catch_up("r", [*prompt, 4, 9])  # nothing new: the last token is recomputed
    assert runner.cached_ids("r") == [1, 2, 3, 4, 9]
    runner.catch_up("r", [7, 7])  # nothing in common
    assert runner.cached_ids("r") == [7, 7]
    assert common_prefix([1, 2], [1, 2, 3], hint=1) == 2 and common_prefix([1, 2], [5, 2], hint=2) == 0


@pytest.mark.parametrize("base", [DrafterEarly, DrafterLate, DrafterMain], ids=["1.2-early", "1.2-late", "main"])
def test_subclass_calls_the_base_init_with_the_keywords_it_accepts(base):
    spec = DrafterSpec(sage=CFG.to_dict(), draft_model="unused", max_draft_len=6, num_slots=2, max_concurrency=3)
    drafter = build_trtllm_drafter(spec, base, runner=TableRunner())
    assert isinstance(drafter, base) and drafter.max_draft_len == 6 and drafter.max_concurrency == 3
    if base is not DrafterEarly:
        assert drafter._static_max_total_draft_tokens == 6 and drafter.draft_len_schedule is None
    req = request(0, 0, [1, 2])
    drafter.prepare_draft_tokens(batch(req), None)
    real = len(req.py_draft_tokens)
    drafter.pad_draft_tokens_for_cuda_graph(batch(req))  # the base's own (final) pad
    assert len(req.py_draft_tokens) == 6 and req.py_draft_tokens[real:] == [0] * (6 - real)


def test_the_drafter_pickles_to_its_spec():
    """TensorRT-LLM may ship the drafter to its executor process: it travels as its spec (the model loads there)."""
    spec = DrafterSpec(sage=CFG.to_dict(), draft_model="some/draft", max_draft_len=6, num_slots=2)
    drafter = build_trtllm_drafter(spec, DrafterLate, runner=TableRunner())
    copy = pickle.loads(pickle.dumps(drafter))
    assert type(copy) is type(drafter) and copy._spec == spec and copy._runner is None
    assert copy.sage_cfg == CFG
