"""VLM engine models: exact greedy match of speculative vs plain decoding, and plain vs HF ``generate``.

Tiny random VLMs (Qwen2-VL, Qwen2.5-VL, LLaVA-OneVision) are built once per module under
``tmp_path_factory``; the SmolVLM tests load the real SmolLM2-135M and are marked ``slow``.
Torch runs single-threaded here: on a shared 2-core machine that is the fastest setting for these
tiny models.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from sage_plugin.config import AlgorithmConfig
from sage_plugin.core.policies import build_policy
from sage_plugin.data.prompts import load_prompts
from sage_plugin.engines.lm import GenRequest
from sage_plugin.engines.speculative import SamplingParams, SpecEngine
from sage_plugin.engines.vlm import (
    TINY_KINDS,
    TextDraftForVLM,
    VLMModel,
    build_smolvlm,
    build_tiny_vlm,
    load_vlm,
    make_vlm_request,
    select_visual_keep,
)

POLICIES = ("sage", "static", "chain", "eagle2")
N_PROMPTS = 4
SP = SamplingParams(max_new_tokens=24, stop_token_ids=())


def _requests(processor, prompts):
    """Fresh requests (``meta`` is per request object, so every generate call gets new ones)."""
    return [make_vlm_request(processor, p) for p in prompts]


def _hf_greedy(model, req: GenRequest, n: int) -> list[int]:
    ids = torch.tensor([req.prompt_ids])
    out = model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), **req.mm.tensors, max_new_tokens=n, do_sample=False
    )
    return out[0, ids.shape[1] :].tolist()


def _spec(engine: SpecEngine, processor, prompts, policy: str, batch: int):
    outs = []
    for i in range(0, len(prompts), batch):
        # fixed budget: real trees whatever this machine's timings (auto would size them to the verify cost)
        cfg = AlgorithmConfig(policy=policy, node_budget="fixed")
        outs += engine.generate(_requests(processor, prompts[i : i + batch]), SP, build_policy(cfg))
    return [o.tokens for o in outs], outs


def _tau(outs) -> float:
    rounds = [r for o in outs for r in o.rounds]
    return sum(r.tau for r in rounds) / max(1, len(rounds))


@pytest.fixture(scope="module")
def prompts():
    ps = load_prompts("vlm", limit=N_PROMPTS)
    assert all(p.image is not None for p in ps)
    return ps


@pytest.fixture(scope="module", params=TINY_KINDS)
def tiny(request, tmp_path_factory, prompts):
    kind = request.param
    root = tmp_path_factory.mktemp(kind)
    t0 = time.perf_counter()
    target_dir = build_tiny_vlm(kind, root / "seed0", seed=0)
    draft_dir = build_tiny_vlm(kind, root / "seed1", seed=1)
    target, processor = load_vlm(target_dir)
    draft, draft_processor = load_vlm(draft_dir)
    target_model = VLMModel(target, processor)
    plain = [o.tokens for o in SpecEngine(target_model).generate(_requests(processor, prompts), SP, None)]
    return SimpleNamespace(
        kind=kind,
        target=target,
        draft=draft,
        processor=processor,
        draft_processor=draft_processor,
        target_model=target_model,
        plain=plain,
        dirs=(target_dir, draft_dir),
        setup_s=time.perf_counter() - t0,
    )


# ---------------------------------------------------------------------------------------------
# tiny VLMs
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_build_is_cached_and_tokenizer_shared(tiny, prompts):
    target_dir, draft_dir = tiny.dirs
    stamp = (target_dir / "config.json").stat().st_mtime_ns
    assert build_tiny_vlm(tiny.kind, target_dir, seed=5) == target_dir
    assert (target_dir / "config.json").stat().st_mtime_ns == stamp
    for p in prompts:
        assert make_vlm_request(tiny.processor, p).prompt_ids == make_vlm_request(tiny.draft_processor, p).prompt_ids
    assert tiny.target.config.get_text_config().vocab_size == tiny.draft.config.get_text_config().vocab_size
    n_params = sum(p.numel() for p in tiny.target.parameters())
    assert n_params < 10_000_000


def test_plain_engine_matches_hf_generate(tiny, prompts):
    """Prefill (multimodal) + decode positions through the engine == the model's own greedy generate."""
    engine = SpecEngine(tiny.target_model)
    single = [engine.generate([r], SP, None)[0].tokens for r in _requests(tiny.processor, prompts)]
    assert single == tiny.plain  # batch 1 == batch 4
    for req, toks in zip(_requests(tiny.processor, prompts), tiny.plain):
        hf = _hf_greedy(tiny.target, req, SP.max_new_tokens)
        assert len(hf) >= 8 and hf == toks[: len(hf)]
    assert all(len(set(t)) > 3 for t in tiny.plain)  # non-trivial text
    assert all(t[0] != tiny.processor.tokenizer.eos_token_id for t in tiny.plain)


