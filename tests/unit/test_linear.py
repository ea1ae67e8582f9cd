"""The few-row linear rule (``kernels/linear.py``) against ``F.linear``, and its consumers: the reference engine's models
and SGLang's ``_compute_lm_head`` and ``UnquantizedLinearMethod.apply`` hooks."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.engines.lm import RowsLinear, use_fast_linears
from sage_plugin.kernels import linear as lin
from sage_plugin.kernels import native
from sage_plugin.kernels.linear import KERNEL_MAX_ROWS, MAX_ROWS, linear
from sage_plugin.kernels.native import host_isa
from sage_plugin.runtimes.sglang.hooks import compute_lm_head, unquantized_linear

#: the rows kernel's limit the dispatch tests set (the machine's own, 32 or 64, is :data:`KERNEL_MAX_ROWS`): below
#: MAX_ROWS, so that every product of the rule is reached
KERNEL_ROWS = 16
BIG_HEAD = torch.randn(49152, 64, generator=torch.Generator().manual_seed(0))


@settings(max_examples=60, deadline=None)
@given(
    lead=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    vocab=st.integers(1, 300),
    hidden=st.one_of(st.integers(1, 40), st.sampled_from([16, 32, 48, 64])),  # multiples of 16: the rows kernel
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


def _paths(monkeypatch) -> list:
    """Record which product :func:`linear` takes: ``("kernel" | "weight-major" | "F.linear", rows)``."""
    taken = []
    kernel = lin.rows_kernel()
    assert kernel is not None, "the rows kernel builds on every machine the tests run on (tools/setup.sh builds it)"
    real_f, real_wm = F.linear, lin._weight_major

    class Recording:
        @staticmethod
        def rows_linear(x, w):
            taken.append(("kernel", x.shape[0]))
            return kernel.rows_linear(x, w)

    monkeypatch.setitem(native._built, "rows_linear", Recording)
    monkeypatch.setattr(
        F, "linear", lambda x, w, b=None: taken.append(("F.linear", x.numel() // x.shape[-1])) or real_f(x, w, b)
    )
    monkeypatch.setattr(lin, "_weight_major", lambda x, w: taken.append(("weight-major", x.shape[0])) or real_wm(x, w))
    return taken


def test_each_row_count_and_layer_takes_its_product(monkeypatch):
    """Float32, inner size a multiple of 16, 1..KERNEL_MAX_ROWS rows, outside autograd: the rows kernel; up to MAX_ROWS
    rows otherwise: weight-major; no rows, more rows, another device or mixed dtypes: F.linear."""
    taken = _paths(monkeypatch)
    monkeypatch.setattr(lin, "KERNEL_MAX_ROWS", KERNEL_ROWS)
    w, w60 = torch.randn(10, 64), torch.randn(10, 60)
    cases = [
        (torch.randn(1, 64), w, ("kernel", 1)),
        (torch.randn(2, 3, 64), w, ("kernel", 6)),
        (torch.randn(KERNEL_ROWS, 64), w, ("kernel", KERNEL_ROWS)),
        (torch.randn(KERNEL_ROWS + 1, 64), w, ("weight-major", KERNEL_ROWS + 1)),
        (torch.randn(MAX_ROWS, 64), w, ("weight-major", MAX_ROWS)),
        (torch.randn(MAX_ROWS + 1, 64), w, ("F.linear", MAX_ROWS + 1)),
        (torch.randn(0, 64), w, ("F.linear", 0)),
        (torch.randn(3, 60), w60, ("weight-major", 3)),  # inner size not a multiple of 16
        (torch.randn(3, 64, dtype=torch.float64), w.double(), ("weight-major", 3)),
        (torch.randn(3, 64), w.t().contiguous().t(), ("weight-major", 3)),  # a weight that is a transposed view
        (torch.randn(3, 64, requires_grad=True), w, ("weight-major", 3)),  # autograd: the kernel has no backward
    ]
    for x, weight, want in cases:
        got = linear(x, weight)
        assert taken[-1] == want, (tuple(x.shape), want)
        torch.testing.assert_close(got, F.linear(x.detach(), weight), rtol=1e-5, atol=1e-4)
    with pytest.raises(RuntimeError):  # mixed dtypes: F.linear's own error, as without the rule
        linear(torch.randn(3, 64, dtype=torch.float64), w)
    assert taken[-1] == ("F.linear", 3)


def test_this_machines_kernel_limit_takes_the_kernel(monkeypatch):
    """The machine's own limit (32 rows on AVX-512, MAX_ROWS on AVX2) is a kernel call."""
    if host_isa() not in ("avx512", "avx2"):
        pytest.skip("a CPU without AVX2: the rows kernel is never taken")
    taken = _paths(monkeypatch)
    assert KERNEL_MAX_ROWS == (32 if host_isa() == "avx512" else MAX_ROWS)
    x, w = torch.randn(KERNEL_MAX_ROWS, 64), torch.randn(10, 64)
    got = linear(x, w)
    assert taken[-1] == ("kernel", KERNEL_MAX_ROWS)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_gradients_flow_through_the_rule():
    w = torch.randn(10, 64, requires_grad=True)
    x = torch.randn(3, 64, requires_grad=True)
    linear(x, w).sum().backward()
    torch.testing.assert_close(x.grad, w.detach().sum(0).expand(3, -1))
    torch.testing.assert_close(w.grad, x.detach().sum(0).expand(10, -1))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, max(KERNEL_MAX_ROWS, 1)),
    n=st.integers(1, 70),
    k16=st.integers(1, 12),
    seed=st.integers(0, 10_000),
    bf16=st.booleans(),
)
def test_rows_kernel_is_batch_invariant_and_equals_a_float64_product(rows, n, k16, seed, bf16):
    """Every row of a call equals, bit for bit, that row computed alone (any row count, any output size, tails of
    the row tiles included), and the products equal a float64 reference to float32 rounding.  A bfloat16 weight
    (``cpu_draft_dtype``) under float32 rows gives float32 results equal, bit for bit, to the float32 kernel's on
    the widened weight (a bfloat16 is a float32's high half)."""
    kernel = lin.rows_kernel()
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, 16 * k16, generator=g), torch.randn(n, 16 * k16, generator=g)
    w = w.bfloat16() if bf16 else w
    got = kernel.rows_linear(x, w)
    assert got.dtype == torch.float32
    for r in range(rows):
        assert torch.equal(got[r : r + 1], kernel.rows_linear(x[r : r + 1].contiguous(), w))
    if bf16:
        assert torch.equal(got, kernel.rows_linear(x, w.float()))
    torch.testing.assert_close(got, (x.double() @ w.double().t()).float(), rtol=1e-5, atol=1e-4)


