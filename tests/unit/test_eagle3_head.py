"""The EAGLE-3 head trainer: training-time-test unroll against a naive chain with a KV cache, loss, export format."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.engines.eagle3 import _rotate, default_aux_layers, rope_tables
from sage_plugin.train.eagle3.data import FeatureStore
from sage_plugin.train.eagle3.export import export_head, head_config, load_head
from sage_plugin.train.eagle3.loop import hot_vocabulary, make_head, shard_order
from sage_plugin.train.eagle3.loss import step_matches, target_to_draft, ttt_loss
from sage_plugin.train.evaluate import chain_accept, chain_tau

TARGET_CFG = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 10000.0},
    "vocab_size": 50,
    "num_hidden_layers": 8,
    "architectures": ["LlamaForCausalLM"],
}


def _head(seed: int = 0, draft_vocab: int = 20):
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(50, 32, generator=g)
    hot = torch.sort(torch.randperm(50, generator=g)[:draft_vocab]).values
    torch.manual_seed(seed)
    head = make_head(TARGET_CFG, emb, hot, 48)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.2 if p.dim() == 2 else 0.05))
    return head


def _naive_chain(head, feats, tokens, p: int, steps: int) -> list[torch.Tensor]:
    """One chain started at row ``p``, one query at a time over an explicit cache (what a runtime does)."""
    s, m = head.shape, head.midlayer

    def kv(tok, h, pos):
        x = torch.cat([m.input_layernorm(head.embed[tok]), m.hidden_norm(h)], -1)
        cos, sin = rope_tables(torch.tensor(pos), s.head_dim, s.rope_theta)
        q = _rotate(m.self_attn.q_proj(x).view(s.heads, s.head_dim), cos, sin)
        k = _rotate(m.self_attn.k_proj(x).view(s.kv_heads, s.head_dim), cos, sin)
        v = m.self_attn.v_proj(x).view(s.kv_heads, s.head_dim)
        return q, k, v

    def attend(q, ks, vs, h):
        rep = s.heads // s.kv_heads
        K = torch.stack(ks).repeat_interleave(rep, 1)  # [n, heads, d]
        V = torch.stack(vs).repeat_interleave(rep, 1)
        w = torch.softmax(torch.einsum("hd,nhd->hn", q, K) / math.sqrt(s.head_dim), -1)
        o = m.self_attn.o_proj(torch.einsum("hn,nhd->hd", w, V).reshape(-1)) + h
        x = m.post_attention_layernorm(o)
        return m.mlp.down_proj(F.silu(m.mlp.gate_proj(x)) * m.mlp.up_proj(x)) + o

    ks, vs = [], []
    for r in range(p + 1):  # draft extend: target-fed rows 0..p
        q, k, v = kv(int(tokens[r + 1]), head.fc(feats[r]), r)
        ks.append(k)
        vs.append(v)
    h = attend(q, ks, vs, head.fc(feats[p]))
    outs = [h]
    for k_ in range(1, steps):
        if p + k_ + 1 >= len(tokens):
            break
        q, k, v = kv(int(tokens[p + k_ + 1]), h, p + k_)
        ks.append(k)
        vs.append(v)
        h = attend(q, ks, vs, h)
        outs.append(h)
    return outs


@settings(max_examples=12, deadline=None)
@given(T=st.integers(3, 9), steps=st.integers(1, 4), seed=st.integers(0, 1000))
def test_unroll_equals_naive_chains(T, steps, seed):
    head = _head(seed)
    g = torch.Generator().manual_seed(seed + 1)
    feats = torch.randn(T, 96, generator=g)
    tokens = torch.randint(0, 50, (T,), generator=g)
    with torch.no_grad():
        outs = head.unroll(feats[None], tokens[None], steps)
        for p in range(T - 1):
            ref = _naive_chain(head, feats, tokens, p, steps)
            for k, r in enumerate(ref):
                if p < outs[k].shape[1]:
                    torch.testing.assert_close(outs[k][0, p], r, atol=1e-5, rtol=1e-4)


def test_unroll_batched_equals_single_rows():
    head = _head(3)
    g = torch.Generator().manual_seed(5)
    feats, tokens = torch.randn(3, 7, 96, generator=g), torch.randint(0, 50, (3, 7), generator=g)
    with torch.no_grad():
        batched = head.unroll(feats, tokens, 3)
        for b in range(3):
            single = head.unroll(feats[b : b + 1], tokens[b : b + 1], 3)
            for k in range(3):
                torch.testing.assert_close(batched[k][b], single[k][0], atol=1e-5, rtol=1e-4)


def test_step_matches_and_loss_follow_the_unroll():
    head = _head(1)
    g = torch.Generator().manual_seed(2)
    T = 8
    feats, tokens = torch.randn(T, 96, generator=g), torch.randint(0, 50, (T,), generator=g)
    with torch.no_grad():
        outs = head.unroll(feats[None], tokens[None], 3)
        # a target that agrees with the draft everywhere: every step matches
        t_arg = torch.zeros(T, dtype=torch.long)
        t_arg[1:] = head.hot_ids[head.logits(outs[0][0]).argmax(-1)]
        m = step_matches(head, feats, tokens, t_arg, 3)
    assert bool(m[:, 0].all())
    batch = {
        "feats": feats[None],
        "tokens": tokens[None],
        "topk_ids": t_arg[None, :, None],
        "topk_logprobs": torch.zeros(1, T, 1),
        "mask": torch.ones(1, T, dtype=torch.bool),
    }
    loss, accs = ttt_loss(head, batch, 1)
    assert accs[0] == 1.0
    logq = F.log_softmax(head.logits(outs[0][0]), -1)
    want = -logq.gather(-1, target_to_draft(head)[t_arg[1:]][:, None]).mean()
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)


def test_training_reduces_the_loss():
    head = _head(4)
    g = torch.Generator().manual_seed(9)
    T = 12
    tokens = head.hot_ids[torch.randint(0, 20, (2, T), generator=g)]
    batch = {
        "feats": torch.randn(2, T, 96, generator=g),
        "tokens": tokens,
        "topk_ids": torch.roll(tokens, -1, 1)[..., None],
        "topk_logprobs": torch.zeros(2, T, 1),
        "mask": torch.ones(2, T, dtype=torch.bool),
    }
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    first = None
    for _ in range(60):
        loss, _ = ttt_loss(head, batch, 3)
        first = first if first is not None else float(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.5 * first


def _naive_chain_tau(matches: list[bool], chain: int) -> tuple[int, int]:
    """Chain drafting over position-wise matches, written out: accept the run from i (at most ``chain``), +1."""
    n, i, tokens, steps = len(matches), 0, 0, 0
    while i < n:
        k = 0
        while k < chain and i + k < n and matches[i + k]:
            k += 1
        adv = min(k + 1, n - i)
        tokens, steps, i = tokens + adv, steps + 1, i + adv
    return tokens, steps


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=30), st.integers(1, 5))
def test_chain_accept_equals_chain_tau_when_rows_agree(matches, chain):
    """A standalone draft's matches do not depend on the chain's start: both simulations then agree."""
    n = len(matches)
    rows = torch.tensor([[matches[i + k] if i + k < n else False for k in range(chain)] for i in range(n)])
    assert chain_accept(rows, 0, n, chain) == chain_tau(matches, chain) == _naive_chain_tau(matches, chain)


def test_chain_accept_uses_each_rounds_own_row():
    """An EAGLE chain's later steps depend on where the round started: rows no round starts at do not count."""
    f, t = False, True
    rows = torch.tensor([[f, f, f], [t, t, t], [f, f, f], [f, f, f]])
    assert chain_accept(rows, 0, 4, 3) == (4, 2)  # row 0: bonus only; row 1: all three to the end
    rows[0, 0] = True  # row 0 now accepts one, so the next round starts at row 2 and row 1's matches are unused
    assert chain_accept(rows, 0, 4, 3) == (4, 3)


