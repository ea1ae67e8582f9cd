"""SlotState (per-slot SAGE state for serving runtimes): batched slot gathers equal one-request runs."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.config import AlgorithmConfig
from sage_plugin.serving.slots import SlotState
from tests.oracles import Margin, history_init_ref, history_update_ref, plan_ref


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    slots=st.integers(1, 6),
    topk=st.integers(2, 6),
    rounds=st.integers(1, 25),
    source=st.sampled_from(["lag1", "fresh"]),
    use_history=st.booleans(),
    use_entropy=st.booleans(),
)
def test_slot_state_equals_per_request_runs(data, slots, topk, rounds, source, use_history, use_entropy):
    cfg = AlgorithmConfig(
        alpha_source=source,
        use_history=use_history,
        use_entropy=use_entropy,
        history_window=3,
        first_round_static=data.draw(st.booleans()),
    )
    state = SlotState(cfg, slots)
    ref = {}  # slot -> (HistoryRef, carried alpha): the naive per-request oracle
    observed = set()  # slots that finished a round since their reset
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    for _ in range(rounds):
        batch = data.draw(st.lists(st.integers(0, slots - 1), min_size=1, max_size=slots, unique=True))
        idx = torch.tensor(batch)
        new = data.draw(st.lists(st.booleans(), min_size=len(batch), max_size=len(batch)))
        if any(new):  # prefilled requests take over their slots
            fresh_slots = [s for s, n in zip(batch, new) if n]
            state.reset(torch.tensor(fresh_slots))
            for s in fresh_slots:
                ref[s] = (history_init_ref(cfg.d_max), cfg.alpha_init)
                observed.discard(s)
        for s in batch:
            ref.setdefault(s, (history_init_ref(cfg.d_max), cfg.alpha_init))
        probs = torch.softmax(torch.randn(len(batch), topk, generator=gen) * 3, -1).sort(-1, descending=True).values
        shape = state.plan(idx, probs)
        acc = torch.randint(1, 6, (len(batch),), generator=gen)
        state.observe(idx, acc)
        for i, s in enumerate(batch):
            hist, carried = ref[s]
            m = Margin()
            d, w, alpha, fresh = plan_ref(cfg, carried, probs[i].double().tolist(), hist.d_max, m, k=min(cfg.k, topk))
            assert abs(float(shape.alpha[i]) - alpha) < 1e-5
            assert bool(shape.first_round[i]) == (cfg.first_round_static and s not in observed)
            observed.add(s)
            if m.value > 1e-4:  # the plan's roundings are not within float noise of a boundary
                assert int(shape.depth[i]) == d and int(shape.width[i]) == min(w, topk)
            if use_history:
                hist = history_update_ref(
                    hist,
                    int(acc[i]) - 1,
                    window=cfg.history_window,
                    lo=cfg.history_lo,
                    hi=cfg.history_hi,
                    step=cfg.history_step,
                    d_min=cfg.d_min,
                    d_cap=cfg.d_cap,
                    full_window_cooldown=True,
                )
            ref[s] = (hist, fresh)
    for s, (hist, _) in ref.items():
        assert int(state.history.d_max[s]) == hist.d_max


def test_confident_root_plans_deep_and_narrow():
    cfg = AlgorithmConfig(alpha_source="fresh")
    state = SlotState(cfg, 2)
    shape = state.plan(torch.tensor([0, 1]), torch.tensor([[0.97, 0.01, 0.01, 0.01], [0.25, 0.25, 0.25, 0.25]]))
    assert shape.depth.tolist() == [7, 3] and shape.width.tolist() == [3, 4]
    assert shape.alpha[0] > 0.8 and shape.alpha[1] < 1e-6
