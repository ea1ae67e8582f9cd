"""``sage_sdpa`` (grouped-query SDPA without the KV-head copy) against transformers' ``sdpa``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from sage_plugin.engines.attention import grouped_sdpa, register


def _repeat_reference(query, key, value, mask):
    g = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
    return torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=mask).transpose(1, 2)


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 3),
    kvh=st.integers(1, 3),
    g=st.integers(1, 4),
    q=st.integers(1, 6),
    s=st.integers(0, 9),
    seed=st.integers(0, 2**16),
)
def test_grouped_matches_repeated_kv_with_random_masks(b, kvh, g, q, s, seed):
    gen = torch.Generator().manual_seed(seed)
    d = 8
    query = torch.randn(b, kvh * g, q, d, generator=gen)
    key = torch.randn(b, kvh, s + q, d, generator=gen)
    value = torch.randn(b, kvh, s + q, d, generator=gen)
    mask = torch.rand(b, 1, q, s + q, generator=gen) < 0.6
    mask[..., s:] |= torch.eye(q, dtype=torch.bool)  # every row sees itself
    out, _ = grouped_sdpa(None, query, key, value, mask)
    torch.testing.assert_close(out, _repeat_reference(query, key, value, mask), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_llama_logits_equal_sdpa_with_padding_and_without_mask(kv_heads):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (3, 11))
    pad = torch.ones_like(ids)
    pad[1, :4] = 0
    pad[2, :7] = 0
    with torch.inference_mode():
        ref_pad = model(input_ids=ids, attention_mask=pad).logits
        ref_full = model(input_ids=ids).logits
        model.set_attn_implementation(register())
        got_pad = model(input_ids=ids, attention_mask=pad).logits
        got_full = model(input_ids=ids).logits
    keep = pad.bool()
    torch.testing.assert_close(got_pad[keep], ref_pad[keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_full, ref_full, rtol=1e-5, atol=1e-5)
