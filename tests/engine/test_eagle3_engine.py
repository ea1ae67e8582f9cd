"""The reference engine with an EAGLE-3 head: lossless, batched = single, and fed the right features and positions.

A tiny random Llama target (4 layers, the head reads layers 0/1/2) and a random head: acceptance is low, so the
bookkeeping is checked directly by recording every draft forward (catch-up rows against the training unroll on
the final sequence, tree rows against their parent's output).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sage_plugin.config import AlgorithmConfig
from sage_plugin.core.policies import build_policy
from sage_plugin.engines.eagle3_draft import Eagle3Draft
from sage_plugin.engines.lm import GenRequest, TextModel
from sage_plugin.engines.speculative import SamplingParams, SpecEngine
from sage_plugin.models import check_eagle3_config
from sage_plugin.train.eagle3.loop import make_head

VOCAB, AUX = 96, [0, 1, 2]


def _target() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    m = LlamaForCausalLM(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        m.lm_head.weight.mul_(6.0)
    return m


def _cfg(m) -> dict:
    c = m.config.to_dict()
    c["rope_parameters"] = {"rope_theta": float(getattr(m.config, "rope_theta", None) or 10000.0)}
    return c


@pytest.fixture(scope="module")
def setup():
    target = _target()
    hot = torch.arange(0, VOCAB, 2)  # every other token: a reduced draft vocabulary
    torch.manual_seed(1)
    head = make_head(_cfg(target), target.get_input_embeddings().weight.detach(), hot, 96)
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(4.0)
    draft = Eagle3Draft(head, AUX, VOCAB)
    return SpecEngine(TextModel(target), draft), target, head


def _requests(n: int) -> list[GenRequest]:
    gen = torch.Generator().manual_seed(7)
    return [
        GenRequest(torch.randint(0, VOCAB, (int(4 + 3 * i),), generator=gen).tolist(), request_id=str(i))
        for i in range(n)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["chain", "sage", "eagle2", "static"])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_equals_plain_decoding(setup, policy, batch):
    engine, _, _ = setup
    reqs = _requests(3)
    sp = SamplingParams(max_new_tokens=30)
    ref = {o.request_id: o.tokens for o in engine.generate(reqs, sp, None)}
    cfg = AlgorithmConfig(policy=policy, node_budget="fixed")
    got = []
    for i in range(0, len(reqs), batch):
        got += engine.generate(reqs[i : i + batch], sp, build_policy(cfg))
    assert {o.request_id: o.tokens for o in got} == ref


def test_draft_rows_get_the_right_features_and_positions(setup, monkeypatch):
    """Catch-up rows equal the training unroll's step 0 on the final sequence; tree rows read their parent."""
    engine, target, head = setup
    draft = engine.draft
    calls = []
    real = draft.forward

    def record(state, ids, pos, mask, features=None):
        out = real(state, ids, pos, mask, features)
        calls.append((ids.clone(), pos.clone(), features.clone(), draft.last_hidden.clone(), out.clone()))
        return out

    monkeypatch.setattr(draft, "forward", record)
    req = _requests(1)[0]
    out = engine.generate([req], SamplingParams(max_new_tokens=20), build_policy(AlgorithmConfig(policy="chain")))[0]
    seq = torch.tensor(req.prompt_ids + out.tokens)
    with torch.no_grad():
        hs = target(input_ids=seq[None], output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i + 1] for i in AUX], -1)
        step0 = head.logits(head.unroll(feats, seq[None], 1)[0])[0]  # row p: (x[p + 1], f_p) at position p
    n_catch = 0
    prev_hidden = None
    for ids, pos, f, hidden, logits in calls:
        if f.shape[-1] == 3 * head.shape.hidden:  # catch-up: target-fed rows
            for q in range(ids.shape[1]):
                p = int(pos[0, q])
                if p + 1 < len(seq) - 1 and int(ids[0, q]) == int(seq[p + 1]):
                    torch.testing.assert_close(f[0, q], feats[0, p], atol=1e-4, rtol=1e-4)
                    want = torch.full((VOCAB,), float("-inf"))
                    want[head.hot_ids] = step0[p]
                    torch.testing.assert_close(logits[0, q], want, atol=1e-4, rtol=1e-4)
                    n_catch += 1
            prev_hidden, prev_pos = hidden[0, -1], int(pos[0, -1])
        else:  # a chain level: fed the previous row's output, one position further
            torch.testing.assert_close(f[0, 0], prev_hidden)
            assert int(pos[0, 0]) == prev_pos + 1
            prev_hidden, prev_pos = hidden[0, 0], int(pos[0, 0])
    assert n_catch >= len(out.rounds)  # every round's catch-up was checked


def test_mismatched_heads_are_refused():
    cfg = {"hidden_size": 64, "vocab_size": VOCAB, "num_hidden_layers": 4}
    good = {"hidden_size": 64, "vocab_size": VOCAB, "draft_vocab_size": 3, "eagle_config": {
        "eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}  # fmt: skip
    check_eagle3_config(good, cfg, torch.tensor([0, 4, 8]))
    with pytest.raises(ValueError, match="hidden_size 32"):
        check_eagle3_config({**good, "hidden_size": 32}, cfg)
    with pytest.raises(ValueError, match="eagle_aux_hidden_state_layer_ids"):
        check_eagle3_config({**good, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}, cfg)
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        check_eagle3_config(good, cfg, torch.tensor([0, 4, VOCAB]))
    with pytest.raises(ValueError, match="vocab_size"):
        check_eagle3_config({**good, "vocab_size": 10}, cfg)


def test_the_head_drafts_with_the_cpu_linear_rule(setup):
    """Every linear layer of the head the engine drafts with (fc, attention, MLP, lm_head) follows kernels/linear.py, as
    the target's do."""
    from sage_plugin.engines.lm import RowsLinear

    _, _, head = setup
    linears = [m for m in head.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 9 and all(type(m) is RowsLinear for m in linears)
