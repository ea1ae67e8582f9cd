"""The SGLang worker's per-step SAGE path is CUDA-graph-safe and sync-free, proved on the CPU.

The per-step path of the SAGE worker (``sage_plugin/runtimes/sglang/worker.py``; its SGLang-free part is
:mod:`sage_plugin.runtimes.sglang.selection`, run here as the worker runs it, ``graph_step.py``): a prefill resets
its slots (:meth:`SlotState.reset`); a decode step's draft forward (``SageDraftMixin.draft_forward``, the callable
SGLang's draft CUDA graph runner captures) runs :func:`planned_draft`: it plans every request's round
(:meth:`SlotState.plan`), writes D, W and the first-round flag into persistent ``[max_bs]`` buffers, turns SGLang's
``score_list`` / ``token_list`` / ``parents_list`` into the beam's candidates (:func:`eagle_beam_candidates`) and
chooses the verified nodes from the buffers (:func:`select_shaped`), then adds the real rows to the metrics and
writes each row's round record; after verify the accept lengths feed the slots' history (:meth:`SlotState.observe`).
The inputs are built as SGLang 0.5.23's draft loop builds them (``select_top_k_tokens``): top-``t`` of random draft
distributions, ``t = 4``, 1-6 steps, batch 1-8.

What is proved:

* no device -> host read and no data-dependent shape (:func:`graph_safe`, a ``TorchDispatchMode``): every aten op
  of the path is checked; ``aten._local_scalar_dense`` (``.item()``, ``int(t)``, ``if t:``), ``aten.equal``, the ops
  torch tags ``data_dependent_output`` / ``dynamic_output_shape`` (``nonzero``, ``masked_select``, the ``unique``
  family, ``repeat_interleave`` without ``output_size``, ...) and boolean-mask indexing (``aten.index.Tensor`` or
  ``index_put`` with a bool index) raise, so do a tensor built from host data inside the step (``torch.tensor(list)``:
  on a GPU a synchronous host -> device copy, refused during CUDA graph capture) and any op whose tensors sit on more
  than one device; ``Tensor.tolist`` / ``numpy``, which read CPU memory without the dispatcher, raise too;
* no stray CPU tensor: the same path under ``FakeTensorMode`` with every input and the slot state on ``cuda``
  (fake tensors: no GPU needed) keeps every result on ``cuda`` with the static shape and dtype the buffers expect;
* nothing of the capture-time values is baked into a graph and the state is only mutated in place: the reset, and
  the decode step (plan, buffers, selection, observe) as a function of its tensors (inputs, slot state, buffers),
  are captured with ``make_fx`` and replayed over several rounds with new slot ids, probabilities and accept
  lengths; every output and every state and buffer tensor equals an eager run's, round after round;
* SGLang's padded rows (the runner replays a captured batch size with rows past the real batch set to slot 0 and a
  zero ``topk_p``) count nowhere: the draft step on a padded batch, guarded, and a ``make_fx`` capture at the
  largest size replayed with 1 to 8 real rows give the real rows' outputs, round record, metrics and every slot's
  state but slot 0's of the raw batch, and the metrics equal each request's draft step alone, summed.

What only a GPU can check: a real ``torch.cuda.graph`` capture and replay of SGLang's draft step (its memory pool,
the persistent buffers' addresses), that the CUDA kernels behind ``sort`` / ``topk`` /
``scatter`` launch without an internal host sync, streams and the overlap scheduler, and NCCL under tensor
parallelism (``tests/integration/sglang``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from sage_plugin.serving.slots import SlotState

from .graph_step import (
    DEFAULTS,
    MAX_BS,
    NUM_SLOTS,
    SMALL,
    STATS_EXACT,
    STEP_OUTPUTS,
    SWITCHES,
    TOPK,
    Beam,
    assert_is_beam_tree,
    bind,
    bind_counters,
    bind_selection,
    copies,
    counter_buffers,
    decode_step,
    draft_step,
    n_select,
    new_counters,
    new_selection,
    observe_step,
    padded,
    random_round,
    selection_buffers,
    sglang_beam,
    state_tensors,
)

# fake "cuda" tensors query the CUDA runtime once; a driver older than torch's build only warns
pytestmark = pytest.mark.filterwarnings("ignore:CUDA initialization:UserWarning")
aten = torch.ops.aten


# -- the guard ----------------------------------------------------------------------------------------------------
class GraphUnsafe(AssertionError):
    """An op a captured CUDA graph cannot hold, or would replay with values frozen at capture."""


_HOST_READS = {aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default}
_HOST_DATA = {aten.lift_fresh.default, aten.lift_fresh_copy.default}
_INDEXING = {
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
    aten._unsafe_index.Tensor,
}
_DATA_TAGS = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)


def _problem(func, args, kwargs) -> str | None:
    """Why ``func(*args, **kwargs)`` cannot be in the per-step path, or None."""
    if func in _HOST_READS:
        return "reads a device value on the host"
    if func in _HOST_DATA:
        return "builds a tensor from host data (a host -> device copy per step, or a value frozen at capture)"
    if func in _INDEXING:
        masks = [i for i in args[1] if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]
        return "indexes with a boolean mask (output shape depends on the data)" if masks else None
    if func is aten.repeat_interleave.Tensor:
        return None if kwargs.get("output_size") is not None else "repeat_interleave without output_size"
    if func is aten.one_hot.default:
        return None if (args[1] if len(args) > 1 else kwargs.get("num_classes", -1)) >= 0 else "one_hot sizes by max"
    if any(tag in func.tags for tag in _DATA_TAGS):
        return "output shape or value depends on tensor data"
    return None


class GraphSafetyMode(TorchDispatchMode):
    """Raises :class:`GraphUnsafe` on any op of :func:`_problem` or whose tensors span devices; records the ops."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = _problem(func, args, kwargs)
        if why is not None:
            raise GraphUnsafe(f"{func}: {why}")
        out = func(*args, **kwargs)
        devices = {t.device for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)}
        if len(devices) > 1:
            # a copy between host and device, or a CPU scalar read at launch (a graph would freeze its value)
            raise GraphUnsafe(f"{func}: mixes devices {sorted(map(str, devices))}")
        self.ops.add(func.overloadpacket.__name__)
        return out