def test_prefill_layout_and_pruning(tiny, prompts):
    req = make_vlm_request(tiny.processor, prompts[0])
    seq = len(req.prompt_ids)
    full = tiny.target_model.prefill(req)
    scores = req.meta["visual_scores"]
    assert tiny.target_model.last_prefill_info["score_layers"] == tiny.target.config.get_text_config().num_hidden_layers
    n_vis = sum(t in tiny.target_model.visual_token_ids for t in req.prompt_ids)
    assert scores.shape == (n_vis,) and n_vis > 0 and torch.all(scores >= 0) and float(scores.sum()) <= 1.0 + 1e-5
    assert full.kv[0][0].shape[2] == seq
    # score collection does not change the prefill
    plain = VLMModel(tiny.target, tiny.processor, collect_visual_scores=False).prefill(
        make_vlm_request(tiny.processor, prompts[0])
    )
    assert torch.equal(plain.last_logits, full.last_logits)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(plain.kv, full.kv))

    draft = VLMModel(tiny.draft, tiny.processor, prune_ratio=0.8, role="draft")
    pruned = draft.prefill(req)
    n_drop = round(0.8 * n_vis)
    assert draft.last_prefill_info["score_source"] == "target"
    assert pruned.kv[0][0].shape[2] == seq - n_drop
    if draft.mrope:
        assert full.next_pos == pruned.next_pos == seq + int(tiny.target.model.rope_deltas.reshape(-1)[0])
        assert full.next_pos < seq  # the image grid compresses positions
    else:
        assert full.next_pos == seq and pruned.next_pos == seq - n_drop
    # fallbacks when the target left no scores
    for fallback in ("self", "uniform"):
        d = VLMModel(tiny.draft, tiny.processor, prune_ratio=0.8, role="draft", score_fallback=fallback)
        res = d.prefill(make_vlm_request(tiny.processor, prompts[0]))
        assert d.last_prefill_info["score_source"] == fallback
        assert res.kv[0][0].shape[2] == seq - n_drop and res.next_pos == pruned.next_pos


@pytest.mark.slow
@pytest.mark.parametrize("prune", [0.0, 0.8], ids=["full", "pruned0.8"])
@pytest.mark.parametrize("policy", POLICIES)
def test_spec_matches_plain(tiny, prompts, policy, prune):
    draft = VLMModel(tiny.draft, tiny.processor, prune_ratio=prune, role="draft")
    engine = SpecEngine(tiny.target_model, draft)
    for batch in (1, N_PROMPTS):
        tokens, _ = _spec(engine, tiny.processor, prompts, policy, batch)
        assert tokens == tiny.plain, (tiny.kind, policy, prune, batch)


@pytest.mark.slow
def test_a_bfloat16_vlm_draft_narrows_its_language_model_only_and_stays_lossless(tiny, prompts):
    """``cpu_draft_dtype: bfloat16`` on a VLM draft: its language model's linear weights in bfloat16, every other
    linear (vision tower, projector, head) as loaded; still plain decoding's tokens."""
    import copy

    from sage_plugin.engines.lm import RowsLinear, store_draft_weights

    draft = VLMModel(copy.deepcopy(tiny.draft), tiny.processor, prune_ratio=0.8, role="draft")
    assert store_draft_weights(draft, "bfloat16") == "bfloat16"
    inside = {id(m) for m in draft.language_model.modules()}
    linears = [m for m in draft.model.modules() if isinstance(m, RowsLinear)]
    assert any(id(m) in inside for m in linears) and any(id(m) not in inside for m in linears)
    for m in linears:
        assert m.weight.dtype == (torch.bfloat16 if id(m) in inside else torch.float32)
    tokens, _ = _spec(SpecEngine(tiny.target_model, draft), tiny.processor, prompts, "sage", N_PROMPTS)
    assert tokens == tiny.plain


@pytest.mark.slow
def test_self_draft_pruned_accepts(tiny, prompts):
    """The target's own weights on 20% of the visual tokens: real acceptances, still exact."""
    draft = VLMModel(tiny.target, tiny.processor, prune_ratio=0.8, role="draft")
    engine = SpecEngine(tiny.target_model, draft)
    for batch in (1, N_PROMPTS):
        tokens, outs = _spec(engine, tiny.processor, prompts, "sage", batch)
        assert tokens == tiny.plain
        assert _tau(outs) > 0.05


