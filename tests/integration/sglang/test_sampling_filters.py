"""SAGE's tree sampling on SGLang 0.5.23 filters the target's distributions exactly as SGLang's plain sampler does.

SGLang's speculative verify (``eagle_utils.eagle_sample``) runs ``top_k_renorm_prob`` then ``top_p_renorm_prob`` on the
softmax (top-p of the top-k-renormalised distribution), then its tree sampling kernel; its plain CPU sampler
(``sampler.top_k_top_p_min_p_sampling_from_probs_torch``) takes both filters on the softmax and keeps the
intersection, and min-p after them.  Each case below is one request's distribution; the support and probabilities
the tree kernel receives inside a SAGE verify (``penalties.eagle_sample`` around the verify's own filter calls, the CPU
kernels installed) are compared with the plain sampler's filtered distribution, ties at the top-p boundary included.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch  # noqa: E402

from sage_plugin.runtimes.sglang import penalties  # noqa: E402
from sage_plugin.runtimes.sglang.cpu_ops import sampling_ops  # noqa: E402

ALL = 1 << 30  # SGLang's top_k for "no top-k"
#: one request's logits, and its softmax as both samplers compute it (float32)
LOGITS = torch.tensor([0.375, 0.25, 0.1875, 0.125, 0.0625]).log()
PROBS = torch.softmax(LOGITS, -1)
#: the mass of the first i most probable tokens, summed as both samplers sum it: a top_p of MASS[i] is a tie (the
#: mass before token i + 1 equals top_p exactly)
MASS = [float(m) for m in PROBS.sort(descending=True).values.cumsum(-1)]
#: (top_k, top_p, min_p) of one request
CASES = {
    "top-p, tie at the boundary": (ALL, MASS[2], 0.0),
    "top-p": (ALL, 0.7, 0.0),
    "top-k": (2, 1.0, 0.0),
    "top-k and top-p": (2, 0.5, 0.0),
    "top-k and top-p, tie": (3, MASS[1], 0.0),
    "min-p": (ALL, 1.0, 0.5),
    "top-k, top-p and min-p": (4, 0.6, 0.6),
}


def plain_distribution(probs: torch.Tensor, top_ks, top_ps, min_ps) -> torch.Tensor:
    """SGLang's plain CPU sampler's filtered distribution of each row (``[R, V]``), renormalised."""
    _, kept, order, _ = top_k_top_p_min_p_sampling_from_probs_torch(
        probs.clone(), top_ks, top_ps, min_ps, bool((min_ps > 0).any()), None, None, return_filtered_probs=True
    )
    out = torch.zeros_like(probs).scatter(1, order.long(), kept)
    return out / out.sum(-1, keepdim=True)


def sglang_verify_filters(module, verify_input, batch, logits_output, grammar_mask=None):
    """A stand-in for ``eagle_utils.eagle_sample``'s sampling branch: softmax, its two filter calls (each only when the
    batch needs it), then the tree sampling kernel, all looked up in ``eagle_utils`` as SGLang's verify does."""
    info, n = batch.sampling_info, verify_input.draft_token_num
    probs = torch.softmax(logits_output.next_token_logits, -1)
    if info.need_top_k_sampling:
        probs = module.top_k_renorm_prob(probs, torch.repeat_interleave(info.top_ks, n, dim=0))
    if info.need_top_p_sampling:
        probs = module.top_p_renorm_prob(probs, torch.repeat_interleave(info.top_ps, n, dim=0))
    module.tree_speculative_sampling_target_only(target_probs=probs.reshape(len(batch.seq_lens), n, -1))
    return None, None, None


def _batch(top_ks, top_ps, min_ps):
    info = SimpleNamespace(
        is_all_greedy=False, top_ks=top_ks, top_ps=top_ps, min_ps=min_ps,
        need_top_k_sampling=bool((top_ks != ALL).any()), need_top_p_sampling=bool((top_ps != 1.0).any()),
        need_min_p_sampling=bool((min_ps > 0).any()), has_custom_logit_processor=False,
        acc_additive_penalties=None, acc_scaling_penalties=None, logit_bias=None,
    )  # fmt: skip
    return SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False), sampling_info=info,
                           seq_lens=torch.ones(len(top_ks)), req_pool_indices=torch.arange(len(top_ks)))  # fmt: skip