@contextlib.contextmanager
def graph_safe():
    """:class:`GraphSafetyMode`, plus ``Tensor.tolist`` / ``numpy`` / ``__array__`` (which bypass the dispatcher)."""
    names = ("tolist", "numpy", "__array__")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def refuse(*_, **__):
        raise GraphUnsafe("reads a tensor's values on the host (Tensor.tolist / numpy)")

    mode = GraphSafetyMode()
    try:
        for n in names:
            setattr(torch.Tensor, n, refuse)
        with mode:
            yield mode
    finally:
        for n, fn in saved.items():
            setattr(torch.Tensor, n, fn)


# -- (a) no sync, no data-dependent shape ---------------------------------------------------------------------------
@st.composite
def configs(draw):
    base = draw(st.sampled_from([SMALL, DEFAULTS]))
    changes = {k: draw(st.sampled_from(v)) for k, v in SWITCHES.items()}
    return base.replace(**changes, history_window=draw(st.integers(1, 3)))


@settings(max_examples=40, deadline=None)
@given(cfg=configs(), bsz=st.integers(1, MAX_BS), steps=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_per_step_path_has_no_host_sync_and_static_shapes(cfg, bsz, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    state, sel, counters = SlotState(cfg, NUM_SLOTS), new_selection(cfg), new_counters()
    rounds = [random_round(gen, bsz, steps, torch.arange(NUM_SLOTS)) for _ in range(4)]
    resets = [slots[: (bsz + 1) // 2] if r % 2 == 0 else slots[:0] for r, (slots, _, _) in enumerate(rounds)]
    outs = []
    with graph_safe() as mode:
        for (slots, beam, accept), fresh in zip(rounds, resets):
            if fresh.numel():  # prefills take over some slots
                state.reset(fresh)
            outs.append(decode_step(state, sel, counters, slots, beam, accept, n_select(cfg, steps) + 1))
    assert {"index_copy_", "index_fill_", "topk", "sort", "gather", "scatter_add_", "where"} <= mode.ops
    observed = set()  # slots that finished a round since their reset
    for (slots, beam, _), fresh, (alpha, depth, width, first, _, index, tokens) in zip(rounds, resets, outs):
        assert index.shape == tokens.shape == (bsz, n_select(cfg, steps))
        assert_is_beam_tree(index, beam)
        assert torch.equal(tokens, torch.cat(beam.token_list, 1).gather(1, index))
        assert bool(((depth >= 1) & (width >= 1) & (width <= TOPK)).all())
        assert bool(((alpha >= 0) & (alpha <= 1)).all())
        observed -= set(fresh.tolist())
        assert first.tolist() == [cfg.first_round_static and s not in observed for s in slots.tolist()]
        observed |= set(slots.tolist())


HOST_READ, DATA_SHAPE, MASK, HOST_DATA = "on the host", "depends on tensor data", "boolean mask", "host data"
GUARD_CASES = {
    "item": (lambda x, m: x[0].item(), HOST_READ),
    "if tensor": (lambda x, m: 1 if x.sum() else 0, HOST_READ),
    "int()": (lambda x, m: int(x[0]), HOST_READ),
    "tolist": (lambda x, m: x.tolist(), HOST_READ),
    "numpy": (lambda x, m: x.numpy(), HOST_READ),
    "equal": (lambda x, m: torch.equal(x, x), HOST_READ),
    "nonzero": (lambda x, m: torch.nonzero(m), DATA_SHAPE),
    "where(mask)": (lambda x, m: torch.where(m), DATA_SHAPE),
    "masked_select": (lambda x, m: torch.masked_select(x, m), DATA_SHAPE),
    "unique": (lambda x, m: torch.unique(x), DATA_SHAPE),
    "unique_consecutive": (lambda x, m: torch.unique_consecutive(x), DATA_SHAPE),
    "bincount": (lambda x, m: torch.bincount(x), DATA_SHAPE),
    "repeat_interleave": (lambda x, m: torch.repeat_interleave(x, x), "output_size"),
    "mask index": (lambda x, m: x[m], MASK),
    "mask assign": (lambda x, m: x.clone().index_put_((m,), x[:1]), MASK),
    "torch.tensor": (lambda x, m: x + torch.tensor([1, 2, 3, 4]), HOST_DATA),
}


@pytest.mark.parametrize("name", GUARD_CASES)
def test_the_guard_refuses_each_kind_of_sync(name):
    x, m = torch.tensor([3, 1, 2, 2]), torch.tensor([True, False, True, False])
    fn, reason = GUARD_CASES[name]
    with pytest.raises(GraphUnsafe, match=reason), graph_safe():
        fn(x, m)


def test_the_guard_lets_static_indexing_through_and_catches_device_moves():
    x, idx = torch.arange(8), torch.tensor([5, 1])
    with graph_safe() as mode:
        got = (x[idx], x.index_select(0, idx), torch.repeat_interleave(idx, idx, output_size=6), x.sort().values)
    assert got[0].tolist() == got[1].tolist() == [5, 1] and got[2].tolist() == [5] * 5 + [1]
    assert {"index", "index_select", "repeat_interleave", "sort"} <= mode.ops
    with FakeTensorMode(allow_non_fake_inputs=False):
        y = torch.zeros(4, device="cuda")
        for move in (lambda: y.cpu(), lambda: torch.tensor([1.0], device="cuda"), lambda: torch.ones(4).to(y)):
            with pytest.raises(GraphUnsafe, match="mixes devices|host data"), graph_safe():
                move()


# -- (b) everything on the device -------------------------------------------------------------------------------
@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(cfg=configs(), bsz=st.integers(1, MAX_BS), steps=st.integers(1, 6))
def test_per_step_path_on_fake_cuda_keeps_every_tensor_on_the_device(cfg, bsz, steps):
    n = n_select(cfg, steps)
    with FakeTensorMode(allow_non_fake_inputs=False):
        state, sel, counters = SlotState(cfg, NUM_SLOTS, "cuda"), new_selection(cfg, "cuda"), new_counters("cuda")
        buffers = selection_buffers(sel) + counter_buffers(counters)
        before = [(t.shape, t.dtype) for t in state_tensors(state) + buffers]
        rounds = []
        for _ in range(3):
            slots = torch.randperm(NUM_SLOTS, device="cuda")[:bsz]
            rounds.append((slots, sglang_beam(bsz, steps, device="cuda"), torch.randint(1, 5, (bsz,), device="cuda")))
        with graph_safe():
            state.reset(rounds[0][0])
            outs = [decode_step(state, sel, counters, *r, n + 1) for r in rounds]
    expected = [
        ((bsz,), torch.float32),
        ((bsz,), torch.int64),
        ((bsz,), torch.int64),
        ((bsz,), torch.bool),
        ((bsz, 0 if steps == 1 else 1 + (steps - 1) * TOPK), torch.int64),
        ((bsz, n), torch.int64),
        ((bsz, n), torch.int64),
    ]
    for out in outs:
        assert [(tuple(t.shape), t.dtype) for t in out] == expected
    after = state_tensors(state) + selection_buffers(sel) + counter_buffers(counters)
    assert [(t.shape, t.dtype) for t in after] == before
    for t in [*after, *(t for out in outs for t in out)]:
        assert isinstance(t, FakeTensor) and t.device.type == "cuda"


# -- (c) captured graphs replay with new inputs --------------------------------------------------------------------
GRAPH_CASES = {
    "small": (SMALL.replace(history_window=2), 4, 4),
    "defaults": (DEFAULTS, 3, 6),
    "small-static-relative": (
        SMALL.replace(
            first_round_static=True,
            history_window=2,
            history_mode="relative",
            history_cooldown="none",
            alpha_source="fresh",
            history_tau="drafts_plus_bonus",
            prob_space="topk",
            threshold_on="joint",
        ),
        8,
        3,
    ),
    "small-parent-order": (SMALL.replace(budget_order="parent_order", parent_prob="joint", rounding="ceil"), 1, 5),
}
RESETS = 1  # slots a prefill resets in the captured reset graph


def unpack(flat, template: SlotState, sel_template, steps: int, n_beam: int):
    """``(beam, state, selection, counters)`` bound to a captured graph's flat inputs ``flat`` (the beam's tensors, then
    the state's, the selection's buffers and the counters')."""
    n_state, n_sel = len(state_tensors(template)), len(selection_buffers(sel_template))
    a, b = n_beam + n_state, n_beam + n_state + n_sel
    beam = Beam.of(list(flat[:n_beam]), steps)
    state = bind(template, list(flat[n_beam:a]))
    return beam, state, bind_selection(sel_template, list(flat[a:b])), bind_counters(list(flat[b:]))


def slot_pool(bsz: int, first: int) -> torch.Tensor:
    """``bsz + 1`` consecutive slot ids from ``first``: every round but one slot, so requests come back."""
    return torch.arange(first, first + bsz + 1)


@functools.cache
def captured(case: str):
    """``(reset graph, decode-step graph)`` of a case, captured with ``make_fx`` on a fresh state."""
    cfg, bsz, steps = GRAPH_CASES[case]
    template, num_draft = SlotState(cfg, NUM_SLOTS), n_select(cfg, steps) + 1
    sel_template = new_selection(cfg)
    n_beam = len(sglang_beam(bsz, steps).tensors())

    def reset(slots, *state):
        bind(template, list(state)).reset(slots)
        return state

    def step(slots, accept_lens, *rest):
        beam, state, sel, counters = unpack(rest, template, sel_template, steps, n_beam)
        return decode_step(state, sel, counters, slots, beam, accept_lens, num_draft)

    gen = torch.Generator().manual_seed(0)
    slots, beam, accept = random_round(gen, bsz, steps, slot_pool(bsz, NUM_SLOTS - bsz - 1))  # the top slots
    reset_graph = make_fx(reset)(slots[:RESETS], *state_tensors(SlotState(cfg, NUM_SLOTS)))
    step_graph = make_fx(step)(
        slots,
        accept,
        *beam.tensors(),
        *state_tensors(SlotState(cfg, NUM_SLOTS)),
        *selection_buffers(new_selection(cfg)),
        *counter_buffers(new_counters()),
    )
    for graph in (reset_graph, step_graph):
        targets = {n.target for n in graph.graph.nodes if n.op == "call_function"}
        assert not targets & (_HOST_READS | _HOST_DATA), targets & (_HOST_READS | _HOST_DATA)
    return reset_graph, step_graph


@pytest.mark.slow
@pytest.mark.parametrize("case", GRAPH_CASES)
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**16), first_slot=st.integers(0, NUM_SLOTS - MAX_BS - 1))
def test_captured_step_replays_with_new_inputs_like_eager(case, seed, first_slot):
    cfg, bsz, steps = GRAPH_CASES[case]
    reset_graph, step_graph = captured(case)
    gen = torch.Generator().manual_seed(seed)
    eager, eager_sel, eager_counters = SlotState(cfg, NUM_SLOTS), new_selection(cfg), new_counters()
    eager_buffers = selection_buffers(eager_sel) + counter_buffers(eager_counters)
    replay = [t.clone() for t in state_tensors(eager)]
    replay_buffers = selection_buffers(new_selection(cfg)) + counter_buffers(new_counters())
    num_draft = n_select(cfg, steps) + 1
    seen_index, seen_alpha = set(), set()  # selections, and the slots' alphas (lag1: the next round's)
    longest, prev = 0, None  # the longest history a slot reached; the previous round's slots
    for r in range(8):
        slots, beam, accept = random_round(gen, bsz, steps, slot_pool(bsz, first_slot))
        if r == 2:  # round 1's requests come back (no reset since): some slot's history spans two rounds
            slots = prev[torch.randperm(bsz, generator=gen)]
        prev = slots
        if r % 3 == 0:
            eager.reset(slots[:RESETS])
            reset_graph(slots[:RESETS], *replay)
        want = decode_step(eager, eager_sel, eager_counters, slots, beam, accept, num_draft)
        got = step_graph(slots, accept, *beam.tensors(), *replay, *replay_buffers)
        assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want)), f"round {r}"
        for g, w in zip(replay + replay_buffers, state_tensors(eager) + eager_buffers):
            assert torch.equal(g, w), f"state after round {r}"
        seen_index.add(tuple(want[5].flatten().tolist()))
        seen_alpha.add(tuple(eager.alpha.tolist()))
        longest = max(longest, int(eager.history.count.max()))
    # the rounds differ, so values frozen at capture would have shown, and a slot's history ran over rounds
    assert len(seen_index) > 1 and len(seen_alpha) > 1
    assert longest >= 2