def test_export_has_sglangs_eagle3_names_and_round_trips(tmp_path: Path):
    from tests.integration.sglang.heads import make_eagle3_head

    head = _head(6)
    tdir = tmp_path / "target"
    tdir.mkdir()
    (tdir / "config.json").write_text(json.dumps(TARGET_CFG))
    out = export_head(head, tdir, tmp_path / "head", [1, 3, 4], {"x": 1}, "card\n")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert cfg["draft_vocab_size"] == 20 and cfg["intermediate_size"] == 48 and cfg["tie_word_embeddings"] is False
    ref = make_eagle3_head(tdir, tmp_path / "random", draft_vocab=20)
    from safetensors.torch import load_file

    assert set(load_file(str(out / "model.safetensors"))) == set(load_file(str(ref / "model.safetensors")))
    back, aux = load_head(out, head.embed)
    assert aux == [1, 3, 4]
    assert torch.equal(back.hot_ids, head.hot_ids)
    g = torch.Generator().manual_seed(0)
    feats, tokens = torch.randn(1, 6, 96, generator=g), torch.randint(0, 50, (1, 6), generator=g)
    with torch.no_grad():
        a, b = head.unroll(feats, tokens, 2), back.unroll(feats, tokens, 2)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=2e-2, rtol=2e-2)  # fp16 weights
    assert head_config(TARGET_CFG, head, [1, 3, 4])["num_hidden_layers"] == 1


def test_default_aux_layers_are_sglangs():
    """SGLang captures before layers [2, L // 2, L - 3]; the ids it reads are those minus one."""
    assert [i + 1 for i in default_aux_layers(30)] == [2, 15, 27]


def test_shard_order_and_hot_vocabulary(tmp_path: Path):
    order = shard_order(60)
    assert sorted(order) == list(range(60)) and order[:3] == [48, 49, 0]
    shard = {
        "tokens": torch.arange(10, dtype=torch.int32),
        "offsets": torch.tensor([0, 4, 10]),
        "answer_start": torch.tensor([2, 3]),
        "feats": torch.randn(10, 6).half(),
        "topk_ids": torch.tensor([[5], [5], [5], [7], [7], [9], [1], [1], [1], [1]], dtype=torch.int32),
        "topk_logprobs": torch.zeros(10, 1).half(),
    }
    torch.save(shard, tmp_path / "feat_00000.pt")
    store = FeatureStore([tmp_path / "feat_00000.pt"], seq_len=4)
    assert store.windows == [(0, 0, 4, 2), (0, 4, 4, 7), (0, 8, 2, 7)]
    b = store.batch([0, 2])
    assert b["mask"][0].tolist() == [False, True, True, True]  # position t predicts token t + 1 >= answer start
    assert b["mask"][1].tolist() == [True, True, False, False]  # padding
    prior = torch.tensor([9, 11])
    assert hot_vocabulary(store, 12, 3, always=[0], prior=prior).tolist() == [0, 1, 5]  # counts 4, 3; 0 forced
    # the tail comes from the prior (11 never seen, but listed) before unseen ids
    assert hot_vocabulary(store, 12, 6, always=[0], prior=prior).tolist() == [0, 1, 5, 7, 9, 11]
    with pytest.raises(RuntimeError):
        hot_vocabulary(store, 12, 13, always=[0])
