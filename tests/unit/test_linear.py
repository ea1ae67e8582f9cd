"""The few-row linear rule (``core/linear.py``) against ``F.linear``, and its consumers: the reference engine's models
and SGLang's ``_compute_lm_head`` and ``UnquantizedLinearMethod.apply`` hooks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.core.linear import MAX_ROWS, linear
from sage_plugin.engines.lm import RowsLinear, use_fast_linears
from sage_plugin.runtimes.sglang.hooks import compute_lm_head, unquantized_linear

BIG_HEAD = torch.randn(49152, 64, generator=torch.Generator().manual_seed(0))


@settings(max_examples=60, deadline=None)
@given(
    lead=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    vocab=st.integers(1, 300),
    hidden=st.integers(1, 40),
    seed=st.integers(0, 10_000),
    with_bias=st.booleans(),
)
def test_linear_equals_f_linear(lead, vocab, hidden, seed, with_bias):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(*lead, hidden, generator=g), torch.randn(vocab, hidden, generator=g)
    b = torch.randn(vocab, generator=g) if with_bias else None
    got = linear(x, w, b)
    assert got.shape == (*lead, vocab) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 15, 17, MAX_ROWS - 1, MAX_ROWS, MAX_ROWS + 1])
def test_a_large_head_at_any_row_count_equals_f_linear(rows):
    x = torch.randn(1, rows, BIG_HEAD.shape[1])
    got = linear(x, BIG_HEAD)
    assert got.shape == (1, rows, BIG_HEAD.shape[0]) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, BIG_HEAD), rtol=1e-5, atol=1e-4)


def test_the_weight_major_product_is_taken_at_its_row_counts_only(monkeypatch):
    """1..MAX_ROWS rows on CPU, same dtypes: weight-major; F.linear otherwise (no rows, more rows, mixed dtypes)."""
    w = torch.randn(10, 64)
    calls = []
    real = F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: calls.append(tuple(x.shape)) or real(x, w, b))
    for rows in (0, 1, 2, MAX_ROWS, MAX_ROWS + 1):
        linear(torch.randn(rows, 64), w)
    linear(torch.randn(3, 64, dtype=torch.float64), w.double())  # weight-major: same dtype, in range
    with pytest.raises(RuntimeError):  # mixed dtypes: F.linear's own error, as without the rule
        linear(torch.randn(3, 64, dtype=torch.float64), w)
    assert calls == [(0, 64), (MAX_ROWS + 1, 64), (3, 64)]


def test_rows_above_eight_run_at_the_next_multiple_of_eight(monkeypatch):
    """The product runs at 2 rows for 1, as given for 2..8 and multiples of 8, else at the next multiple of 8 (zero
    rows added and cut off again); the result has the caller's rows."""
    w = torch.randn(10, 64)
    seen = []
    real = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: seen.append(b.shape[1]) or real(a, b))
    want = {1: 2, 2: 2, 7: 7, 8: 8, 9: 16, 15: 16, 16: 16, 17: 24, 40: 40, 41: 48, 63: 64, MAX_ROWS: MAX_ROWS}
    for rows, runs in want.items():
        x = torch.randn(rows, 64)
        out = linear(x, w)
        assert seen[-1] == runs and out.shape == (rows, 10)
        torch.testing.assert_close(out, F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_engine_linears_keep_the_tied_weight_the_state_dict_and_the_logits():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[3, 17, 5, 40]])
    keys = list(model.state_dict())
    with torch.inference_mode():
        ref = [model(input_ids=ids[:, :n]).logits for n in (1, 2, 4)]
        use_fast_linears(model)
        head = model.get_output_embeddings()
        assert isinstance(head, RowsLinear) and isinstance(model.model.layers[0].mlp.gate_proj, RowsLinear)
        assert head.weight is model.get_input_embeddings().weight  # still tied
        assert list(model.state_dict()) == keys
        for n, r in zip((1, 2, 4), ref):
            torch.testing.assert_close(model(input_ids=ids[:, :n]).logits, r, rtol=1e-5, atol=1e-5)


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


@pytest.mark.parametrize("with_bias", [False, True])
def test_sglang_linear_hook_takes_cpu_float32_layers(with_bias):
    layer = _Head(torch.randn(12, 8))
    x, bias = torch.randn(3, 8), torch.randn(12) if with_bias else None
    got = unquantized_linear(lambda *a: pytest.fail("SGLang's product called"), object(), layer, x, bias)
    torch.testing.assert_close(got, F.linear(x, layer.weight, bias), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("case", ["amx", "float64"])
def test_sglang_linear_hook_leaves_other_layers_to_sglang(case):
    dtype = torch.float64 if case == "float64" else torch.float32
    layer = _Head(torch.randn(12, 8, dtype=dtype), **({"use_intel_amx_backend": True} if case == "amx" else {}))
    x = torch.randn(3, 8, dtype=dtype)
    seen = []
    out = unquantized_linear(lambda self, lyr, xx, b: seen.append((lyr, xx, b)) or "sglang", object(), layer, x)
    assert out == "sglang" and seen == [(layer, x, None)]