@pytest.mark.slow
def test_text_draft_for_tiny_vlm(tiny, prompts):
    """A text-only LM with the base SmolLM2 vocabulary (49152 < VLM vocabulary) as the draft."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    lm = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=49152,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    ).eval()
    draft = TextDraftForVLM(lm)
    req = make_vlm_request(tiny.processor, prompts[0])
    ids = draft.text_ids(req)
    assert not set(ids) & req.mm.vision_token_ids and len(ids) < len(req.prompt_ids)
    assert draft.prefill(req).next_pos == len(ids)
    tokens, _ = _spec(SpecEngine(tiny.target_model, draft), tiny.processor, prompts, "sage", N_PROMPTS)
    assert tokens == tiny.plain


@pytest.mark.slow
def test_video_prompts_prune_at_the_video_ratio_and_match_plain(tiny):
    """Video prompts (bundled clips): plain decoding equals HF ``generate``; a draft pruning images at 0.5 prunes a
    video's tokens at ``prune_ratio_video`` 0.9 and speculative decoding still gives plain decoding's tokens."""
    videos = load_prompts("vlm-video", 2)
    reqs = _requests(tiny.processor, videos)
    assert all("pixel_values_videos" in r.mm.tensors for r in reqs)
    plain = [o.tokens for o in SpecEngine(tiny.target_model).generate(_requests(tiny.processor, videos), SP, None)]
    hf = _hf_greedy(tiny.target, reqs[0], 8)
    assert hf == plain[0][: len(hf)]
    draft = VLMModel(tiny.draft, tiny.processor, prune_ratio=0.5, role="draft", prune_ratio_video=0.9)
    draft.prefill(reqs[1])
    info = draft.last_prefill_info
    assert info["n_visual"] > 10 and info["n_dropped"] == round(0.9 * info["n_visual"]), info
    tokens, _ = _spec(SpecEngine(tiny.target_model, draft), tiny.processor, videos, "sage", 2)
    assert tokens == plain


def test_select_visual_keep():
    s = torch.tensor([0.05, 0.5, 0.05, 0.1, 0.1, 0.2])
    assert select_visual_keep(s, 6, 3).tolist() == [0, 1, 5]  # stage I {1}, stage II linspace over the rest
    assert select_visual_keep(s, 6, 3, attn_mass=1.0).tolist() == [1, 3, 5]  # pure top-k
    assert select_visual_keep(None, 6, 2).tolist() == [0, 5]
    assert select_visual_keep(s, 6, 0).tolist() == []
    assert select_visual_keep(s, 6, 6).tolist() == list(range(6))
    assert select_visual_keep(torch.zeros(5), 5, 3).tolist() == [0, 2, 4]


def test_vlm_model_argument_checks(tiny):
    with pytest.raises(ValueError):
        VLMModel(tiny.target, tiny.processor, prune_ratio=0.5, role="target")
    with pytest.raises(ValueError):
        VLMModel(tiny.target, tiny.processor, role="verifier")
    with pytest.raises(ValueError):
        VLMModel(tiny.target, tiny.processor, prune_ratio=1.0, role="draft")
    with pytest.raises(ValueError, match="prune_ratio_video"):
        VLMModel(tiny.target, tiny.processor, prune_ratio=0.5, role="draft", prune_ratio_video=1.0)


# ---------------------------------------------------------------------------------------------
# SmolVLM on the real SmolLM2-135M (slow)
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smolvlm(tmp_path_factory, prompts):
    from sage_plugin.engines.lm import load_causal_lm
    from sage_plugin.models import ensure_smollm2, truncated_draft

    text_dir = ensure_smollm2()
    path = build_smolvlm(text_dir, tmp_path_factory.mktemp("smolvlm") / "smolvlm", seed=0)
    model, processor = load_vlm(path)
    draft_lm = load_causal_lm(truncated_draft(text_dir, 4))
    target = VLMModel(model, processor)
    plain = [o.tokens for o in SpecEngine(target).generate(_requests(processor, prompts), SP, None)]
    return SimpleNamespace(
        model=model, processor=processor, target=target, draft=TextDraftForVLM(draft_lm), plain=plain
    )


@pytest.mark.slow
def test_smolvlm_plain_matches_hf_generate(smolvlm, prompts):
    reqs = _requests(smolvlm.processor, prompts)
    tok = smolvlm.processor.tokenizer
    for req, toks in zip(reqs, smolvlm.plain):
        hf = _hf_greedy(smolvlm.model, req, SP.max_new_tokens)
        assert len(hf) >= 4 and hf == toks[: len(hf)], tok.decode(hf)
    # the text model is SmolLM2: the text draft sees the prompt without any image token
    ids = smolvlm.draft.text_ids(reqs[0])
    assert "<image>" not in tok.decode(ids) and "<|im_start|>user" in tok.decode(ids)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2])
def test_smolvlm_spec_matches_plain(smolvlm, prompts, batch):
    engine = SpecEngine(smolvlm.target, smolvlm.draft)
    tokens, outs = _spec(engine, smolvlm.processor, prompts, "sage", batch)
    assert tokens == smolvlm.plain
    assert _tau(outs) > 0.1  # the first 4 layers of SmolLM2 do predict SmolLM2 now and then
