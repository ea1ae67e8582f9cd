"""Tiers inside SGLang's adaptive machinery, without a server: recording fakes stand in for the worker's capture.

* :class:`SageTierController` builds one runtime state per tier through the worker's ``build_adaptive_runtime_state``
  (SGLang's own capture path), keyed by ``(steps, draft_tokens)``, switches by reference and counts switches;
* the SAGE draft worker's ``_capture_cuda_graphs`` (the method SGLang calls for the start-up capture and for every
  tier's) runs with SAGE's selection active, so no tier captures upstream's selection;
* the round's plan is inside what the draft graph captures: SGLang's runner captures the worker's ``draft_forward``
  on its static buffers, and SAGE's ``draft_forward`` plans from them, loads the selection's buffers and counts the
  metrics; replayed with a padded batch, the plan follows the new values and the metrics count the real rows only;
  the eager step plans exactly once (``draft`` itself no longer plans);
* the KV bound SAGE declares (``resolve_max_speculative_num_draft_tokens``) covers every tier's per-step allocation,
  so the reservation SGLang makes before the worker picks a tier is never short.

The end-to-end run (a CPU server cycling tiers, outputs equal to plain, KV pool back to its start) is
``test_e2e_serving.py::test_tiers_cycle_and_equal_plain``; real CUDA graph capture needs a GPU (``docs/design/sglang-internals.md``).
"""

from __future__ import annotations

import inspect
import types

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402
from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState  # noqa: E402
from sglang.srt.speculative.base_spec_worker import EagleDraftWorkerBase  # noqa: E402

from sage_plugin.config import SageConfig  # noqa: E402
from sage_plugin.runtimes.sglang import hooks  # noqa: E402
from sage_plugin.runtimes.sglang.algo import SageSpecAlgo, sage_worker_factory  # noqa: E402
from sage_plugin.runtimes.sglang.args import STASH_ATTR, SageCliArgs, spec_sizes  # noqa: E402
from sage_plugin.runtimes.sglang.hooks import ACTIVE_SELECTION  # noqa: E402
from sage_plugin.runtimes.sglang.tiers import SageTierController  # noqa: E402
from sage_plugin.runtimes.sglang.worker import SageDraftMixin  # noqa: E402
from sage_plugin.serving.slots import SlotState  # noqa: E402
from sage_plugin.serving.tiers import Tier, TierChooser, parse_tiers  # noqa: E402

TIERS = ((0, 1), (3, 5), (4, 8), (6, 11))


def _state(steps: int, n: int) -> SpecRuntimeState:
    return SpecRuntimeState(steps, n, object(), None, object(), None, object(), None)


class RecordingWorker:
    """``build_adaptive_runtime_state`` / ``apply_runtime_state`` as SGLang's worker exposes them, recorded."""

    def __init__(self, steps: int, n: int) -> None:
        self.speculative_num_steps, self.speculative_num_draft_tokens = steps, n
        self.built: list[tuple[int, int, object]] = []
        self.applied: list[tuple[int, int]] = []

    def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None):
        self.built.append((speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs))
        return _state(speculative_num_steps, speculative_num_draft_tokens)

    def apply_runtime_state(self, state: SpecRuntimeState) -> None:
        self.speculative_num_steps = state.speculative_num_steps
        self.speculative_num_draft_tokens = state.speculative_num_draft_tokens
        self.applied.append((state.speculative_num_steps, state.speculative_num_draft_tokens))


