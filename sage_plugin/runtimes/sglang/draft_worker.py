"""The SAGE draft workers for SGLang 0.5.23: SGLang's EAGLE v2 draft workers with SAGE's per-round plan.

:class:`SageDraftMixin` plans each request's round (alpha -> D, W) inside the draft step SGLang captures and selects the
verified nodes through the ``organize_draft_results`` hook; :class:`SageDraftWorker` (a standalone draft model) and
:class:`SageEagleDraftWorker` (EAGLE / EAGLE-3 heads) are SGLang's two draft workers with it.  The SAGE target-side
worker (``worker.py``) re-classes the draft worker SGLang built to one of these.  ``worker.py``'s module docstring
describes the whole step.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from sglang.srt.distributed import get_tp_group
from sglang.srt.speculative.base_spec_worker import EagleDraftWorkerBase
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker
from sglang.srt.speculative.standalone_worker_v2 import StandaloneDraftWorker
from sglang.srt.utils import is_hip

from sage_plugin.config import RuntimeConfig, SageConfig
from sage_plugin.models import draft_head_ids
from sage_plugin.serving.slots import SlotState
from sage_plugin.serving.tiers import parse_tiers

from .draft_weights import DraftHeadRows, rank_head_ids, store_draft_linears
from .hooks import ACTIVE_SELECTION
from .lean_draft import install_lean_draft
from .off_lag import DraftLag
from .ragged_verify import ragged_runs
from .selection import STAT_FIELDS, BeamSelection, DraftCounters, planned_draft
from .tpsync import sync_due, sync_verify_input

__all__ = ["SageDraftMixin", "SageDraftWorker", "SageEagleDraftWorker", "tp_sync_due", "tp_sync_group"]

logger = logging.getLogger(__name__)


class SageDraftMixin(EagleDraftWorkerBase):
    """SAGE's per-round plan on top of an SGLang EAGLE v2 draft worker (standalone or EAGLE head).

    The SAGE worker re-classes the draft worker SGLang built (to :class:`SageDraftWorker` or
    :class:`SageEagleDraftWorker`) and calls :meth:`init_sage` (no upstream ``__init__`` is copied).
    Deriving from SGLang's ``EagleDraftWorkerBase`` with ``__slots__ = ()`` keeps the object layout of the SGLang
    class (CPython allows ``__class__`` assignment only between classes whose layout bases agree).
    """

    __slots__ = ()

    def init_sage(self, cfg: SageConfig) -> None:
        self.sage_cfg = cfg
        self.sage_slots: SlotState | None = None
        self.sage_selection: BeamSelection | None = None
        self.sage_counters: DraftCounters | None = None
        self._stats_host = None
        self.sage_round: torch.Tensor | None = None
        self.sage_lag: DraftLag | None = None
        #: seconds the current step's catch-up took (0: none ran); the worker prices it apart from the step
        self.sage_catch_up_seconds = 0.0
        self.sage_tp = tp_sync_group(cfg.runtime)
        self.sage_tp_syncs = 0  # drafted steps whose verify input was broadcast from rank 0 (GET /server_info)

    def _ensure_sage_state(self) -> None:
        if self.sage_slots is not None:
            return
        slots = int(self.req_to_token_pool.size) + 1
        self.sage_slots = SlotState(self.sage_cfg.algorithm, slots, self.device)
        tiers = parse_tiers(self.sage_cfg.serving.tiers) if self.sage_cfg.serving.tiers else ()
        widest = max((t.draft_tokens for t in tiers), default=1)  # the most tokens a tier verifies
        cpu = torch.device(self.device).type == "cpu"  # on CUDA the off tier's extend is a captured graph
        ragged = ragged_runs(self.sage_cfg.serving, self.device)
        scored = widest - 1 if ragged else 0  # the chosen nodes' path scores, for a ragged verify
        self.sage_selection = BeamSelection(self.sage_cfg.algorithm, self.topk, slots, self.device, max_nodes=scored)
        self.sage_counters = DraftCounters(slots, self.device)  # slots >= the largest batch (one slot a request)
        pin = torch.device(self.device).type == "cuda"
        self._stats_host = torch.zeros(len(STAT_FIELDS), dtype=torch.float64, pin_memory=pin)
        if self.sage_cfg.serving.tier_off_lag and self.sage_lags_ok and cpu and any(t.steps == 0 for t in tiers):
            self.sage_lag = DraftLag(self.sage_cfg.serving.tier_off_lag, slots, widest, self.device)

    def init_lm_head(self) -> None:
        """Upstream's head (an EAGLE head shares the target's embedding, and head without a token map), then
        ``cpu_draft_dtype`` on the draft's own layers, its head final (``draft_weights.py``)."""
        super().init_lm_head()
        n = store_draft_linears(self.draft_runner.model, self.sage_cfg.cpu, self.target_worker.model_runner.model)
        if n:
            logger.info("SAGE: %d draft linear layers stored in bfloat16 (cpu_draft_dtype)", n)

    #: whether the off tier may skip this draft's extend (off_lag.py: a standalone draft reads no target hidden states)
    sage_lags_ok = False

    def draft(self, batch: Any, *, with_topology: bool = False):
        """Upstream's draft step with SAGE's selection active; the plan runs inside it (:meth:`draft_forward`).

        Before: the off tier's lag catch-up.  After: the tree broadcast under ``tp_sync``, and the round's record
        ``sage_round`` (``[B, 4]``, the real rows of :attr:`DraftCounters.rounds`, cloned as ``meta.SageRoundDevice``
        requires: every draft step rewrites the buffer, and the scheduler's host copy of this step's record may be
        queued after the next step's draft, e.g. on pipeline stages)."""
        spec = batch.spec_info
        if _root_probs(batch) is None:
            return super().draft(batch, with_topology=with_topology)
        self._ensure_sage_state()
        if self.sage_lag is not None and self.sage_lag.behind():  # off steps skipped the extend: replay them first
            started = time.perf_counter()  # CPU only (off_lag.py): the forward has run when catch_up returns
            fresh = self.sage_lag.catch_up(self, batch, batch.seq_lens_cpu.tolist(), spec.bonus_tokens)
            self.sage_catch_up_seconds = time.perf_counter() - started
            spec.topk_p, spec.topk_index, spec.hidden_states = fresh.topk_p, fresh.topk_index, fresh.hidden_states
        bs = spec.topk_p.shape[0]
        token = ACTIVE_SELECTION.set(self.sage_selection)
        try:
            out = super().draft(batch, with_topology=with_topology)
        finally:
            ACTIVE_SELECTION.reset(token)
        if self.sage_tp is not None and tp_sync_due(self.sage_cfg.runtime, batch):
            sync_verify_input(out, self.sage_tp.broadcast)  # every rank verifies rank 0's tree
            self.sage_tp_syncs += 1
        self.sage_round = self.sage_counters.rounds[:bs].clone()  # [B, 4] for meta_info (meta.SageRoundDevice)
        return out

    def draft_forward(self, forward_batch: Any):
        """SGLang's draft forward (the beam's draft steps and ``organize_draft_results``) inside SAGE's plan
        (:func:`.selection.planned_draft`: plan, load into the selection's buffers, metrics, round record).

        SGLang's draft CUDA graph runner captures this method and replays it with the batch in its static buffers
        (``forward_batch.req_pool_indices`` ``[bs]``, ``spec_info.topk_p`` ``[bs, topk]``, padded past the real
        batch), so on a GPU the plan replays inside the draft graph; eager, :meth:`draft` reaches it through
        upstream's ``draft``.  An idle batch, or one with no root distribution, is upstream's alone."""
        topk_p = _root_probs(forward_batch)
        if topk_p is None:
            return super().draft_forward(forward_batch)
        self._ensure_sage_state()
        return planned_draft(
            self.sage_slots, self.sage_selection, self.sage_counters, forward_batch.req_pool_indices, topk_p,
            lambda: super(SageDraftMixin, self).draft_forward(forward_batch),
        )  # fmt: skip

    def _draft_extend_for_prefill(self, batch: Any, *args: Any, **kwargs: Any):
        """Before the draft's prefill of a multimodal batch, map SGLang's image pad values into the draft's vocabulary.

        SGLang fills a prompt's image positions with hash values (its radix-cache keys for the image) and clamps them
        to the vocabulary only inside the target's multimodal embedding; a standalone text draft would index its
        embedding with the hashes.  Every id past the draft's vocabulary becomes its last id, as the target's clamp
        does, so the draft reads one placeholder token per image position (``docs/design/sglang-internals.md``, "VLMs").
        """
        mm = getattr(batch, "multimodal_inputs", None)
        if mm and any(x is not None for x in mm) and batch.input_ids is not None:
            vocab = self.draft_runner.model_config.vocab_size
            batch.input_ids = batch.input_ids.clamp(max=vocab - 1)
        self._ensure_sage_state()
        if self.sage_lag is not None and not batch.forward_mode.is_idle():
            self.sage_lag.record_prefill(batch, args[1] if len(args) > 1 else kwargs["next_token_ids"])
        return super()._draft_extend_for_prefill(batch, *args, **kwargs)

    def sage_upstream_prefill_extend(self, batch: Any, hidden: Any, next_token_ids: torch.Tensor):
        """SGLang's draft prefill extend itself (the catch-up of off_lag.py runs through it)."""
        return super()._draft_extend_for_prefill(batch, hidden, next_token_ids)

    def _draft_extend_for_decode(self, batch: Any, batch_result: Any, *args: Any, **kwargs: Any):
        """After a verify: the step's tokens into the token ring; at the off tier the extend is skipped (``off_lag.py``)
        until a request is ``tier_off_lag`` tokens behind, when the catch-up runs in its place."""
        lag = self.sage_lag
        if lag is None or batch.forward_mode.is_idle():
            return super()._draft_extend_for_decode(batch, batch_result, *args, **kwargs)
        lag.record_step(batch, batch_result.next_token_ids, self.speculative_num_draft_tokens)
        if self.speculative_num_steps > 0:
            return super()._draft_extend_for_decode(batch, batch_result, *args, **kwargs)
        nxt = batch_result.next_draft_input
        if lag.skip(batch.reqs) < lag.max_lag:
            bs = batch.seq_lens.shape[0]  # what the next step reads of it: bonus_tokens (verify) and these shapes
            nxt.topk_p = torch.zeros(bs, self.topk, dtype=torch.float32, device=self.device)
            nxt.topk_index = torch.zeros(bs, self.topk, dtype=torch.int64, device=self.device)
            return None
        seq = [s + 1 for s in batch.seq_lens_cpu.tolist()]  # an off step accepts the root alone
        fresh = lag.catch_up(self, batch, seq, batch_result.next_token_ids)
        nxt.topk_p, nxt.topk_index, nxt.hidden_states = fresh.topk_p, fresh.topk_index, fresh.hidden_states
        return None

    def _capture_cuda_graphs(self):
        # every captured draft step (start-up and each tier's, built by build_adaptive_runtime_state) must contain
        # SAGE's selection, reading the persistent shape buffers
        self._ensure_sage_state()
        token = ACTIVE_SELECTION.set(self.sage_selection)
        try:
            return super()._capture_cuda_graphs()
        finally:
            ACTIVE_SELECTION.reset(token)

    def sage_reset(self, slots: torch.Tensor) -> None:
        self._ensure_sage_state()
        self.sage_slots.reset(slots)

    def sage_observe(self, slots: torch.Tensor, accept_lens: torch.Tensor, history: bool = True) -> None:
        """A drafted round's accept lengths: into the metrics, and into the slots' history unless ``history`` is
        False (a tier too shallow to tell the history controller anything)."""
        self._ensure_sage_state()
        if history:
            self.sage_slots.observe(slots, accept_lens)
        self.sage_counters.add_accepted(accept_lens)
        # lagged metrics: start this step's copy, read the previous one
        self._stats_host.copy_(self.sage_counters.stats, non_blocking=True)

    def sage_stats(self) -> dict[str, float]:
        """Server-wide SAGE counters as of the previous step (means over drafted request-rounds)."""
        if self._stats_host is None:
            return {}
        v = dict(zip(STAT_FIELDS, self._stats_host.tolist()))
        n = max(v["rounds"], 1.0)
        return {
            "sage_rounds": v["rounds"],
            "sage_mean_alpha": v["alpha_sum"] / n,
            "sage_mean_depth": v["depth_sum"] / n,
            "sage_mean_width": v["width_sum"] / n,
            "sage_mean_shaped_nodes": v["shaped_sum"] / n,
            "sage_mean_accept_length": v["accept_sum"] / n,
        }


