"""The drafts' lean decode-time forward (``engines/lean.py``) against transformers' own forward of the same model,
over the same cache: Llama (grouped and plain multi-head attention), Qwen2 (q/k/v biases), a ragged batch under a
tree mask, restricted heads, bfloat16 linear weights, each through the one-call kernel (``csrc/llama_decoder.cpp``)
where it applies and operator by operator; models it does not run keep transformers' forward."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from sage_plugin.engines.kv import SeqState, append_kv
from sage_plugin.engines.lean import LeanDecoder, lean_supported
from sage_plugin.engines.lm import GenRequest, TextModel, use_fast_linears
from sage_plugin.kernels.llama_decoder import decoder_kernel

VOCAB = 96


def _model(kind: str, kv_heads: int, seed: int):
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=kv_heads, max_position_embeddings=256)  # fmt: skip
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
        with torch.no_grad():  # Qwen2's q/k/v biases start at zero: make them count
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_()
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    from sage_plugin.engines.attention import register

    model.config._attn_implementation = register()
    return use_fast_linears(model.eval().requires_grad_(False))


def _states(models: list[TextModel], prompts: list[list[int]]) -> list[SeqState]:
    return [SeqState.from_prefills([m.prefill(GenRequest(p)) for p in prompts]) for m in models]


@settings(max_examples=12, deadline=None)
@given(
    kind=st.sampled_from(["llama", "qwen2"]),
    kv_heads=st.sampled_from([1, 2, 4]),
    lens=st.lists(st.integers(2, 12), min_size=1, max_size=3),
    q=st.integers(1, 6),
    seed=st.integers(0, 1000),
    restricted=st.booleans(),
    fused=st.booleans(),
)
def test_lean_forward_equals_transformers_forward(kind, kv_heads, lens, q, seed, restricted, fused):
    """Same logits (to float rounding) and the same cache after two forwards, for a ragged batch whose new tokens
    form a random tree (each sees a random subset of the earlier new tokens) with padding queries; ``fused``: the
    one-call kernel where it applies (Llama: no biases), else the operator-by-operator path."""
    model = _model(kind, kv_heads, seed)
    g = torch.Generator().manual_seed(seed)
    head = torch.randperm(VOCAB, generator=g)[: VOCAB // 3].sort().values if restricted else None
    hf, lean = TextModel(model, head), TextModel(model, head)
    assert lean.use_lean() and hf.lean is None
    if not fused:
        lean.lean = LeanDecoder(model, fused=False)
    kernel = fused and kind == "llama" and decoder_kernel() is not None
    assert (lean.lean._flat is not None) == kernel
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lens]
    states = _states([hf, lean], prompts)
    bsz = len(lens)
    for _ in range(2):
        ids = torch.randint(0, VOCAB, (bsz, q), generator=g)
        pos = states[0].next_pos[:, None] + torch.arange(q)
        intra = (torch.rand(bsz, q, q, generator=g) < 0.5).tril() | torch.eye(q, dtype=torch.bool)
        valid = torch.rand(bsz, q, generator=g) < 0.8
        valid[:, 0] = True
        outs = [m.forward_head(s, ids, pos, s.attention_mask(intra, valid)) for m, s in zip((hf, lean), states)]
        torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-5)
        for s in states:
            s.next_pos += q
    for a, b in zip(states[0].cache.layers, states[1].cache.layers):
        torch.testing.assert_close(b.keys, a.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b.values, a.values, rtol=1e-5, atol=1e-5)
    assert torch.equal(states[0].committed, states[1].committed)


def test_lean_follows_bfloat16_weights_after_store_weights():
    """``store_weights`` rebuilds the fused weights: the lean forward then equals transformers' forward of the same
    bfloat16-stored model."""
    model = _model("llama", 2, 3)
    lean = TextModel(model)
    lean.use_lean()
    lean.store_weights(torch.bfloat16)
    assert lean.lean.layers[0].qkv.dtype == torch.bfloat16
    hf = TextModel(model)
    states = _states([hf, lean], [[5, 9, 11, 3]])
    ids, pos = torch.tensor([[7, 8]]), states[0].next_pos[:, None] + torch.arange(2)
    mask = [s.attention_mask(torch.ones(1, 2, 2, dtype=torch.bool).tril(), torch.ones(1, 2, dtype=torch.bool))
            for s in states]  # fmt: skip
    torch.testing.assert_close(lean.forward(states[1], ids, pos, mask[1]), hf.forward(states[0], ids, pos, mask[0]),
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def test_the_kernel_runs_the_forward_and_leaves_wide_calls_to_the_operator_path(monkeypatch):
    """A forward the kernel takes never reaches the operator path, and gives its numbers (bfloat16 weights, a
    two-request batch); a call wider than ``kernels.linear.KERNEL_MAX_ROWS`` rows runs operator by operator."""
    if decoder_kernel() is None:  # checked here, not at collection: collecting loads no library
        pytest.skip("the lean decoder kernel cannot be built here")
    import sage_plugin.engines.lean as lean_mod
    from sage_plugin.kernels import linear as lin

    model = _model("llama", 2, 4)
    fast, slow = TextModel(model), TextModel(model)
    fast.use_lean()
    fast.store_weights(torch.bfloat16)
    slow.lean = LeanDecoder(model, fused=False)
    states = _states([fast, slow], [[5, 9, 11, 3], [4, 2]])
    ids, pos = torch.tensor([[7, 8, 9], [1, 2, 3]]), states[0].next_pos[:, None] + torch.arange(3)
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool).expand(2, 3, 3)
    masks = [s.attention_mask(tree, torch.ones(2, 3, dtype=torch.bool)) for s in states]
    calls = []
    monkeypatch.setattr(lean_mod, "append_kv", lambda *a: calls.append(a) or append_kv(*a))
    out = fast.forward(states[0], ids, pos, masks[0])
    assert not calls
    torch.testing.assert_close(out, slow.forward(states[1], ids, pos, masks[1]), rtol=1e-4, atol=1e-4)
    assert len(calls) == len(model.model.layers)
    calls.clear()
    monkeypatch.setattr(lin, "KERNEL_MAX_ROWS", 5)  # 2 requests x 3 tokens: above it
    states = _states([fast], [[5, 9, 11, 3], [4, 2]])
    fast.forward(states[0], ids, pos, states[0].attention_mask(tree, torch.ones(2, 3, dtype=torch.bool)))
    assert len(calls) == len(model.model.layers)


def test_cpu_lean_draft_switches_the_engines_draft_forward():
    """``SpecEngine.use_lean_draft`` (``CpuConfig.cpu_lean_draft``, the run's draft in ``sage bench``): on by default,
    off gives transformers' forward back, on again rebuilds the lean decoder."""
    from sage_plugin.engines.speculative import SpecEngine

    engine = SpecEngine(TextModel(_model("llama", 2, 1)), TextModel(_model("llama", 2, 2)))
    assert engine.draft.lean is not None and engine.target.lean is None
    assert not engine.use_lean_draft(False) and engine.draft.lean is None
    assert engine.use_lean_draft(True) and engine.draft.lean is not None
    assert not SpecEngine(TextModel(_model("llama", 2, 1))).use_lean_draft(True)  # no draft


def test_models_without_the_layer_structure_keep_transformers_forward():
    model = _model("llama", 2, 0)
    target = TextModel(model)
    target.capture_layers = [0]  # a target feeding an EAGLE-3 head keeps its hidden-state capture
    assert not target.use_lean()
    other = type("Other", (), {"config": type("C", (), {"model_type": "gpt2"})(), "model": None})()
    assert not lean_supported(other)
    with pytest.raises(ValueError, match="not a Llama-family decoder"):
        LeanDecoder(other)


@settings(max_examples=30, deadline=None)
@given(ops=st.lists(st.sampled_from(["append", "select", "compact"]), min_size=1, max_size=12), seed=st.integers(0, 99))
def test_append_kv_keeps_what_concatenation_keeps(ops, seed):
    """``append_kv`` (a cache layer grown inside a buffer with room) against ``torch.cat``, through appends of
    1-9 slots, batch row selections and compactions (both replace the layer's tensors): the same keys and values
    every step, and a view taken earlier never changes."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(seed)
    bsz, heads, dim = 3, 2, 4
    start = [(torch.randn(bsz, heads, 5, dim, generator=g), torch.randn(bsz, heads, 5, dim, generator=g))]
    fast = SeqState(DynamicCache(ddp_cache_data=start), torch.ones(bsz, 5, dtype=torch.bool), torch.full((bsz,), 5))
    ref = [t.clone() for t in start[0]]
    layer = fast.cache.layers[0]
    for op in ops:
        before = (layer.keys, layer.keys.clone())
        if op == "append":
            q = int(torch.randint(1, 10, (1,), generator=g))
            k, v = (torch.randn(fast.committed.shape[0], heads, q, dim, generator=g) for _ in range(2))
            append_kv(layer, k, v)
            fast.appended(q)
            ref = [torch.cat([ref[0], k], 2), torch.cat([ref[1], v], 2)]
            keep = torch.rand(fast.committed.shape[0], q, generator=g) < 0.5
            fast.committed[:, -q:] = keep
        elif op == "select" and fast.committed.shape[0] > 1:
            rows = torch.tensor([0, fast.committed.shape[0] - 1])
            fast.select(rows)
            ref = [t.index_select(0, rows) for t in ref]
        elif op == "compact":
            order = torch.sort((~fast.committed).to(torch.int8), dim=1, stable=True).indices
            fast.compact(slack=0.0)
            n = layer.keys.shape[2]
            idx = order[:, None, :n, None].expand(-1, heads, -1, dim)
            ref = [t.gather(2, idx) for t in ref] if n < ref[0].shape[2] else ref
        assert torch.equal(layer.keys, ref[0]) and torch.equal(layer.values, ref[1]), op
        assert torch.equal(before[0], before[1]), "an earlier view changed"