def test_controller_builds_every_tier_once_and_switches_by_tier():
    tiers = parse_tiers(TIERS)
    worker = RecordingWorker(6, 11)  # the start-up shape: the largest tier
    ctrl = SageTierController(worker, TierChooser(tiers, probe_every=0, unpriced_first=0))  # warm-up: test_tiers.py
    ctrl.register(_state(6, 11))  # what EAGLEWorkerV2.init_cuda_graphs registers first
    ctrl.init_states(cuda_graph_bs=[1, 2, 4])
    assert sorted(worker.built) == [(0, 1, [1, 2, 4]), (3, 5, [1, 2, 4]), (4, 8, [1, 2, 4])]
    # the chooser prices a batch at the captured size SGLang's runners pad it to (3 requests run as 4)
    assert [ctrl.chooser.size_class(b) for b in (1, 3, 4, 5)] == [1, 4, 4, 5]
    assert ctrl.active == Tier(6, 11) and worker.applied[-1] == (6, 11)
    # every tier is measured first at a new batch size (largest first), then the best rate wins
    seen = []
    for _ in range(len(tiers)):
        ctrl.activate_step_by_batch(2)
        seen.append(ctrl.active)
        ctrl.chooser.record_cost(ctrl.active, 2, {0: 0.1, 3: 0.12, 4: 0.13, 6: 0.3}[ctrl.active.steps])
        ctrl.on_verify_complete([ctrl.active.steps // 2] * 2, batch_size=2)
    assert seen == sorted(tiers, reverse=True)
    ctrl.activate_step_by_batch(2)  # rates: off 20, 3:5 2.5/0.12 -> 41.7, 4:8 3/0.13 -> 46.2, 6:11 4/0.3 -> 26.7
    assert ctrl.active == Tier(4, 8) and worker.applied[-1] == (4, 8)
    assert ctrl.switches == len(worker.applied) - 1  # the start-up activation is not a switch


def test_without_captured_decode_graphs_every_batch_size_is_priced_on_its_own():
    ctrl = SageTierController(RecordingWorker(4, 8), TierChooser(parse_tiers(TIERS), probe_every=0))
    ctrl.register(_state(6, 11))
    ctrl.init_states(cuda_graph_bs=None)  # what EAGLEWorkerV2.init_cuda_graphs passes with decode graphs disabled (CPU)
    assert [ctrl.chooser.size_class(b) for b in (1, 3, 5)] == [1, 3, 5]


def test_a_missing_tier_state_is_one_clear_error():
    ctrl = SageTierController(RecordingWorker(4, 8), TierChooser(parse_tiers(((4, 8),))))
    with pytest.raises(ValueError, match="no runtime state built for SAGE tier"):
        ctrl._activate(Tier(4, 8))


def test_every_capture_runs_with_sages_selection():
    """SGLang's capture entry point on a SAGE draft worker sets the selection around upstream's capture."""
    captured = []

    class UpstreamDraft(EagleDraftWorkerBase):  # stands in for EagleDraftWorker: records what a capture would see
        def _capture_cuda_graphs(self):
            captured.append(ACTIVE_SELECTION.get())

        def draft(self):
            raise AssertionError("not drafted here")

        def draft_extend(self):
            raise AssertionError("not drafted here")

    class RecordingSageDraft(SageDraftMixin, UpstreamDraft):
        pass

    draft = RecordingSageDraft()
    with get_parallel().override(tp_group=types.SimpleNamespace(world_size=1)):  # one rank, as SGLang builds it
        draft.init_sage(SageConfig(k=4, w_max=4))
    assert draft.sage_tp is None  # no tree broadcast with one rank
    draft.topk, draft.device = 4, "cpu"
    draft.req_to_token_pool = types.SimpleNamespace(size=8)
    for _ in range(3):  # start-up, then one capture per tier (build_adaptive_runtime_state)
        draft._capture_cuda_graphs()
    assert captured == [draft.sage_selection] * 3 and draft.sage_selection is not None
    assert ACTIVE_SELECTION.get() is None  # reset after each capture


TOPK, CAPTURE_BS, POOL = 4, (1, 2, 4), 8


def _forward_batch(slots: torch.Tensor, topk_p: torch.Tensor, mode: ForwardMode = ForwardMode.DECODE):
    """What the draft forward reads of SGLang's ``ForwardBatch`` (and of its ``ScheduleBatch``, eager)."""
    return types.SimpleNamespace(
        forward_mode=mode, req_pool_indices=slots, spec_info=types.SimpleNamespace(topk_p=topk_p)
    )


class GraphRunnerDraft(EagleDraftWorkerBase):
    """Stands in for SGLang's ``EagleDraftWorker`` and its draft CUDA graph runner, recording what each sees.

    ``draft_forward`` is upstream's draft step reduced to its end (one beam step over the root's ``topk_p``, then
    ``organize_draft_results`` through SAGE's hook); it records the active selection and the buffers the selection
    reads.  ``_capture_cuda_graphs`` does what ``EagleDraftCudaGraphRunner.capture_one_shape`` does: for each batch
    size, a forward batch over slices of static buffers (zeros), a warm-up run of ``draft_forward`` and the callable
    kept as the "graph".  ``draft`` replays the smallest graph that fits, as ``execute`` does (the real rows copied
    into the static buffers, the rest slot 0 and zero ``topk_p``), or, with no graphs, calls ``draft_forward``."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.graphs: dict[int, object] = {}

    def draft_forward(self, forward_batch):
        topk_p = forward_batch.spec_info.topk_p
        bs, sel = topk_p.shape[0], ACTIVE_SELECTION.get()
        self.seen.append({"selection": sel, "bs": bs, "depth": sel.depth[:bs].clone(), "width": sel.width[:bs].clone()})
        parents = torch.arange(-1, TOPK).expand(bs, -1)
        tokens = torch.arange(TOPK).expand(bs, -1) + 10 * forward_batch.req_pool_indices[:, None]

        def upstream(*_):
            raise AssertionError("SGLang's own selection ran")

        return hooks.organize_draft_results(upstream, [topk_p.unsqueeze(1)], [tokens], [parents], TOPK + 1)

    def _capture_cuda_graphs(self):
        self.static_slots = torch.zeros(max(CAPTURE_BS), dtype=torch.int64)
        self.static_topk_p = torch.zeros(max(CAPTURE_BS), TOPK)
        for bs in CAPTURE_BS:
            fb = _forward_batch(self.static_slots[:bs], self.static_topk_p[:bs])
            self.draft_forward(fb)  # warm-up
            self.graphs[bs] = lambda fb=fb: self.draft_forward(fb)

    def draft(self, batch, *, with_topology=False):
        raw = batch.req_pool_indices.shape[0]
        if not self.graphs:
            return self.draft_forward(batch)
        bs = min(b for b in self.graphs if b >= raw)
        self.static_slots.zero_()
        self.static_topk_p.zero_()
        self.static_slots[:raw].copy_(batch.req_pool_indices)
        self.static_topk_p[:raw].copy_(batch.spec_info.topk_p)
        return [t[:raw] for t in self.graphs[bs]()]

    def draft_extend(self):
        raise AssertionError("not drafted here")


class SageGraphRunnerDraft(SageDraftMixin, GraphRunnerDraft):
    pass


def _sage_draft(cfg: SageConfig) -> SageGraphRunnerDraft:
    draft = SageGraphRunnerDraft()
    with get_parallel().override(tp_group=types.SimpleNamespace(world_size=1)):
        draft.init_sage(cfg)
    draft.topk, draft.device = TOPK, "cpu"
    draft.req_to_token_pool = types.SimpleNamespace(size=POOL)
    return draft


def _count_plans(draft: SageGraphRunnerDraft) -> list[int]:
    draft._ensure_sage_state()
    calls, plan = [], draft.sage_slots.plan

    def counted(slots, topk_p):
        calls.append(slots.shape[0])
        return plan(slots, topk_p)

    draft.sage_slots.plan = counted
    return calls


def _root(gen: torch.Generator, bs: int) -> torch.Tensor:
    """``[bs, TOPK]`` descending top probabilities of random draft distributions (each row its own sharpness)."""
    logits = torch.randn(bs, 32, generator=gen) * (torch.rand(bs, 1, generator=gen) * 6 + 0.2)
    return torch.topk(torch.softmax(logits, -1), TOPK, dim=-1).values


@pytest.mark.parametrize("graphs", [True, False], ids=["captured", "eager"])
def test_the_plan_runs_inside_the_captured_draft_forward_once_per_step(graphs):
    """SAGE's plan, load and metrics are in ``draft_forward`` (what SGLang's runner captures): a capture's warm-up
    plans from the static buffers, a replay plans the step's batch padded to the graph's size, and the metrics,
    ``sage_round`` and ``sage_stats()`` count the real rows only, exactly as a naive per-request count."""
    cfg = SageConfig(k=4, w_max=4, alpha_source="fresh", first_round_static=False)
    draft = _sage_draft(cfg)
    if graphs:
        draft._capture_cuda_graphs()
        assert [s["bs"] for s in draft.seen] == list(CAPTURE_BS)
        assert all(s["selection"] is draft.sage_selection for s in draft.seen)  # selection active at every capture
        assert draft.sage_counters.stats.tolist() == [0.0] * 6  # the capture batch is all padding
        draft.seen.clear()
    calls = _count_plans(draft)
    twin = SlotState(cfg.algorithm, POOL + 1)  # an independent plan of every step's real rows
    gen, rounds, alpha_sum, depth_sum, planned = torch.Generator().manual_seed(0), 0, 0.0, 0.0, []
    for raw in [3, 1, 4, 2]:
        slots = torch.randperm(POOL, generator=gen)[:raw] + 1  # SGLang's slots start at 1
        batch = _forward_batch(slots, _root(gen, raw))
        out = draft.draft(batch)
        want = twin.plan(slots, batch.spec_info.topk_p)
        padded_bs = min(b for b in CAPTURE_BS if b >= raw) if graphs else raw
        planned.append(padded_bs)
        assert calls == planned  # one plan a step, inside draft_forward, at the graph's size
        seen = draft.seen[-1]
        assert seen["selection"] is draft.sage_selection and seen["bs"] == padded_bs
        assert torch.equal(seen["depth"][:raw], want.depth) and torch.equal(seen["width"][:raw], want.width)
        assert [t.shape[0] for t in out] == [raw, raw, raw]
        record = draft.sage_round
        assert record.shape == (raw, 4) and record.data_ptr() != draft.sage_counters.rounds.data_ptr()
        assert torch.equal(record[:, 0], want.alpha)
        assert record[:, 1:3].tolist() == torch.stack([want.depth, want.width], 1).float().tolist()
        assert torch.equal(record[:, 3], draft.sage_selection.shaped[:raw].float())
        rounds, alpha_sum, depth_sum = (
            rounds + raw,
            alpha_sum + want.alpha.double().sum().item(),
            depth_sum + want.depth.sum().item(),
        )
        draft.sage_observe(slots, torch.full((raw,), 2))
        stats = draft.sage_stats()
        assert stats["sage_rounds"] == rounds
        assert stats["sage_mean_alpha"] == pytest.approx(alpha_sum / rounds, rel=1e-12)
        assert stats["sage_mean_depth"] == pytest.approx(depth_sum / rounds, rel=1e-12)
        assert stats["sage_mean_accept_length"] == 2.0


def test_sglangs_draft_graph_captures_draft_forward_and_pads_with_slot_0_and_zero_topk_p():
    """What the plan in the graph relies on (SGLang 0.5.23): the draft runner captures the worker's ``draft_forward``
    on slices of its static buffers, ``execute`` pads with slot 0 and zero ``topk_p``, and no request owns slot 0."""
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner as Runner

    capture = inspect.getsource(Runner.capture_one_shape)
    assert "ret = self.eagle_worker.draft_forward(forward_batch)" in capture
    assert "req_pool_indices = buffers.req_pool_indices[:num_seqs]" in capture
    assert "topk_p = buffers.topk_p[:num_seqs]" in capture
    execute = inspect.getsource(Runner.execute)
    assert "buffers.topk_p.zero_()" in execute and "buffers.req_pool_indices.zero_()" in execute
    assert "self.free_slots = list(range(1, self._alloc_size))" in inspect.getsource(ReqToTokenPool)


def test_an_idle_draft_forward_is_upstreams_alone():
    draft = _sage_draft(SageConfig(k=4, w_max=4))

    class Idle(GraphRunnerDraft):
        def draft_forward(self, forward_batch):
            return "upstream"

    class SageIdle(SageDraftMixin, Idle):
        pass

    draft.__class__ = SageIdle
    assert draft.draft_forward(_forward_batch(torch.zeros(0, dtype=torch.int64), torch.zeros(0, TOPK))) == "upstream"
    assert (
        draft.draft_forward(_forward_batch(torch.ones(2, dtype=torch.int64), torch.ones(2, TOPK), ForwardMode.IDLE))
        == "upstream"
    )
    assert draft.sage_slots is None  # nothing planned, no SAGE state built


@pytest.mark.parametrize("tiers", [TIERS, ((0, 1), (1, 4), (2, 5)), ((8, 5),)])
def test_the_kv_bound_covers_every_tier(tiers):
    """SGLang reserves ``max(live_steps * topk, bound)`` per request before the worker picks the step's tier."""
    cfg = SageConfig(k=4, w_max=4, tiers=tiers)
    sizes = spec_sizes(cfg)
    args = types.SimpleNamespace(
        speculative_eagle_topk=sizes.topk,
        speculative_num_steps=sizes.num_steps,
        speculative_num_draft_tokens=sizes.num_draft_tokens,
        **{STASH_ATTR: SageCliArgs(overrides={"k": 4, "w_max": 4, "tiers": [list(t) for t in tiers]})},
    )
    bound = SageSpecAlgo("SAGE", sage_worker_factory).resolve_max_speculative_num_draft_tokens(args)
    for live in parse_tiers(tiers):  # whatever tier is live when the scheduler reserves
        reserved = max(live.steps * sizes.topk, bound)
        for run in parse_tiers(tiers):  # ... the tier the worker then runs fits
            assert reserved >= max(run.steps * sizes.topk, run.draft_tokens), (live, run, bound)
    assert bound >= sizes.num_draft_tokens
