"""SAGE's reading and feeding of SGLang 0.5.23's penalizers (``runtimes/sglang/penalties.py``) against SGLang's own.

* :func:`advance_penalizers` feeding ``L`` tokens per request at once leaves every penalizer exactly as SGLang's
  ``cumulate_output_tokens`` called ``L`` times;
* with drafted paths, every node's logits penalised by the core (:func:`penalty_terms`, ``tree_penalties``) equal
  SGLang's orchestrator fed that node's path, in the order plain decoding applies them (the forward copy's summed
  additive penalties, then the scaling ones; ``orchestrator.apply`` without ``repeat`` follows the penalizer set's
  order instead, which no decode step uses).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.sampling import penaltylib  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from sage_plugin.core.penalties import path_tokens, tree_penalties  # noqa: E402
from sage_plugin.runtimes.sglang.penalties import advance_penalizers, penalty_terms  # noqa: E402

VOCAB = 32
PENALIZERS = {
    penaltylib.BatchedFrequencyPenalizer,
    penaltylib.BatchedMinNewTokensPenalizer,
    penaltylib.BatchedPresencePenalizer,
    penaltylib.BatchedRepetitionPenalizer,
}


class _Batch:
    """What the orchestrator reads of a ScheduleBatch (held by weak reference, so a class of its own)."""

    def __init__(self, reqs: list) -> None:
        self.reqs, self.device = reqs, "cpu"


def _orchestrator(params: list[dict]) -> penaltylib.BatchedPenalizerOrchestrator:
    tokenizer = SimpleNamespace(additional_stop_token_ids=None, eos_token_id=2)
    reqs = [
        SimpleNamespace(sampling_params=SamplingParams(**p), eos_token_ids={2}, tokenizer=tokenizer) for p in params
    ]
    batch = _Batch(reqs)
    orchestrator = penaltylib.BatchedPenalizerOrchestrator(VOCAB, batch, PENALIZERS)
    orchestrator._keep = batch  # the orchestrator holds its batch by weak reference
    return orchestrator


PARAMS = [
    {"frequency_penalty": 0.5, "presence_penalty": 0.25, "repetition_penalty": 1.5, "min_new_tokens": 4},
    {"frequency_penalty": 1.0, "min_new_tokens": 9},
    {"repetition_penalty": 1.25, "presence_penalty": -0.5},
]


def _state(orchestrator: penaltylib.BatchedPenalizerOrchestrator) -> dict[str, torch.Tensor]:
    return {f"{type(p).__name__}.{k}": v.clone() for p in orchestrator.penalizers.values() for k, v in vars(p).items()
            if isinstance(v, torch.Tensor)}  # fmt: skip


def test_feeding_several_tokens_at_once_equals_sglang_one_at_a_time():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 8, (len(PARAMS), 5), generator=gen)  # small range: repeats
    ours, theirs = _orchestrator(PARAMS), _orchestrator(PARAMS)
    advance_penalizers(ours, tokens, torch.full((len(PARAMS),), tokens.shape[1]))
    for j in range(tokens.shape[1]):
        theirs.cumulate_output_tokens(tokens[:, j])
    want = _state(theirs)
    assert want and _state(ours).keys() == want.keys()
    for name, value in _state(ours).items():
        assert torch.equal(value, want[name]), name


def test_the_feed_hook_gives_each_request_its_unfed_output_tokens():
    """Under SAGE the decode preparation feeds every output token a request's state has not seen (ragged across the
    batch, -1 padded): the same state as feeding each row's real tokens with their counts."""
    from sage_plugin.runtimes.sglang import penalties

    outputs = [[3, 4, 3, 5], [7], [2, 2, 6]]
    fed = [1, 1, 0]  # tokens each state has seen: rows of 3, 0 and 3 unfed tokens
    hooked, direct = _orchestrator(PARAMS), _orchestrator(PARAMS)
    for req, out, n in zip(hooked._keep.reqs, outputs, fed):
        req.output_ids = list(out)
        setattr(req, penalties.FED_ATTR, n)
    batch = SimpleNamespace(spec_algorithm=SimpleNamespace(name="SAGE"), reqs=hooked._keep.reqs, device="cpu",
                            sampling_info=SimpleNamespace(penalizer_orchestrator=hooked))  # fmt: skip
    penalties.cumulate_penalty_output_tokens(lambda self: pytest.fail("SGLang's one-token feed ran"), batch)
    unfed = torch.tensor([[4, 3, 5], [-1, -1, -1], [2, 2, 6]])
    advance_penalizers(direct, unfed, torch.tensor([3, 0, 3]))
    assert [getattr(r, penalties.FED_ATTR) for r in hooked._keep.reqs] == [len(o) for o in outputs]
    want = _state(direct)
    for name, value in _state(hooked).items():
        assert torch.equal(value, want[name]), name


