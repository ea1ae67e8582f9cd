"""The output head's product (``core/head.py``) against ``F.linear``, and its consumers: the reference engine's heads
and SGLang's ``_compute_lm_head`` hook."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.core.head import PAD_ONE_ROW_MIN_NUMEL, WEIGHT_MAJOR_MAX_ROWS, head_logits
from sage_plugin.engines.lm import HeadLinear, use_head_logits
from sage_plugin.runtimes.sglang.hooks import compute_lm_head

BIG = torch.Generator().manual_seed(0)
BIG_HEAD = torch.randn(PAD_ONE_ROW_MIN_NUMEL // 64 + 8, 64, generator=BIG)  # above the one-row padding size


@settings(max_examples=60, deadline=None)
@given(
    lead=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    vocab=st.integers(1, 300),
    hidden=st.integers(1, 40),
    seed=st.integers(0, 10_000),
)
def test_head_logits_equals_linear(lead, vocab, hidden, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(*lead, hidden, generator=g), torch.randn(vocab, hidden, generator=g)
    got = head_logits(x, w)
    assert got.shape == (*lead, vocab) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 3, WEIGHT_MAJOR_MAX_ROWS, WEIGHT_MAJOR_MAX_ROWS + 1])
def test_a_large_head_at_any_row_count_equals_linear(rows):
    x = torch.randn(1, rows, BIG_HEAD.shape[1])
    got = head_logits(x, BIG_HEAD)
    assert got.shape == (1, rows, BIG_HEAD.shape[0]) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, BIG_HEAD), rtol=1e-5, atol=1e-4)


def test_the_weight_major_product_is_taken_at_few_rows_only(monkeypatch):
    """Up to WEIGHT_MAJOR_MAX_ROWS rows on CPU: ``weight @ x.T``; more rows, or no rows, ``F.linear``."""
    calls = []
    monkeypatch.setattr(F, "linear", lambda x, w: calls.append(x.shape) or torch.zeros(*x.shape[:-1], w.shape[0]))
    w = torch.randn(10, 4)
    head_logits(torch.randn(2, 4, 4), w)  # 8 rows
    assert calls == []
    head_logits(torch.randn(3, 3, 4), w)  # 9 rows
    head_logits(torch.randn(0, 4), w)
    assert calls == [(3, 3, 4), (0, 4)]


def test_engine_head_keeps_the_tied_weight_and_the_logits():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[3, 17, 5, 40]])
    with torch.inference_mode():
        ref = model(input_ids=ids).logits
        use_head_logits(model)
        head = model.get_output_embeddings()
        assert isinstance(head, HeadLinear)
        assert head.weight is model.get_input_embeddings().weight  # still tied
        torch.testing.assert_close(model(input_ids=ids).logits, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(input_ids=ids[:, :1]).logits, ref[:, :1], rtol=1e-5, atol=1e-5)


class _Head(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, **attrs) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        for k, v in attrs.items():
            setattr(self, k, v)


class UnquantizedEmbeddingMethod:  # SGLang's class name (test_hook_targets checks it exists upstream)
    def apply(self, layer, x, bias=None):
        raise AssertionError("not called by the hook")


class Fp8LinearMethod:
    pass


def _processor(rl: object = None):
    return type("LogitsProcessor", (), {"rl_on_policy_target": rl})()


@pytest.mark.parametrize("quant", [None, UnquantizedEmbeddingMethod()])
def test_sglang_hook_takes_the_cpu_float32_plain_head(quant):
    original = []
    head = _Head(torch.randn(50, 8), quant_method=quant)
    x = torch.randn(3, 8)
    got = compute_lm_head(lambda *a, **k: original.append(a), _processor(), x, head, None, out=None)
    assert original == []
    torch.testing.assert_close(got, F.linear(x, head.weight), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "case",
    ["bias", "amx", "quantized", "lora", "float64", "rl"],
)
def test_sglang_hook_leaves_every_other_head_to_sglang(case):
    w = torch.randn(50, 8, dtype=torch.float64 if case == "float64" else torch.float32)
    attrs = {"amx": {"use_intel_amx_backend": True}, "quantized": {"quant_method": Fp8LinearMethod()},
             "lora": {"set_lora": None, "apply_lora": None}}.get(case, {})  # fmt: skip
    head = _Head(w, **attrs)
    x = torch.randn(2, 8, dtype=w.dtype)
    bias = torch.zeros(50) if case == "bias" else None
    seen = []

    def original(self, hidden, lm_head, embedding_bias=None, **kwargs):
        seen.append((hidden, lm_head, embedding_bias, kwargs))
        return "sglang"

    out = compute_lm_head(original, _processor("fsdp" if case == "rl" else None), x, head, bias, out=None)
    assert out == "sglang" and len(seen) == 1
    assert seen[0][1] is head and seen[0][2] is bias and seen[0][3] == {"out": None}