# -- (d) SGLang's padded rows --------------------------------------------------------------------------------------


def assert_same_stats(got: torch.Tensor, want: torch.Tensor) -> None:
    exact = [i for i in STATS_EXACT if i < got.shape[0]]  # the draft step's sums alone ([:5]) or all of them
    assert torch.equal(got[exact], want[exact]), (got, want)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def real_round(gen: torch.Generator, bsz: int, steps: int):
    """A decode step's batch of real requests: slots from 1 (SGLang keeps slot 0 for padding)."""
    return random_round(gen, bsz, steps, torch.arange(1, NUM_SLOTS))


def one_by_one(state: SlotState, sel, slots, beam: Beam, num_draft: int) -> tuple[torch.Tensor, list]:
    """Each request alone from ``state`` (untouched): the stats it adds ``[5]`` and its draft step's outputs."""
    total, outs = torch.zeros(5, dtype=torch.float64), []
    for i in range(slots.shape[0]):
        alone, one_sel, counters = copies(state, sel, new_counters())
        rows = Beam.of([t[i : i + 1] for t in beam.tensors()], len(beam.score_list))
        outs.append(draft_step(alone, one_sel, counters, slots[i : i + 1], rows, num_draft))
        alpha, depth, width = (float(t[0]) for t in outs[-1][:3])
        row = torch.tensor([1.0, alpha, depth, width, float(one_sel.shaped[0])], dtype=torch.float64)
        assert torch.equal(counters.stats[:5], row)  # a request alone counts its own plan, once
        total += row
    return total, outs


