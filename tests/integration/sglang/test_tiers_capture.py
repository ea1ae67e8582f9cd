"""Tiers inside SGLang's adaptive machinery, without a server: recording fakes stand in for the worker's capture.

* :class:`SageTierController` builds one runtime state per tier through the worker's ``build_adaptive_runtime_state``
  (SGLang's own capture path), keyed by ``(steps, draft_tokens)``, switches by reference and counts switches;
* the SAGE draft worker's ``_capture_cuda_graphs`` (the method SGLang calls for the start-up capture and for every
  tier's) runs with SAGE's selection active, so no tier captures upstream's selection;
* the KV bound SAGE declares (``resolve_max_speculative_num_draft_tokens``) covers every tier's per-step allocation,
  so the reservation SGLang makes before the worker picks a tier is never short.

The end-to-end run (a CPU server cycling tiers, outputs equal to plain, KV pool back to its start) is
``test_e2e_serving.py::test_tiers_cycle_and_equal_plain``; real CUDA graph capture needs a GPU (``docs/sglang.md``).
"""

from __future__ import annotations

import types

import pytest

pytest.importorskip("sglang")

from sglang.srt.runtime_context import get_parallel  # noqa: E402
from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState  # noqa: E402
from sglang.srt.speculative.base_spec_worker import EagleDraftWorkerBase  # noqa: E402

from sage_plugin.config import SageConfig  # noqa: E402
from sage_plugin.core.tiers import Tier, TierChooser, parse_tiers  # noqa: E402
from sage_plugin.runtimes.sglang.algo import SageSpecAlgo, sage_worker_factory  # noqa: E402
from sage_plugin.runtimes.sglang.args import STASH_ATTR, SageCliArgs, spec_sizes  # noqa: E402
from sage_plugin.runtimes.sglang.hooks import ACTIVE_SELECTION  # noqa: E402
from sage_plugin.runtimes.sglang.tiers import SageTierController  # noqa: E402
from sage_plugin.runtimes.sglang.worker import SageDraftMixin  # noqa: E402

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