def tree_kernel_input(logits: torch.Tensor, top_ks, top_ps, min_ps, sage: bool) -> torch.Tensor:
    """The target distributions the tree sampling kernel receives for ``logits`` (``[R, V]``, one node a request):
    inside a SAGE verify (``sage``) or SGLang's own."""
    module = importlib.import_module(sampling_ops.EAGLE_UTILS)
    sampling_ops.cpu_sampling_kernels_in_place()
    seen = []
    kernel = module.tree_speculative_sampling_target_only
    module.tree_speculative_sampling_target_only = lambda **kw: seen.append(kw["target_probs"])
    batch = _batch(top_ks, top_ps, min_ps)
    verify_input = SimpleNamespace(draft_token_num=1)
    logits_output = SimpleNamespace(next_token_logits=logits)
    token = penalties.ACTIVE_VERIFY.set(penalties.VerifyContext(tail=None)) if sage else None
    try:
        original = lambda *a, **kw: sglang_verify_filters(module, *a, **kw)  # noqa: E731
        penalties.eagle_sample(original, verify_input, batch, logits_output)
    finally:
        module.tree_speculative_sampling_target_only = kernel
        if token is not None:
            penalties.ACTIVE_VERIFY.reset(token)
    return seen[0].reshape(logits.shape)


def _params(cases):
    ks, ps, ms = zip(*cases)
    return torch.tensor(ks), torch.tensor(ps, dtype=torch.float32), torch.tensor(ms, dtype=torch.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_sage_tree_sampling_follows_the_plain_sampler(case, monkeypatch):
    """One request: the tree kernel's distribution equals the plain sampler's, support and probabilities."""
    monkeypatch.setattr(penalties, "sampling_backend", lambda: "pytorch")
    params = _params([CASES[case]])
    got = tree_kernel_input(LOGITS[None], *params, sage=True)
    want = plain_distribution(PROBS[None], *params)
    assert (got > 0).tolist() == (want > 0).tolist()
    torch.testing.assert_close(got, want)


def test_one_batch_of_every_case_follows_the_plain_sampler(monkeypatch):
    """The batch-wide ``need_*`` flags: requests without a filter ride along with requests that have it."""
    monkeypatch.setattr(penalties, "sampling_backend", lambda: "pytorch")
    params = _params(list(CASES.values()))
    got = tree_kernel_input(LOGITS.expand(len(CASES), -1), *params, sage=True)
    torch.testing.assert_close(got, plain_distribution(PROBS.expand(len(CASES), -1), *params))


def test_sglang_own_verify_filters_top_p_after_renormalising_top_k():
    """What the hook corrects: SGLang's own speculative verify keeps only the first token where plain sampling keeps
    two (top-k 2 holds 0.625 of the mass; the nucleus of 0.5 of the renormalised [0.6, 0.4] is the first token)."""
    params = _params([CASES["top-k and top-p"]])
    own = tree_kernel_input(LOGITS[None], *params, sage=False)
    plain = plain_distribution(PROBS[None], *params)
    assert (own > 0).tolist() == [[True, False, False, False, False]]
    assert (plain > 0).tolist() == [[True, True, False, False, False]]


def test_fused_gpu_sampler_under_min_p_is_followed_as_it_filters(monkeypatch):
    """SGLang's flashinfer sampler renormalises top-k before top-p when the batch needs min-p (``sampler.py``), so the
    verify keeps its own order there; without min-p that sampler filters jointly, and so does the verify."""
    monkeypatch.setattr(penalties, "sampling_backend", lambda: "flashinfer")
    params = _params([(2, 0.5, 0.1)])
    own = tree_kernel_input(LOGITS[None], *params, sage=False)
    torch.testing.assert_close(tree_kernel_input(LOGITS[None], *params, sage=True), own)
    params = _params([(2, 0.5, 0.0)])
    assert (tree_kernel_input(LOGITS[None], *params, sage=True) > 0).tolist() == [[True, True, False, False, False]]
