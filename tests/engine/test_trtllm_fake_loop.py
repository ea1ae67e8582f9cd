"""SAGE's TensorRT-LLM drafter driven end to end by a faithful fake of TensorRT-LLM's speculative executor step.

The fake follows the non-overlap executor loop and TorchSampler as recorded in
``sage_plugin/runtimes/trtllm/contract.py`` (``CALL_ORDER``; ``docs/design/trtllm.md``, "Executor loop"): generation
requests get ``py_last_draft_tokens = py_draft_tokens``, ``py_draft_tokens = [0] * K`` and
``py_draft_pages_allocated = K``; ``prepare_draft_tokens``; zero padding to ``K``; one target forward over the
``1 + K`` tokens; greedy acceptance walking the padded list (or rejection sampling with ``py_draft_logits``);
accepted + bonus tokens appended; ``py_num_accepted_draft_tokens``; ``py_rewind_len = K - accepted`` and the target's
KV cache rewound by it; completion at ``max_new_tokens`` or EOS.  A CUDA-graph dummy rides along in every batch.

The slow tests run it with the real SmolLM2 target and the bundled draft on CPU (greedy output equals plain greedy
decoding token for token; draft lengths follow alpha, Eq. 10); the fast one checks the lossless sampling path on a
synthetic Markov target and draft (the output law equals the target's).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from sage_plugin.config import SageConfig
from sage_plugin.runtimes.trtllm.contract import REQUEST_FIELDS_READ, REQUEST_FIELDS_WRITTEN
from sage_plugin.runtimes.trtllm.drafter import SageChainDrafter

REPO = Path(__file__).resolve().parents[2]
CONTEXT_INIT, GENERATION_IN_PROGRESS, GENERATION_COMPLETE = "CONTEXT_INIT", "GENERATION_IN_PROGRESS", "COMPLETE"


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Small forwards: a second intra-op thread only waits for a busy core (2-core CI, seconds per forward)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class FakeLlmRequest:
    """The ``LlmRequest`` members the executor, the sampler and the drafter use (py_* as set in ``__init__``)."""

    def __init__(self, request_id: int, prompt: list[int], max_new_tokens: int, end_id: int, seq_slot: int) -> None:
        self.py_request_id = self.request_id = request_id
        self.py_seq_slot = seq_slot
        self.py_end_id, self.py_max_new_tokens, self.py_prompt_len = end_id, max_new_tokens, len(prompt)
        self.state = CONTEXT_INIT
        self.draft_tokens: list[int] = []  # the binding's scheduler budget
        self.py_draft_tokens: list[int] = []
        self.py_last_draft_tokens = None
        self.py_draft_logits = None
        self.py_draft_pages_allocated = 0
        self.py_rewind_len = 0
        self.py_num_accepted_draft_tokens = 0
        self.py_disable_speculative_decoding = False
        self.py_draft_use_greedy_sampling = False
        self.is_attention_dp_dummy = self.is_cuda_graph_dummy = False
        self._tokens = list(prompt)

    @property
    def is_dummy(self) -> bool:
        return self.is_attention_dp_dummy or self.is_cuda_graph_dummy

    def get_tokens(self, beam: int) -> list[int]:
        return list(self._tokens)  # the binding returns a copy

    def get_num_tokens(self, beam: int) -> int:
        return len(self._tokens)

    def add_new_token(self, token: int, beam: int) -> None:
        self._tokens.append(int(token))

    def generated(self) -> list[int]:
        return self._tokens[self.py_prompt_len :]


class FakeScheduledRequests:
    """``ScheduledRequests`` as on main: ``context_requests`` is a read-only property."""

    def __init__(self, context: list, generation: list) -> None:
        self.context_requests_chunking: list = []
        self.context_requests_last_chunk = context
        self.generation_requests = generation
        self.paused_requests: list = []

    @property
    def context_requests(self) -> list:
        return self.context_requests_chunking + self.context_requests_last_chunk

    def all_requests(self) -> list:
        return self.context_requests + self.generation_requests

    @property
    def batch_size(self) -> int:
        return len(self.context_requests) + len(self.generation_requests)


class HFTarget:
    """The target model with one KV cache per request (the executor's KV cache manager, rewound by py_rewind_len)."""

    def __init__(self, model) -> None:
        from transformers import DynamicCache

        self.model, self.new_cache, self.caches = model, DynamicCache, {}

    @torch.inference_mode()
    def forward(self, rid: int, tokens: list[int], last_only: bool = False) -> torch.Tensor:
        cache = self.caches.setdefault(rid, self.new_cache())
        start = cache.get_seq_length()
        pos = torch.arange(start, start + len(tokens))[None]
        keep = 1 if last_only else 0  # 0: every position's logits
        out = self.model(
            input_ids=torch.tensor([tokens]),
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=keep,
        )
        self.caches[rid] = out.past_key_values
        return out.logits[0].float()

    def rewind(self, rid: int, n: int) -> None:
        if n > 0:
            self.caches[rid].crop(-n)

    def length(self, rid: int) -> int:
        return self.caches[rid].get_seq_length()


class FakeExecutor:
    """One TensorRT-LLM executor step at a time (``CALL_ORDER``), TorchSampler's greedy / rejection verification."""

    def __init__(self, target, drafter, k: int, max_batch: int, *, sample: bool = False, seed: int = 0) -> None:
        self.target, self.drafter, self.k, self.max_batch, self.sample = target, drafter, k, max_batch, sample
        self.gen = torch.Generator().manual_seed(seed)
        self.waiting: list[FakeLlmRequest] = []
        self.active: list[FakeLlmRequest] = []
        self.free_slots = list(range(max_batch))
        self.done: list[FakeLlmRequest] = []
        self.steps = 0

    def add(self, rid: int, prompt: list[int], max_new_tokens: int, end_id: int) -> None:
        self.waiting.append(FakeLlmRequest(rid, prompt, max_new_tokens, end_id, seq_slot=-1))

    def run(self) -> list[FakeLlmRequest]:
        while self.waiting or self.active:
            self.step()
        return self.done

    def step(self) -> None:
        while self.waiting and self.free_slots:  # activate new requests
            req = self.waiting.pop(0)
            req.py_seq_slot = self.free_slots.pop(0)
            self.active.append(req)
        context = [r for r in self.active if r.state == CONTEXT_INIT]
        generation = [r for r in self.active if r.state == GENERATION_IN_PROGRESS]
        dummy = FakeLlmRequest(-1, [0], 1, 0, seq_slot=None)
        dummy.is_cuda_graph_dummy, dummy.state = True, GENERATION_IN_PROGRESS
        batch = FakeScheduledRequests(context, [*generation, dummy])
        for req in batch.generation_requests:  # _prepare_draft_requests
            req.draft_tokens = [0] * self.k
            req.py_last_draft_tokens = req.py_draft_tokens
            req.py_draft_tokens, req.py_draft_pages_allocated = [0] * self.k, self.k
        self.drafter.prepare_draft_tokens(batch, None)
        for req in batch.generation_requests:  # pad_draft_tokens_for_cuda_graph
            assert len(req.py_draft_tokens) <= req.py_draft_pages_allocated, "drafter wrote more than allocated"
            req.py_draft_tokens.extend([0] * (self.k - len(req.py_draft_tokens)))
        for req in context:
            logits = self.target.forward(req.request_id, req.get_tokens(0), last_only=True)[-1:]
            self._append(req, self._choose(logits)[0])
            if req.state != GENERATION_COMPLETE:
                req.state = GENERATION_IN_PROGRESS
        for req in generation:
            logits = self.target.forward(req.request_id, [req.get_tokens(0)[-1], *req.py_draft_tokens])
            accepted = self._verify(req, logits)
            req.py_num_accepted_draft_tokens = accepted
            req.py_rewind_len = req.py_draft_pages_allocated - accepted
            self.target.rewind(req.request_id, req.py_rewind_len)  # update_resources
            if req.state != GENERATION_COMPLETE:
                assert self.target.length(req.request_id) == req.get_num_tokens(0) - 1
        for req in [r for r in self.active if r.state == GENERATION_COMPLETE]:
            self.active.remove(req)
            self.free_slots.append(req.py_seq_slot)
            self.done.append(req)
        self.steps += 1

    def _choose(self, logits: torch.Tensor) -> list[int]:
        if not self.sample:
            return logits.argmax(-1).tolist()
        return torch.multinomial(torch.softmax(logits, -1), 1, generator=self.gen)[:, 0].tolist()

    def _append(self, req: FakeLlmRequest, token: int) -> bool:
        req.add_new_token(token, 0)
        stop = token == req.py_end_id or len(req.generated()) >= req.py_max_new_tokens
        if stop:
            req.state = GENERATION_COMPLETE
        return stop

    def _verify(self, req: FakeLlmRequest, logits: torch.Tensor) -> int:
        if self.sample and req.py_draft_logits is not None:
            return self._verify_rejection(req, logits)
        target = self._choose(logits)  # TorchSampler greedy: walk the padded draft list
        accepted = 0
        if self._append(req, target[0]):
            return 0
        for draft in req.py_draft_tokens:
            if draft != target[accepted]:
                break
            accepted += 1
            if self._append(req, target[accepted]):
                break
        return accepted

    def _verify_rejection(self, req: FakeLlmRequest, logits: torch.Tensor) -> int:
        """Rejection sampling: draft probs one-hot when ``py_draft_use_greedy_sampling``, else the draft softmax."""
        q = req.py_draft_logits
        q = torch.nn.functional.one_hot(q.argmax(-1), q.shape[-1]).float() if req.py_draft_use_greedy_sampling else q
        q = q if req.py_draft_use_greedy_sampling else torch.softmax(q, -1)
        p = torch.softmax(logits, -1)
        for i in range(q.shape[0]):  # n = draft_probs.size(0): the padding is not tested
            d = req.py_draft_tokens[i]
            if torch.rand((), generator=self.gen) < min(1.0, float(p[i, d] / q[i, d])):
                if self._append(req, d):
                    return i + 1
                continue
            residual = (p[i] - q[i]).clamp(min=0)
            self._append(req, int(torch.multinomial(residual / residual.sum(), 1, generator=self.gen)))
            return i
        self._append(req, int(torch.multinomial(p[q.shape[0]], 1, generator=self.gen)))
        return q.shape[0]


def test_fake_request_has_the_recorded_fields():
    req = FakeLlmRequest(0, [1], 4, 2, 0)
    assert REQUEST_FIELDS_READ <= set(dir(req)) and REQUEST_FIELDS_WRITTEN <= set(dir(req))


class MarkovModel:
    """Synthetic model over ``V`` tokens: next-token logits depend on the last token only (target and draft)."""

    def __init__(self, logp: torch.Tensor) -> None:
        self.logp, self.vocab_size, self.seqs = logp, logp.shape[0], {}

    def forward(self, rid, tokens, last_only=False):  # target: logits after each fed token
        self.seqs.setdefault(rid, []).extend(tokens)
        return self.logp[torch.tensor(tokens)]

    def rewind(self, rid, n):
        del self.seqs[rid][len(self.seqs[rid]) - n :]

    def length(self, rid):
        return len(self.seqs[rid])

    def catch_up(self, key, tokens):  # draft runner
        return self.logp[tokens[-1]]

    def extend(self, key, token):
        return self.logp[token]

    def release(self, key):
        pass


def test_sampling_path_is_lossless_on_a_synthetic_markov_target():
    """Greedy chains with ``py_draft_logits`` and ``py_draft_use_greedy_sampling``: the sampled sequences follow the
    target's law exactly (chi-square over the joint of the first three generated tokens)."""
    from scipy.stats import chisquare

    v, n = 4, 3000
    g = torch.Generator().manual_seed(1)
    target_p, draft_p = (torch.rand(2, v, v, generator=g) + 0.2).unbind(0)
    target_p, draft_p = target_p / target_p.sum(-1, keepdim=True), draft_p / draft_p.sum(-1, keepdim=True)
    cfg = SageConfig(k=4, w_min=1, w_max=4, d_min=1, d_max=2, d_cap=3, alpha_source="fresh")
    drafter = SageChainDrafter(cfg, MarkovModel(draft_p.log()), 3, num_slots=n)
    executor = FakeExecutor(MarkovModel(target_p.log()), drafter, 3, n, sample=True, seed=2)
    for i in range(n):
        executor.add(i, [0], max_new_tokens=3, end_id=-1)
    done = executor.run()
    assert all(r.py_draft_logits is None or r.py_draft_logits.shape[1] == v for r in done)
    assert {len(r.py_draft_logits) for r in done if r.py_draft_logits is not None} - {1, 2, 3} == set()
    counts = torch.zeros(v, v, v)
    for r in done:
        a, b, c = r.generated()
        counts[a, b, c] += 1
    expected = target_p[0][:, None, None] * target_p[:, :, None] * target_p[None, :, :]
    result = chisquare(counts.flatten().numpy(), (expected.flatten() * n).numpy())
    assert result.pvalue > 1e-3, result


# -- the real SmolLM2 pair (slow) ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoModelForCausalLM

    from sage_plugin.data.prompts import mixed_text_prompts, render_chat
    from sage_plugin.models import bundled_draft_dir, ensure_smollm2, load_tokenizer
    from sage_plugin.runtimes.trtllm.config import load_launch
    from sage_plugin.runtimes.trtllm.runner import HFDraftRunner

    target_dir = ensure_smollm2()
    tok = load_tokenizer(target_dir)
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    launch = load_launch(REPO / "engine_configs" / "trtllm" / "smollm2_sage_drafter.yaml")
    prompts = [render_chat(tok, p) for p in mixed_text_prompts(6)]
    return model, tok.eos_token_id, launch, prompts, lambda: HFDraftRunner.load(bundled_draft_dir())


def _plain_greedy(model, prompt: list[int], max_new: int, eos: int) -> list[int]:
    target, out = HFTarget(model), []
    logits = target.forward(0, prompt, last_only=True)
    while True:
        out.append(int(logits[-1].argmax()))
        if out[-1] == eos or len(out) >= max_new:
            return out
        logits = target.forward(0, out[-1:])


@pytest.mark.slow
def test_greedy_output_equals_plain_decoding_and_draft_length_follows_alpha(smollm2):
    model, eos, launch, prompts, make_runner = smollm2
    max_new = 32
    runner = make_runner()
    drafter = SageChainDrafter(launch.sage, runner, launch.draft.max_draft_len, num_slots=4)
    catch_up = runner.catch_up

    def checked_catch_up(key, tokens):  # the draft KV holds exactly the request's tokens after catching up
        logits = catch_up(key, tokens)
        assert runner.cached_ids(key) == list(tokens)
        return logits

    runner.catch_up = checked_catch_up
    executor = FakeExecutor(HFTarget(model), drafter, launch.draft.max_draft_len, max_batch=4)  # 6 prompts: slot reuse
    for i, prompt in enumerate(prompts):
        executor.add(i, prompt, max_new, eos)
    done = {r.request_id: r.generated() for r in executor.run()}
    for i, prompt in enumerate(prompts):
        assert done[i] == _plain_greedy(model, prompt, max_new, eos), f"prompt {i}"

    cfg, k, rounds = launch.sage.algorithm, launch.draft.max_draft_len, list(drafter.rounds)
    assert len(rounds) > 10
    for r in rounds:  # Eq. 10 with the slot's history D_max, then min(D, n_max, K)
        x = cfg.d_min + r.alpha * (r.d_max - cfg.d_min)
        if abs(x - math.floor(x) - 0.5) > 1e-4:
            assert r.depth == max(1, math.floor(x + 0.5)), r
        assert r.drafted == min(r.depth, cfg.n_max, k)
    for a in rounds:  # higher alpha, same D_max -> never a shorter draft
        for b in rounds:
            if a.d_max == b.d_max and a.alpha > b.alpha + 1e-6:
                assert a.depth >= b.depth
    assert len({r.drafted for r in rounds}) >= 2, "alpha should vary the draft length"
    generated = sum(len(t) for t in done.values())
    assert generated / executor.steps > 1.3, "the bundled draft should be accepted"
