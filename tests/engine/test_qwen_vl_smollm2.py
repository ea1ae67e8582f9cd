"""Qwen2-VL / Qwen2.5-VL built on SmolLM2's weights (the VLM SGLang serves on CPU): its text path *is* SmolLM2.

M-RoPE with three equal position axes is 1-D RoPE, and the q/k/v biases are zero, so on text-only prompts the VLM's
logits over SmolLM2's vocabulary equal SmolLM2's; the padded draft equals the bundled draft on its own vocabulary.
"""

from __future__ import annotations

import pytest
import torch

from sage_plugin.data.prompts import mixed_text_prompts, render_chat
from sage_plugin.engines.lm import load_causal_lm
from sage_plugin.engines.vlm import QWEN_VL_KINDS, ensure_qwen_vl_smollm2, load_vlm
from sage_plugin.models import bundled_draft_dir, ensure_smollm2, load_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def text_ids():
    tok = load_tokenizer(ensure_smollm2())
    return [torch.tensor([render_chat(tok, p)]) for p in mixed_text_prompts(3)]


@pytest.mark.parametrize("kind", QWEN_VL_KINDS)
def test_text_path_equals_smollm2(kind, text_ids):
    target, _ = ensure_qwen_vl_smollm2(kind)
    vlm, processor = load_vlm(target)
    lm = load_causal_lm(ensure_smollm2())
    vocab = lm.config.vocab_size
    with torch.no_grad():
        for ids in text_ids:
            a, b = vlm(input_ids=ids).logits[0], lm(input_ids=ids).logits[0]
            torch.testing.assert_close(a[:, :vocab], b, atol=1e-4, rtol=0)
            assert torch.equal(a.argmax(-1), b.argmax(-1))  # the appended special tokens never win
    cfg = vlm.config
    assert processor.tokenizer.convert_tokens_to_ids("<|image_pad|>") == cfg.image_token_id >= vocab
    assert sum(cfg.get_text_config().rope_parameters["mrope_section"]) * 2 == 64  # SmolLM2's head dim


def test_padded_draft_equals_the_bundled_draft(text_ids):
    target, draft = ensure_qwen_vl_smollm2("qwen2_vl")
    padded, original = load_causal_lm(draft), load_causal_lm(bundled_draft_dir())
    assert padded.config.vocab_size == load_vlm(target)[0].config.get_text_config().vocab_size
    with torch.no_grad():
        for ids in text_ids:
            a, b = padded(input_ids=ids).logits[0], original(input_ids=ids).logits[0]
            torch.testing.assert_close(a[:, : b.shape[-1]], b, atol=1e-5, rtol=0)
        # the image placeholder id (SGLang clamps image positions to the last id) embeds like the mean token
        last = torch.tensor([[padded.config.vocab_size - 1]])
        assert torch.isfinite(padded(input_ids=last).logits).all()