def _root_probs(batch: Any) -> torch.Tensor | None:
    """The ``[B, topk]`` root probabilities SAGE plans from (``spec_info.topk_p`` of a schedule or forward batch), or
    None where the step is upstream's alone: an idle batch, or one with no root distribution."""
    topk_p = getattr(batch.spec_info, "topk_p", None)
    if batch.forward_mode.is_idle() or topk_p is None or topk_p.shape[0] == 0:
        return None
    return topk_p


def tp_sync_group(cfg: RuntimeConfig) -> Any:
    """The tensor-parallel group that broadcasts trees under ``tp_sync`` (None: one rank, or ``tp_sync: off``)."""
    tp = get_tp_group()
    return tp if tp.world_size > 1 and cfg.tp_sync != "off" else None


def tp_sync_due(cfg: RuntimeConfig, batch: Any) -> bool:
    """:func:`.tpsync.sync_due` for this step (the batch's greedy flag is the same on every rank)."""
    info = getattr(batch, "sampling_info", None)
    greedy = bool(getattr(info, "is_all_greedy", True))
    return sync_due(cfg.tp_sync, get_tp_group().world_size, is_hip(), greedy)


class SageDraftWorker(SageDraftMixin, StandaloneDraftWorker):
    """SGLang's standalone draft worker (separate draft model) plus SAGE's per-round plan.

    A draft trained with a restricted head (``sage_draft.json``, :func:`sage_plugin.models.draft_head_ids`: every
    other token shares one output row that is never its argmax) drafts over those rows only, as the reference engine
    does: SGLang's own hot-token map (the ``--speculative-token-map`` mechanism, ``hot_token_id``) is set from them,
    the head becomes :class:`DraftHeadRows` and SGLang turns the draft's top-k indices back into vocabulary ids.  On
    this project's draft the head shrinks from 49,152 to 8,192 rows (the draft lm_head was 17% of a step at tier
    [4, 8] on the 2-core CPU).
    """

    __slots__ = ()
    sage_lags_ok = True

    def init_token_map(self) -> None:
        """SGLang's (``--speculative-token-map``), else the draft's own head ids (SGLang calls this when it allocates
        the draft's memory pool, after the worker is built)."""
        super().init_token_map()
        if self.hot_token_id is None:
            ids = draft_head_ids(self.draft_runner.model_config.model_path)
            if ids is not None:
                self.hot_token_id = ids.to(self.device)
                logger.info("SAGE: the draft drafts over its %d head tokens (sage_draft.json)", ids.numel())

    def init_lm_head(self) -> None:
        """Cut the draft's head to the hot tokens SGLang maps its top-k through (upstream's standalone worker keeps
        the full head, which a token map would mis-index), then :meth:`SageDraftMixin.init_lm_head`."""
        if self.hot_token_id is not None:
            self._cut_head()
        super().init_lm_head()
        if self.sage_cfg.cpu.cpu_lean_draft:
            why = install_lean_draft(self.draft_runner.model, get_tp_group().world_size, self.device)
            logger.info("SAGE: the draft's lean decoder %s (cpu_lean_draft)", f"off: {why}" if why else "on")

    def _cut_head(self) -> None:
        model = self.draft_runner.model
        weight = model.lm_head.weight  # with --tp-size > 1 this rank's vocabulary shard
        tp = get_tp_group()
        if tp.world_size > 1:  # the whole head, once: the draft vocabulary's rows are split anew across the ranks
            weight = tp.all_gather(weight.contiguous(), dim=0)
        if int(self.hot_token_id.max()) >= weight.shape[0]:
            raise ValueError(f"the draft's vocabulary ids reach {int(self.hot_token_id.max())}, its head has "
                             f"{weight.shape[0]} rows")  # fmt: skip
        self.hot_token_id, parts = rank_head_ids(self.hot_token_id, tp.world_size)
        model.lm_head = DraftHeadRows(weight, parts[tp.rank_in_group])  # a tied embedding keeps its rows


class SageEagleDraftWorker(SageDraftMixin, EagleDraftWorker):
    """SGLang's EAGLE draft worker (EAGLE/EAGLE3 head on the target's hidden states) plus SAGE's per-round plan."""

    __slots__ = ()