def test_a_machine_without_the_kernel_takes_weight_major(monkeypatch):
    monkeypatch.setitem(native._built, "rows_linear", False)  # as after a failed build
    assert lin.rows_kernel() is None
    x, w = torch.randn(3, 64), torch.randn(10, 64)
    torch.testing.assert_close(linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_a_failed_build_warns_once_and_is_not_retried(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as ext

    monkeypatch.setattr(native, "KERNELS_DIR", tmp_path)  # nothing built there
    monkeypatch.setattr(native, "_may_build", [True])
    calls = []
    monkeypatch.setattr(ext, "load", lambda **kw: calls.append(kw["name"]) or (_ for _ in ()).throw(OSError("no c++")))
    monkeypatch.delitem(native._built, "rows_linear", raising=False)
    with pytest.warns(UserWarning, match="could not be built"):
        assert lin.rows_kernel() is None
    assert lin.rows_kernel() is None and len(calls) == 1
    assert calls[0].startswith("sage_plugin_rows_linear_")  # named after the instruction set: no other machine's build


def test_weight_major_runs_above_eight_rows_at_the_next_multiple_of_eight(monkeypatch):
    """The product runs at 2 rows for 1, as given for 2..8 and multiples of 8, else at the next multiple of 8 (zero
    rows added and cut off again); the result has the caller's rows."""
    w = torch.randn(10, 64)
    seen = []
    real = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: seen.append(b.shape[1]) or real(a, b))
    want = {1: 2, 2: 2, 7: 7, 8: 8, 9: 16, 15: 16, 16: 16, 17: 24, 40: 40, 41: 48, 63: 64, MAX_ROWS: MAX_ROWS}
    for rows, runs in want.items():
        x = torch.randn(rows, 64)
        out = lin._weight_major(x, w)
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


def test_a_bfloat16_weight_takes_the_kernel_at_few_rows_and_is_widened_elsewhere(monkeypatch):
    """Float32 rows over a bfloat16 weight (``cpu_draft_dtype``): the rows kernel where it applies; more rows, an
    inner size it cannot take, or no kernel: the product of the widened weight.  Every result a float32 one equal to
    ``F.linear`` with ``w.float()``."""
    taken = _paths(monkeypatch)
    monkeypatch.setattr(lin, "KERNEL_MAX_ROWS", KERNEL_ROWS)
    w, w60, b = torch.randn(10, 64).bfloat16(), torch.randn(10, 60).bfloat16(), torch.randn(10)
    cases = [
        (torch.randn(1, 64), w, ("kernel", 1)),
        (torch.randn(2, 3, 64), w, ("kernel", 6)),
        (torch.randn(KERNEL_ROWS + 1, 64), w, ("weight-major", KERNEL_ROWS + 1)),
        (torch.randn(MAX_ROWS + 1, 64), w, ("F.linear", MAX_ROWS + 1)),
        (torch.randn(3, 60), w60, ("weight-major", 3)),
    ]
    for x, weight, want in cases:
        for bias in (None, b):
            got = linear(x, weight, bias)
            assert taken[-1] == want and got.dtype == torch.float32, (tuple(x.shape), want)
            torch.testing.assert_close(got, F.linear(x, weight.float(), bias), rtol=1e-5, atol=1e-4)
    monkeypatch.setitem(native._built, "rows_linear", False)  # a machine without the kernel
    x = torch.randn(3, 64)
    got = linear(x, w)
    assert taken[-1] == ("weight-major", 3)
    torch.testing.assert_close(got, F.linear(x, w.float()), rtol=1e-5, atol=1e-4)


def test_stored_bfloat16_linears_untie_the_head_and_keep_the_embedding():
    """``store_linear_weights``: every engine linear in bfloat16, the tied head a copy of its own (the input embedding,
    biases and norms keep float32), logits those of the float32 model with its linear weights rounded to bfloat16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from sage_plugin.engines.lm import TextModel, store_linear_weights

    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    model = use_fast_linears(LlamaForCausalLM(cfg).eval().requires_grad_(False))
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for m in rounded.modules():
            if isinstance(m, RowsLinear):
                m.weight = torch.nn.Parameter(m.weight.detach().bfloat16().float(), requires_grad=False)
    emb = model.get_input_embeddings().weight.clone()
    store_linear_weights(model, torch.bfloat16)
    linears = [m for m in model.modules() if isinstance(m, RowsLinear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert model.get_input_embeddings().weight.dtype == torch.float32
    assert torch.equal(model.get_input_embeddings().weight, emb)
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "norm" in n)
    ids = torch.tensor([[3, 17, 5, 40]])
    with torch.inference_mode():
        torch.testing.assert_close(model(input_ids=ids).logits, rounded(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    head = TextModel(copy.deepcopy(rounded), torch.tensor([1, 5, 9]))
    head.store_weights(torch.bfloat16)
    assert head._head_w.dtype == torch.bfloat16