def test_core_terms_penalise_as_sglang_and_each_node_as_its_path():
    gen = torch.Generator().manual_seed(1)
    history = torch.randint(0, 8, (len(PARAMS), 3), generator=gen)
    orchestrator = _orchestrator(PARAMS)
    for j in range(history.shape[1]):
        orchestrator.cumulate_output_tokens(history[:, j])
    # tree per request: root -> 1 -> 2, root -> 3 (parents before children)
    parent = torch.tensor([[-1, 0, 1, 0]] * len(PARAMS))
    drafted = torch.randint(0, 8, (len(PARAMS), 4), generator=gen)
    logits = torch.randn(len(PARAMS) * 4, VOCAB, generator=gen)
    got = logits.clone()
    additive, scaling = penalty_terms(orchestrator)
    tree_penalties(got, path_tokens(parent, drafted, 2), additive=additive, scaling=scaling)
    chains = {0: [], 1: [1], 2: [1, 2], 3: [3]}
    for node, chain in chains.items():
        fed = copy.deepcopy(orchestrator)
        fed._keep = orchestrator._keep
        fed._batch_ref = orchestrator._batch_ref
        for i in chain:
            fed.cumulate_output_tokens(drafted[:, i])
        want = logits[node::4].clone()
        fed.apply(want, repeat=1)  # additive terms, then scaling: the order of the sampler's forward copy
        assert torch.allclose(got[node::4], want, atol=1e-6, equal_nan=True), node


@pytest.mark.parametrize("min_p", [False, True])
def test_the_verify_hook_keeps_a_sampling_kernel_installed_during_its_call(min_p, monkeypatch):
    """A process's first sampling verify on CPU finds ``eagle_utils``' tree sampling kernel unset; whatever the hook
    wraps (min-p) it puts back, and a kernel installed meanwhile (here by the CPU kernels' installer) stays for the
    next verify."""
    import importlib

    from sage_plugin.runtimes.sglang import penalties
    from sage_plugin.runtimes.sglang.cpu_ops import sampling_ops

    module = importlib.import_module(sampling_ops.EAGLE_UTILS)
    for name in ("tree_speculative_sampling_target_only", "top_k_renorm_prob", "top_p_renorm_prob"):
        monkeypatch.setattr(module, name, None)
    monkeypatch.setattr(sampling_ops, "_cpu_kernels_ready", False)
    info = SimpleNamespace(is_all_greedy=False, need_min_p_sampling=min_p, min_ps=torch.full((1,), 0.1),
                           need_top_k_sampling=False, need_top_p_sampling=False,
                           has_custom_logit_processor=False, acc_additive_penalties=None,
                           acc_scaling_penalties=None, logit_bias=None)  # fmt: skip
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False), sampling_info=info,
                            seq_lens=torch.tensor([5]), req_pool_indices=torch.tensor([1]))  # fmt: skip
    verify_input = SimpleNamespace(draft_token_num=2, retrieve_next_token=torch.tensor([[1, -1]]))
    logits_output = SimpleNamespace(next_token_logits=torch.zeros(2, VOCAB))
    seen = []

    def original(verify_input, batch, logits_output, grammar_mask=None):
        seen.append(module.tree_speculative_sampling_target_only)  # what SGLang's verify calls
        return torch.zeros(2), torch.zeros(1), torch.zeros(2)

    token = penalties.ACTIVE_VERIFY.set(penalties.VerifyContext(tail=None))
    try:
        for _ in range(2):
            penalties.eagle_sample(original, verify_input, batch, logits_output)
    finally:
        penalties.ACTIVE_VERIFY.reset(token)
    kernel = sampling_ops.tree_speculative_sampling_target_only_cpu
    assert module.tree_speculative_sampling_target_only is kernel
    assert all(k is not None for k in seen) and (min_p or all(k is kernel for k in seen))
