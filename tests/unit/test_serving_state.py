"""SlotState (per-slot SAGE state for serving runtimes): batched slot gathers equal one-request runs."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.config import SageConfig
from sage_plugin.core.controller import history_init, history_update
from sage_plugin.core.entropy import topk_confidence
from sage_plugin.core.policies import SagePolicy
from sage_plugin.core.serving import SlotState


def _one_request_plan(cfg, policy, hist, prev_alpha, probs):
    fresh = topk_confidence(probs.clamp(min=1e-30).log()[None], min(cfg.k, probs.shape[0]))
    alpha = fresh if cfg.alpha_source == "fresh" else prev_alpha
    if not cfg.use_entropy:
        alpha = torch.full_like(fresh, cfg.alpha_init)
    d, w = policy.shape(alpha, hist)
    return fresh, alpha, d, w.clamp(max=probs.shape[0])


@settings(max_examples=40, deadline=None)
@given(data=st.data(), slots=st.integers(1, 6), topk=st.integers(2, 6), rounds=st.integers(1, 25),
       source=st.sampled_from(["lag1", "fresh"]), use_history=st.booleans(), use_entropy=st.booleans())
def test_slot_state_equals_per_request_runs(data, slots, topk, rounds, source, use_history, use_entropy):
    cfg = SageConfig(alpha_source=source, use_history=use_history, use_entropy=use_entropy, history_window=3)
    state = SlotState(cfg, slots)
    policy = SagePolicy(cfg)
    ref = {}  # slot -> (history, prev_alpha)
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    for _ in range(rounds):
        batch = data.draw(st.lists(st.integers(0, slots - 1), min_size=1, max_size=slots, unique=True))
        idx = torch.tensor(batch)
        new = data.draw(st.lists(st.booleans(), min_size=len(batch), max_size=len(batch)))
        if any(new):  # prefilled requests take over their slots
            fresh_slots = torch.tensor([s for s, n in zip(batch, new) if n])
            state.reset(fresh_slots)
            for s in fresh_slots.tolist():
                ref[s] = (history_init(1, cfg.history_window, cfg.d_max), torch.tensor([cfg.alpha_init]))
        for s in batch:
            ref.setdefault(s, (history_init(1, cfg.history_window, cfg.d_max), torch.tensor([cfg.alpha_init])))
        probs = torch.softmax(torch.randn(len(batch), topk, generator=gen) * 3, -1).sort(-1, descending=True).values
        shape = state.plan(idx, probs)
        acc = torch.randint(1, 6, (len(batch),), generator=gen)
        state.observe(idx, acc)
        for i, s in enumerate(batch):
            hist, prev = ref[s]
            fresh, alpha, d, w = _one_request_plan(cfg, policy, hist, prev, probs[i])
            torch.testing.assert_close(shape.alpha[i : i + 1], alpha)
            assert int(shape.depth[i]) == int(d) and int(shape.width[i]) == int(w)
            if use_history:
                tau = acc[i : i + 1].float() - 1.0
                hist = history_update(hist, tau, lo=cfg.history_lo, hi=cfg.history_hi, step=cfg.history_step,
                                      d_min=cfg.d_min, d_cap=cfg.d_cap, full_window_cooldown=True)
            ref[s] = (hist, fresh)
    for s, (hist, _) in ref.items():
        assert int(state.history.d_max[s]) == int(hist.d_max[0])


def test_confident_root_plans_deep_and_narrow():
    cfg = SageConfig(alpha_source="fresh")
    state = SlotState(cfg, 2)
    shape = state.plan(torch.tensor([0, 1]), torch.tensor([[0.97, 0.01, 0.01, 0.01], [0.25, 0.25, 0.25, 0.25]]))
    assert shape.depth.tolist() == [7, 3] and shape.width.tolist() == [3, 4]
    assert shape.alpha[0] > 0.8 and shape.alpha[1] < 1e-6
