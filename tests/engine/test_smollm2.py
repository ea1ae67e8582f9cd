"""Losslessness on the real SmolLM2-135M-Instruct target (converted once from the bundled GGUF).

Two drafts bracket the behaviour: the target itself (a perfect draft: every round accepts a full
path, which exercises deep KV commits) and the 4-layer stand-in (mostly rejected at the root).
"""

from __future__ import annotations

import pytest
import torch

from sage_plugin.config import AlgorithmConfig
from sage_plugin.core.policies import build_policy
from sage_plugin.data.prompts import mixed_text_prompts, render_chat
from sage_plugin.engines.lm import GenRequest, TextModel, load_causal_lm
from sage_plugin.engines.speculative import SamplingParams, SpecEngine
from sage_plugin.models import ensure_smollm2, load_tokenizer, truncated_draft

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup():
    target_dir = ensure_smollm2()
    tok = load_tokenizer(target_dir)
    target = TextModel(load_causal_lm(target_dir))
    reqs = [GenRequest(render_chat(tok, p), request_id=p.id) for p in mixed_text_prompts(20)]
    return target_dir, tok, target, reqs


def test_plain_decoding_matches_hf_generate(setup):
    _, tok, target, reqs = setup
    engine = SpecEngine(target)
    outs = engine.generate(reqs[:3], SamplingParams(max_new_tokens=24, stop_token_ids=(tok.eos_token_id,)), None)
    for req, out in zip(reqs[:3], outs):
        ids = torch.tensor([req.prompt_ids])
        hf = target.model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=tok.eos_token_id)
        assert out.tokens == hf[0, ids.shape[1] :].tolist()


def test_every_policy_lossless_batch4_perfect_draft(setup):
    _, tok, target, reqs = setup
    reqs = reqs[:8]
    engine = SpecEngine(target, TextModel(target.model))
    sp = SamplingParams(max_new_tokens=24, stop_token_ids=(tok.eos_token_id,))
    ref = {o.request_id: o.tokens for o in engine.generate(reqs, sp, None)}
    for policy in ("sage", "eagle2", "static", "chain"):
        outs = []
        for i in range(0, len(reqs), 4):
            # fixed budget: the perfect draft costs a whole target step, so node_budget="auto" would not draft
            cfg = AlgorithmConfig(policy=policy, node_budget="fixed")
            outs += engine.generate(reqs[i : i + 4], sp, build_policy(cfg))
        assert {o.request_id: o.tokens for o in outs} == ref, policy
        taus = [r.tau for o in outs for r in o.rounds]
        assert sum(taus) / len(taus) > 2.5, f"{policy}: a perfect draft must be accepted deeply"


def test_sage_and_static_lossless_batch1_standin_draft(setup):
    target_dir, tok, target, reqs = setup
    engine = SpecEngine(target, TextModel(load_causal_lm(truncated_draft(target_dir, 4))))
    sp = SamplingParams(max_new_tokens=24, stop_token_ids=(tok.eos_token_id,))
    subset = reqs[:6]
    ref = {o.request_id: o.tokens for o in engine.generate(subset, sp, None)}
    for policy in ("sage", "static"):
        for req in subset:
            out = engine.generate([req], sp, build_policy(AlgorithmConfig(policy=policy)))[0]
            assert out.tokens == ref[out.request_id], (policy, req.request_id)


def test_bundled_draft_is_a_plain_hf_llama_and_is_lossless_and_accepted(setup):
    """The shipped draft: plain full-vocabulary HF Llama under 32 MB with a model card; lossless; accepted."""
    import json

    from sage_plugin.models import bundled_draft_dir, draft_head_ids

    _, tok, target, reqs = setup
    draft_dir = bundled_draft_dir()
    assert draft_dir is not None, "demo/sage_plugin_demo/drafts/smollm2-draft is missing"
    assert (draft_dir / "model.safetensors").stat().st_size <= 32 * 1024 * 1024
    assert "## Measured" in (draft_dir / "README.md").read_text()
    cfg = json.loads((draft_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["vocab_size"] == target.vocab_size
    head = draft_head_ids(draft_dir)
    model = load_causal_lm(draft_dir)
    engine = SpecEngine(target, TextModel(model, head))
    sp = SamplingParams(max_new_tokens=32, stop_token_ids=(tok.eos_token_id,))
    subset = reqs[:4]
    ref = {o.request_id: o.tokens for o in engine.generate(subset, sp, None)}
    outs = engine.generate(subset, sp, build_policy(AlgorithmConfig(policy="chain")))
    assert {o.request_id: o.tokens for o in outs} == ref
    tokens = sum(len(o.tokens) - 1 for o in outs)
    rounds = sum(len(o.rounds) for o in outs)
    assert tokens / rounds > 1.2, "the trained draft must be accepted well above the stand-in (about 1.05)"