@settings(max_examples=25, deadline=None)
@given(cfg=configs(), bsz=st.integers(1, MAX_BS - 1), pad=st.integers(1, MAX_BS), steps=st.integers(1, 6),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_padded_rows_count_nowhere_and_real_rows_equal_the_raw_batch(cfg, bsz, pad, steps, seed):
    """The draft step (:func:`planned_draft` around the selection) on SGLang's padded batch (captured size
    ``bsz + pad``, padded rows slot 0 with a zero ``topk_p``), guarded: the real rows' outputs, the round record, the
    stats and every slot's state but slot 0's equal the raw batch's; the stats equal each request's alone, summed."""
    gen, bs, num_draft = torch.Generator().manual_seed(seed), min(bsz + pad, MAX_BS), n_select(cfg, steps) + 1
    raw, raw_sel, raw_counters = SlotState(cfg, NUM_SLOTS), new_selection(cfg), new_counters()
    pad_state, pad_sel, pad_counters = (
        bind(raw, [t.clone() for t in state_tensors(raw)]),
        new_selection(cfg),
        new_counters(),
    )
    for _ in range(3):  # later rounds plan from a history (lag1 alpha, D_max)
        slots, beam, accept = real_round(gen, bsz, steps)
        naive, alone = one_by_one(raw, raw_sel, slots, beam, num_draft)
        before = raw_counters.stats.clone()
        want = draft_step(raw, raw_sel, raw_counters, slots, beam, num_draft)
        with graph_safe():
            got = draft_step(pad_state, pad_sel, pad_counters, *padded(slots, beam, bs, gen), num_draft)
        for name, g, w in zip(STEP_OUTPUTS, got, want):
            assert g.shape[0] == bs and torch.equal(g[:bsz], w), name
        for i, one in enumerate(alone):  # the rows are independent: each request's draft step is its own
            assert all(torch.equal(a[0], w[i]) for a, w in zip(one, want))
        assert torch.equal(pad_counters.rounds[:bsz], raw_counters.rounds[:bsz])
        assert_same_stats(pad_counters.stats, raw_counters.stats)
        assert_same_stats(raw_counters.stats[:5] - before[:5], naive)
        for counters in (raw_counters, pad_counters):  # the worker observes the raw batch, eagerly
            observe_step(raw if counters is raw_counters else pad_state, counters, slots, accept)
        for g, w in zip(state_tensors(pad_state), state_tensors(raw)):
            assert torch.equal(g[1:], w[1:])  # slot 0 is the padding's
    assert_same_stats(pad_counters.stats, raw_counters.stats)


def test_captured_draft_step_replays_padded_batches_like_the_raw_batch():
    """The draft step captured (``make_fx``) at the batch size SGLang's runner captures, replayed with padded
    batches of 1 to ``MAX_BS`` real rows: real rows, round record, stats and state (but slot 0) as eager on the raw
    batch, round after round."""
    cfg, steps = DEFAULTS, 6
    num_draft, n_beam = n_select(cfg, steps) + 1, len(sglang_beam(MAX_BS, steps).tensors())
    template, sel_template = SlotState(cfg, NUM_SLOTS), new_selection(cfg)

    def step(slots, *rest):
        beam, state, sel, counters = unpack(rest, template, sel_template, steps, n_beam)
        return draft_step(state, sel, counters, slots, beam, num_draft)

    gen = torch.Generator().manual_seed(3)
    slots, beam, _ = real_round(gen, MAX_BS, steps)
    graph = make_fx(step)(slots, *beam.tensors(), *state_tensors(template), *selection_buffers(sel_template),
                          *counter_buffers(new_counters()))  # fmt: skip
    eager, eager_sel, eager_counters = SlotState(cfg, NUM_SLOTS), new_selection(cfg), new_counters()
    state, sel, counters = (
        [t.clone() for t in state_tensors(eager)],
        selection_buffers(new_selection(cfg)),
        new_counters(),
    )
    sizes = [1, MAX_BS, 3, MAX_BS - 1, 2, 5, 1, MAX_BS]
    for r, bsz in enumerate(sizes):
        slots, beam, accept = real_round(gen, bsz, steps)
        want = draft_step(eager, eager_sel, eager_counters, slots, beam, num_draft)
        pad_slots, pad_beam = padded(slots, beam, MAX_BS, gen)
        got = graph(pad_slots, *pad_beam.tensors(), *state, *sel, *counter_buffers(counters))
        for name, g, w in zip(STEP_OUTPUTS, got, want):
            assert torch.equal(g[:bsz], w), f"round {r}: {name}"
        assert torch.equal(counters.rounds[:bsz], eager_counters.rounds[:bsz]), f"round {r}"
        assert_same_stats(counters.stats, eager_counters.stats)
        observe_step(eager, eager_counters, slots, accept)
        observe_step(bind(template, state), counters, slots, accept)
        for g, w in zip(state, state_tensors(eager)):
            assert torch.equal(g[1:], w[1:]), f"state after round {r}"
    assert eager_counters.stats[0] == sum(sizes)  # every real row, no padded one


def test_the_gpu_script_dry_runs_its_plan_in_graph_part_on_cpu(tmp_path):
    """``tools/gpu_step_graph.py`` (run on a lent GPU, not in CI) imports and runs its new parts' plumbing on CPU."""
    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, str(repo / "tools" / "gpu_step_graph.py"), "--device", "cpu", "--rounds", "5",
           "--iters", "2", "--batch-sizes", "1", "8", "--out", str(tmp_path)]  # fmt: skip
    run = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "gpu_plan_in_graph.json").read_text())
    assert report["padded_cases"] == 4 and report["failures"] == []
    assert [r["batch_size"] for r in report["timing"]] == [1, 8]
