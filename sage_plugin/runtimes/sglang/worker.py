"""The SAGE workers for SGLang 0.5.23: SGLang's EAGLE v2 workers with SAGE choosing each request's tree.

Both draft kinds: :class:`SageWorkerV2` is SGLang's STANDALONE v2 worker (a separate draft model) and
:class:`SageEagleWorkerV2` its EAGLE v2 worker (EAGLE and EAGLE3 heads, fed the target's hidden states); the SAGE
part is the same two mixins on either (``algo.py`` picks the worker from the draft checkpoint).

SGLang's EAGLE v2 draft step runs a fixed beam (``--speculative-num-steps`` draft forwards of
``--speculative-eagle-topk`` nodes) and verifies ``--speculative-num-draft-tokens - 1`` nodes per request, chosen
by ``organize_draft_results`` (top joint probability).  SAGE keeps SGLang's paged KV cache, beam, attention
backends, tree build and verify, and decides only what SAGE decides (nothing is re-implemented):

* at the start of the draft step, :class:`SageDraftWorker` plans every request's round from its root distribution
  (the beam's first top-k probabilities) and its slot's history: alpha -> (D, W)
  (:class:`sage_plugin.serving.slots.SlotState`), inside ``draft_forward``, the callable SGLang's draft CUDA graph
  runner captures (:func:`.selection.planned_draft`);
* the verified nodes are chosen by :func:`sage_plugin.core.beam_selection.select_shaped` (``rerank_pool``: the beam's
  most probable paths by default, or SAGE's shape first), through the ``organize_draft_results`` hook
  (``hooks.py``, ``patches/INDEX.md`` #3), which dispatches to the active :class:`BeamSelection` and otherwise
  leaves SGLang's selection alone;
* after verification :class:`SageWorkerV2` feeds each request's accept length to its slot's history controller;
  a prefill resets the slot.

Everything per step stays on the device (gathers/scatters by ``req_pool_indices``; the shape is written into
persistent buffers the selection reads, and the plan, the selection and the metrics' update are all in the captured
draft graph on a GPU).  Counters for metrics are device tensors too (:class:`.selection.DraftCounters`), copied to the
host once per step without blocking and read one step late (:meth:`SageDraftWorker.sage_stats`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from sglang.srt.distributed import get_tp_group
from sglang.srt.managers.auxiliary_output import append_auxiliary_output
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

from sage_plugin.core.entropy import root_confidence
from sage_plugin.serving.clock import HostScalar, StepClock

from .admission_hold import configure as configure_hold
from .admission_hold import note_step as note_hold_step
from .args import sage_config_of
from .draft_worker import SageDraftMixin, SageDraftWorker, SageEagleDraftWorker, tp_sync_due, tp_sync_group
from .penalties import ACTIVE_VERIFY, prefilled, verify_context
from .ragged_verify import ragged_runs, verify_target
from .request_meta import SageRoundDevice
from .selection import BeamSelection
from .tiers import (
    RankZeroTimes,
    SageTierController,
    TierSwitchLogFilter,
    request_acceptance,
    request_gate,
    request_keys,
    tier_chooser,
)

__all__ = [
    "BeamSelection",
    "SageDraftMixin",
    "SageDraftWorker",
    "SageEagleDraftWorker",
    "SageEagleWorkerV2",
    "SageWorkerMixin",
    "SageWorkerV2",
]

logger = logging.getLogger(__name__)


class SageWorkerMixin:
    """Re-classes the draft worker to its SAGE class and feeds accept lengths to the per-request history."""

    __slots__ = ()

    #: the SAGE class the draft worker SGLang built becomes
    sage_draft_cls: type

    def _init_sage(self, server_args: Any) -> None:
        cfg = sage_config_of(server_args)
        self.sage_cfg = cfg
        self.sage_tiers: SageTierController | None = None
        self._sage_clock = StepClock(self.device)
        self._sage_last_end: float | None = None
        self._sage_off_decode = (
            bool(cfg.serving.tiers) and cfg.serving.tier_off_decode and torch.device(self.device).type == "cpu"
        )
        self.sage_off_decode_steps = 0  # off steps whose verify forward ran in DECODE mode (GET /server_info)
        self._sage_ragged = ragged_runs(cfg.serving, self.device)
        self.sage_ragged_rows = [0, 0, 0]  # ragged verify: steps, rows computed, rows drafted (GET /server_info)
        configure_hold(cfg.serving.admission_hold_steps)  # before SGLang builds its delayer (admission_hold.py)
        if self._draft_worker is not None:  # None on pipeline stages that host no draft
            self._draft_worker.__class__ = self.sage_draft_cls
            self._draft_worker.init_sage(cfg)
            if cfg.serving.tiers:
                # built by EAGLEWorkerV2.init_cuda_graphs, chosen in forward_batch_generation, as --speculative-adaptive
                chooser = tier_chooser(cfg.serving)
                tp = get_tp_group()
                shared = None
                if tp.world_size > 1:  # every rank's chooser fed rank 0's timings: the same tier on every rank
                    src, group = tp.ranks[0], tp.cpu_group
                    shared = RankZeroTimes(chooser, tp.rank_in_group,
                                           lambda t: torch.distributed.broadcast(t, src=src, group=group))  # fmt: skip
                self.sage_tiers = SageTierController(
                    self, chooser, shared, request_gate(cfg.serving), request_acceptance(cfg.serving),
                    cfg.serving.tier_median_request,
                )  # fmt: skip
                self._sage_alpha = HostScalar(self.device, fixed_lag=HostScalar.RING - 1 if shared else None)
                self._sage_tp = tp_sync_group(cfg.runtime)
                self.adaptive_controller = self.sage_tiers
                logging.getLogger(EAGLEWorkerV2.__module__).addFilter(TierSwitchLogFilter())
        logger.info("SAGE worker ready (%s): %s", type(self).__name__, cfg.to_dict())

    def apply_runtime_state(self, state: Any) -> None:
        """Upstream's swap, which returns early on an equal step count: a SAGE tier may differ in draft tokens only."""
        now = (self.speculative_num_steps, self.speculative_num_draft_tokens)
        if now == (state.speculative_num_steps, state.speculative_num_draft_tokens):
            return
        if now[0] == state.speculative_num_steps:
            self.speculative_num_steps = -1  # not a real size: it only defeats the early return
        super().apply_runtime_state(state)

    def verify(self, batch: Any, pp_proxy_tensors: Any = None, grammar_barrier: Any = None):
        """Upstream's verify, its one target forward through :func:`.ragged_verify.verify_target` (in DECODE mode at the off
        tier on CPU, ``tier_off_decode``; on the nodes that pay only under ``ragged_verify``)."""
        target, token = self._target_worker, None
        if not batch.forward_mode.is_idle():
            self._target_worker = verify_target(self, target, batch)
            token = ACTIVE_VERIFY.set(verify_context(self, batch))  # exact request parameters (penalties.py)
        try:
            return super().verify(batch, pp_proxy_tensors=pp_proxy_tensors, grammar_barrier=grammar_barrier)
        finally:
            self._target_worker = target
            if token is not None:
                ACTIVE_VERIFY.reset(token)

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        prefill = batch.forward_mode.is_extend() or batch.is_extend_in_batch
        idle = batch.forward_mode.is_idle()
        slots = batch.req_pool_indices
        draft = self._draft_worker
        if draft is not None:
            draft.sage_round = None
            draft.sage_catch_up_seconds = 0.0
        tiers = self.sage_tiers if not (prefill or idle) else None
        if tiers is not None and self._sage_last_end is not None and not self._sage_clock.cuda:
            tiers.record_overhead(time.perf_counter() - self._sage_last_end)
        if tiers is not None:  # the batch's requests for the per-request gate, its alpha for the chooser (tiers.py)
            tiers.keys = request_keys(batch)
            tiers.alpha = self._batch_alpha(batch) if self.sage_cfg.serving.tier_alpha_bins else None
            lag = getattr(draft, "sage_lag", None)  # a lagging draft: the chooser prices its catch-up (off_lag.py)
            tiers.behind = None if lag is None else lag.behind()
        timed = self.sage_tiers if not idle else None
        started = self._sage_clock.start() if timed is not None else None
        out = super().forward_batch_generation(
            batch, on_publish=on_publish, grammar_barrier=grammar_barrier, pp_proxy_tensors=pp_proxy_tensors
        )
        if timed is not None:  # a decode step prices its tier, a prefill pass the admissions (tiers.py)
            key = (None, 0) if tiers is None else (tiers.active, batch.seq_lens.shape[0])
            caught = 0.0 if tiers is None or draft is None else draft.sage_catch_up_seconds
            timed.record_times(self._sage_clock.stop(started, key), request_keys(batch) if prefill else None, caught)
        if tiers is not None:
            tiers.end_step()
            self._sage_last_end = time.perf_counter()
        else:
            self._sage_last_end = None
        if not (prefill or idle):  # drafted steps bound the admission hold (admission_hold.py)
            note_hold_step(tiers is None or not tiers.active.off)
        # a tier shallower than d_max truncates acceptance: it would walk the history controller's D_max down
        informative = tiers is None or tiers.active.steps >= self.sage_cfg.algorithm.d_max
        if draft is not None and slots is not None and slots.numel() > 0 and not idle:
            if prefill:
                draft.sage_reset(slots)
                prefilled(self, batch, out.next_token_ids)
            elif getattr(out, "accept_lens", None) is not None:
                if draft.sage_round is not None:
                    draft.sage_observe(slots, out.accept_lens, history=informative)
                    round_info = SageRoundDevice(draft.sage_round)
                else:  # the off tier: nothing drafted, counted as an off step
                    round_info = SageRoundDevice(out.accept_lens.new_empty(slots.shape[0], 0), drafted=False)
                logits = getattr(out, "logits_output", None)
                if logits is not None:
                    # per-request alpha/D/W for meta_info["sage"], copied with the step's tokens (request_meta.py)
                    logits.auxiliary_device_output = append_auxiliary_output(logits.auxiliary_device_output, round_info)
        return out

    def _batch_alpha(self, batch: Any) -> float | None:
        """The batch's mean SAGE alpha from the draft's top probabilities at each request's root (the last draft
        extend's ``topk_p``), as last read on the host (:class:`HostScalar`: at once on CPU, a step or more late on
        CUDA); the tier chooser's confidence.  None while the draft is behind (off steps skipped its extends,
        ``off_lag.py``): the last alpha is the one that turned speculation off, and holding it would keep it off; unknown,
        the chooser ranks the tiers by their estimates over every alpha."""
        topk_p = getattr(batch.spec_info, "topk_p", None)
        lag = getattr(self._draft_worker, "sage_lag", None)
        if lag is not None and lag.behind():  # no root distribution to read
            return None
        if topk_p is not None and topk_p.dim() == 2 and topk_p.shape[0] > 0:
            alpha = root_confidence(topk_p, self.sage_cfg.algorithm.k).mean()
            if self._sage_tp is not None and tp_sync_due(self.sage_cfg.runtime, batch):
                self._sage_tp.broadcast(alpha)  # in place: the tier choice follows rank 0's alpha
            self._sage_alpha.push(alpha)
        return self._sage_alpha.latest()


class SageWorkerV2(SageWorkerMixin, StandaloneWorkerV2):
    """``--speculative-algorithm sage`` with a standalone draft model: STANDALONE v2 + :class:`SageDraftWorker`."""

    sage_draft_cls = SageDraftWorker

    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self._init_sage(server_args)


class SageEagleWorkerV2(SageWorkerMixin, EAGLEWorkerV2):
    """``sage`` with an EAGLE/EAGLE3 head (``SAGE_EAGLE``/``SAGE_EAGLE3``): EAGLE v2 + :class:`SageEagleDraftWorker`."""

    sage_draft_cls = SageEagleDraftWorker

    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self._init_sage(server_args)
