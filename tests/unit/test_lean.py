"""The drafts' lean decode-time forward (``engines/lean.py``) against transformers' own forward of the same model,
over the same cache: Llama (grouped and plain multi-head attention), Qwen2 (q/k/v biases), a ragged batch under a
tree mask, restricted heads, bfloat16 linear weights; models it does not run keep transformers' forward."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from sage_plugin.engines.kv import SeqState
from sage_plugin.engines.lean import LeanDecoder, lean_supported
from sage_plugin.engines.lm import GenRequest, TextModel, use_fast_linears

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
)
def test_lean_forward_equals_transformers_forward(kind, kv_heads, lens, q, seed, restricted):
    """Same logits (to float rounding) and the same cache after two forwards, for a ragged batch whose new tokens
    form a random tree (each sees a random subset of the earlier new tokens) with padding queries."""
    model = _model(kind, kv_heads, seed)
    g = torch.Generator().manual_seed(seed)
    head = torch.randperm(VOCAB, generator=g)[: VOCAB // 3].sort().values if restricted else None
    hf, lean = TextModel(model, head), TextModel(model, head)
    assert lean.use_lean() and hf.lean is None
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


def test_cpu_lean_draft_switches_the_engines_draft_forward():
    """``SpecEngine.use_lean_draft`` (``SageConfig.cpu_lean_draft``, the run's draft in ``sage bench``): on by default,
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

    from sage_plugin.engines.kv import append_kv

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
