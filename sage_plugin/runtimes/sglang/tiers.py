"""SAGE's serving tiers on SGLang 0.5.23's adaptive runtime states (``speculative/adaptive_runtime_state.py``).

SGLang's ``--speculative-adaptive`` builds one :class:`SpecRuntimeState` (draft, verify and draft-extend attention
backends and graph runners) per step count at start-up and swaps them by reference
(``EAGLEWorkerV2.build_adaptive_runtime_state`` / ``apply_runtime_state``); its ``AdaptiveController`` keys the
states by step count and builds ``steps + 1`` verified tokens (a chain).  SAGE's tiers are ``(steps, draft_tokens)``
pairs with the beam's topk fixed, so :class:`SageTierController` is that controller keyed by
:class:`~sage_plugin.serving.tiers.Tier`, with :class:`~sage_plugin.serving.tiers.TierChooser` as the policy:

* ``init_states`` (called by ``EAGLEWorkerV2.init_cuda_graphs``, as for ``--speculative-adaptive``) builds every
  tier's state through the worker's own ``build_adaptive_runtime_state``;
* ``activate_step_by_batch`` (called by ``EAGLEWorkerV2.forward_batch_generation`` before each decode step) asks
  the chooser for the step's tier from the batch size, the batch's mean SAGE alpha as last read on the host
  (:class:`sage_plugin.serving.clock.HostScalar`, set by the worker as :attr:`SageTierController.alpha`) and host-side estimates only, and
  swaps the state;
* ``on_verify_complete`` (SGLang's result processor, once accept lengths are on the host) feeds the chooser.

With a per-request gate (``--sage-tier-request-gate``, :class:`~sage_plugin.serving.request_gate.RequestGate`) the
controller also decides, before each decode step, which of the batch's requests speculate (:attr:`SageTierController.mask`,
``[B]`` in batch order, from the request keys the worker sets as :attr:`SageTierController.keys`): the chooser prices
the tiers with that many drafting requests, the worker gives the other requests' roots no children
(:meth:`SageTierController.speculate_mask`), and only the drafting requests' accept counts feed the acceptance
estimates.  Each request's own acceptance against the chooser's expectation (``--sage-tier-request-prior``,
:class:`~sage_plugin.serving.request_acceptance.RequestAcceptance`) weights the drafting requests in the chooser's
price.  Prefill passes are timed for the admission price (:meth:`SageTierController.record_prefill`).

:class:`sage_plugin.serving.clock.StepClock` times each decode step for the chooser's cost table without a device sync and
:class:`sage_plugin.serving.clock.HostScalar` reads a device scalar (the batch's mean alpha) the same way (:mod:`sage_plugin.serving.clock`).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController, SpecRuntimeState

from sage_plugin.config import ServingConfig
from sage_plugin.serving.admission import AdmissionPrice
from sage_plugin.serving.request_acceptance import RequestAcceptance
from sage_plugin.serving.request_gate import RequestGate
from sage_plugin.serving.tiers import TIER_CONTROLS, Tier, TierChooser, parse_tiers

__all__ = [
    "RankZeroTimes", "SageTierController", "TierSwitchLogFilter", "request_acceptance", "request_gate", "request_keys",
    "tier_chooser",
]  # fmt: skip


def tier_chooser(cfg: ServingConfig) -> TierChooser:
    """The tier chooser of a SAGE server with ``cfg.tiers`` (``cfg``: its serving section, whose ``tier_*`` fields set
    it; ``docs/design/serving-control.md``)."""
    control = dict(TIER_CONTROLS[cfg.tier_control])
    admission = AdmissionPrice() if control.pop("admission") else None
    return TierChooser(
        parse_tiers(cfg.tiers), cfg.tier_probe_every, probe_backoff=cfg.tier_probe_backoff,
        alpha_bins=cfg.tier_alpha_bins, bound_slack=cfg.tier_bound_slack, acceptance=cfg.tier_acceptance,
        probe_confidence=cfg.tier_probe_confidence, admission=admission, **control,
    )  # fmt: skip


def request_gate(cfg: ServingConfig) -> RequestGate | None:
    """The per-request gate of a SAGE server (None: every request of a drafted step speculates)."""
    return RequestGate() if cfg.tier_request_gate else None


def request_acceptance(cfg: ServingConfig) -> RequestAcceptance | None:
    """Each request's acceptance factor of a SAGE server (None: every request priced at the population's rate)."""
    return RequestAcceptance(cfg.tier_request_prior) if cfg.tier_request_prior > 0 else None


def request_keys(batch: Any) -> list[int] | None:
    """Each request's key in batch order: its request slot (SGLang 0.5.23's ``req.kv.req_pool_idx``, a host int, the
    same on every rank); None when the batch holds no host-side requests or a request holds no slot."""
    reqs = getattr(batch, "reqs", None)
    keys = None if reqs is None else [getattr(getattr(r, "kv", None), "req_pool_idx", None) for r in reqs]
    return None if keys is None or None in keys else keys


@dataclass
class _Step:
    """A decode step awaiting its feedback: its tier, request keys and mask, the gate's terms at its start and the
    accepted drafts the chooser expected of a request (None: off, or no per-request factors)."""

    tier: Tier
    keys: list[int] | None = None
    mask: list[bool] | None = None
    break_even: float = 0.0
    prior: float = 0.0
    depth: int = 0
    expected: float | None = None


class _ChooserPolicy:
    """The :class:`AdaptiveSpecPolicy` view of a :class:`TierChooser` (candidate steps, graph batch sizes)."""

    def __init__(self, chooser: TierChooser) -> None:
        self.chooser = chooser
        self._cuda_graph_bs: list[int] | None = None

    @property
    def candidate_steps(self) -> list[int]:
        return sorted({t.steps for t in self.chooser.tiers})

    def set_cuda_graph_bs(self, cuda_graph_bs: list[int] | None) -> None:
        self._cuda_graph_bs = cuda_graph_bs

    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None:
        return self._cuda_graph_bs  # every tier serves every batch size

    def get_steps_for_batch(self, batch_size: int) -> int:  # protocol member; the controller asks the chooser
        raise NotImplementedError("SageTierController chooses tiers with TierChooser.choose")

    def on_verify_complete(self, num_correct_drafts_per_req: list[int], batch_size: int) -> int | None:
        raise NotImplementedError("SageTierController feeds TierChooser.observe")


class SageTierController(AdaptiveController):
    """SGLang's ``AdaptiveController`` with states keyed by SAGE tier ``(steps, draft_tokens)``.

    Args:
        worker: the SAGE worker (``EAGLEWorkerV2`` subclass; its ``apply_runtime_state`` compares both sizes).
        chooser: the host-side tier choice.
        shared: with tensor parallelism, rank 0's timings for every rank.
        gate: the per-request gate (None: every request of a drafted step speculates).
        acceptance: each request's acceptance factor (None: requests priced at the population's rate).
        median: with ``acceptance``, price the batch's median request too (``--sage-tier-median-request``).
    """

    def __init__(
        self,
        worker: Any,
        chooser: TierChooser,
        shared: RankZeroTimes | None = None,
        gate: RequestGate | None = None,
        acceptance: RequestAcceptance | None = None,
        median: bool = False,
    ) -> None:
        super().__init__(worker, _ChooserPolicy(chooser))
        #: with ``acceptance``, a drafted tier must also pay for the batch's median request (``TierChooser.best``)
        self.median = median and acceptance is not None
        self.chooser = chooser
        #: with tensor parallelism, rank 0's step timings shared with every rank (None: this rank's own)
        self.shared = shared
        self._states: dict[Tier, SpecRuntimeState] = {}  # type: ignore[assignment]
        self.active: Tier | None = None
        self.switches = 0
        #: the batch's mean SAGE alpha for the next choice (host float; None: not known yet)
        self.alpha: float | None = None
        #: whether the draft is behind for the next choice (``tier_off_lag``; None: the draft never lags)
        self.behind: bool | None = None
        self.gate = gate
        self.acceptance = acceptance
        #: the next decode step's request keys in batch order (set by the worker; None: unknown, no gating)
        self.keys: list[int] | None = None
        #: ``[B]`` whether each request of the step about to run speculates (None: all of them, or the off tier)
        self.mask: list[bool] | None = None
        self._steps: deque[_Step] = deque(maxlen=8)  # steps awaiting feedback, as the chooser's pending ones

    def register(self, state: SpecRuntimeState, steps: int | None = None) -> None:
        self._states[Tier(state.speculative_num_steps, state.speculative_num_draft_tokens)] = state

    def init_states(self, cuda_graph_bs: list[int] | None = None) -> None:
        self.params.set_cuda_graph_bs(cuda_graph_bs)
        # a captured decode step runs padded to its next captured batch size: price each such class once (None when
        # SGLang captures no decode graphs, as on CPU: every batch size is measured on its own)
        self.chooser.set_size_classes(cuda_graph_bs)
        for tier in self.chooser.tiers:
            if tier not in self._states:
                self._states[tier] = self.worker.build_adaptive_runtime_state(
                    speculative_num_steps=tier.steps,
                    speculative_num_draft_tokens=tier.draft_tokens,
                    cuda_graph_bs=cuda_graph_bs,
                )
        self._activate(self.chooser.tiers[-1])

    def activate_step_by_batch(self, batch_size: int) -> None:
        step = self._gate_plan(batch_size)
        speculating, median = None if step.mask is None else sum(step.mask), None
        if self.acceptance is not None and step.keys is not None:  # the drafting requests, each at its own rate
            speculating = self.acceptance.weight(step.keys, step.mask)
            median = self.acceptance.median(step.keys, step.mask) if self.median else None
        tier = self.chooser.choose(batch_size, self.alpha, speculating, self.behind, median)
        step.tier = tier
        if tier.off:
            step.mask = None if step.keys is None else [False] * len(step.keys)
        elif self.acceptance is not None and step.keys is not None:
            tokens = self.chooser.expected_tokens(tier, self.alpha, batch_size=batch_size)
            step.expected = None if tokens is None else tokens - 1.0
        self.mask = None if tier.off or step.mask is None or all(step.mask) else step.mask
        self._steps.append(step)
        if tier != self.active:
            self._activate(tier)
            self.switches += 1

    def _gate_plan(self, batch_size: int) -> _Step:
        """The step's request keys (None unless one per request) and the gate's mask for the batch under the drafted
        tier the chooser rates highest there (no mask without a gate, keys or such a tier)."""
        keys, chooser = self.keys, self.chooser
        step = _Step(chooser.tiers[0], keys if keys is not None and len(keys) == batch_size else None)
        best = chooser.best(batch_size, self.alpha, drafted=True) if self.gate and step.keys else None
        tokens = None if best is None else chooser.expected_tokens(best, self.alpha, batch_size=batch_size)
        if tokens is None:
            return step
        step.break_even = chooser.request_break_even(best, batch_size, self.alpha)
        step.prior, step.depth = tokens - 1.0, best.steps
        step.mask = self.gate.speculate(keys, step.break_even, step.prior, step.depth)
        return step

    def on_verify_complete(self, num_correct_drafts_per_req: list[int], batch_size: int) -> None:
        step = self._steps.popleft() if self._steps else None
        accepted = num_correct_drafts_per_req
        if step is None or step.keys is None or len(step.keys) != len(accepted):
            self.chooser.observe(accepted)
            return
        drafted = None if step.tier.off else step.mask  # None: an off step, or every request drafted
        if self.gate is not None and step.mask is not None:
            self.gate.observe(step.keys, accepted, drafted, step.break_even, step.prior, step.depth)
        if self.acceptance is not None and step.expected is not None:
            self.acceptance.observe(step.keys, accepted, step.expected, drafted)
        if drafted is None:
            self.chooser.observe(accepted)
        else:
            self.chooser.observe([a for a, m in zip(accepted, drafted) if m], others=drafted.count(False))

    def speculate_mask(self, device: torch.device | str) -> torch.Tensor | None:
        """``[B]`` bool on ``device``: whether each request of the step about to run speculates (None: every request
        does).  Built from host data (:attr:`mask`) and copied without a sync (pinned memory on CUDA), so the same on
        every rank; a request that does not speculate verifies its root alone."""
        if self.mask is None:
            return None
        host = torch.tensor(self.mask, dtype=torch.bool)
        if torch.device(device).type != "cuda":
            return host
        return host.pin_memory().to(device, non_blocking=True)

    def record_times(
        self, times: list[tuple[tuple[Tier | None, int], float]], admitted: list[int] | None, catch_up: float = 0.0
    ) -> None:
        """Measured passes ``((tier, batch size), seconds)`` (:class:`sage_plugin.serving.clock.StepClock`): a decode
        step's cost, or with tier None a prefill pass's time (the admission price); ``admitted``: the request keys of
        a prefill pass that just ran (the gate forgets their slots' predecessors); ``catch_up``: seconds a lagging
        draft's catch-up took inside the drafted step of ``times`` (on CPU, where the draft lags, the step is timed at
        once): priced apart, and taken out of the step's cost."""
        for (tier, bs), seconds in times:
            if tier is None:
                self.record_prefill(seconds)
                continue
            if catch_up > 0.0 and not tier.off:
                self.record_catch_up(bs, catch_up)
                seconds -= catch_up
            self.record_cost(tier, bs, seconds)
        if admitted:
            for per_request in (self.gate, self.acceptance):
                if per_request is not None:
                    per_request.reset(admitted)

    def record_prefill(self, seconds: float) -> None:
        """A prefill pass's measured time, for the admission price (tensor parallelism: as :meth:`record_cost`)."""
        if self.shared is None:
            self.chooser.record_prefill(seconds)
        else:
            self.shared.record_prefill(seconds)

    def record_cost(self, tier: Tier, batch_size: int, seconds: float) -> None:
        """A decode step's measured time, for the chooser (with tensor parallelism: rank 0's, at the next share)."""
        if self.shared is None:
            self.chooser.record_cost(tier, batch_size, seconds)
        else:
            self.shared.record_cost(tier, batch_size, seconds)

    def record_catch_up(self, batch_size: int, seconds: float) -> None:
        """A lagging draft's measured catch-up, for the chooser (tensor parallelism: as :meth:`record_cost`)."""
        if self.shared is None:
            self.chooser.record_catch_up(batch_size, seconds)
        else:
            self.shared.record_catch_up(batch_size, seconds)

    def record_overhead(self, seconds: float) -> None:
        """The measured time between two decode steps, for the chooser (tensor parallelism: as :meth:`record_cost`)."""
        if self.shared is None:
            self.chooser.record_overhead(seconds)
        else:
            self.shared.record_overhead(seconds)

    def end_step(self) -> None:
        """A decode step ended (every rank calls it at the same step): with tensor parallelism, a share may fall
        due."""
        if self.shared is not None:
            self.shared.end_step()

    def _activate(self, tier: Tier) -> None:  # type: ignore[override]
        state = self._states.get(tier)
        if state is None:
            raise ValueError(f"no runtime state built for SAGE tier {tier}")
        self.worker.apply_runtime_state(state)
        self.active = tier


class RankZeroTimes:
    """Rank 0's step timings, fed to every tensor-parallel rank's :class:`TierChooser` in the same order.

    The chooser's other inputs are the same on every rank (batch size, accept lengths, the draft's all-gathered top
    probabilities), but each rank times its own steps, so ranks fed their own timings could choose different tiers,
    i.e. run different shapes.  Here only rank 0's timings count: rank 0 buffers them, and every ``every`` decode
    steps (:meth:`end_step`, called by every rank at the same step) one broadcast over the tensor-parallel group's
    host (gloo) group hands them to every rank, which feed them to their choosers at that same step.  Between shares
    the choosers' tables stay identical, so every rank picks the same tier with no per-step communication and no
    device sync; timings reach the chooser up to ``every`` steps late (a step or more on CUDA already).

    Args:
        chooser: this rank's chooser.
        rank: this rank's index in the tensor-parallel group (0 measures).
        broadcast: ``broadcast(tensor)`` from rank 0 in place, over the group's host group (a ``torch.distributed``
            gloo group in serving, a stand-in in tests).
        every: decode steps between shares.
        capacity: timings a share carries at most (older ones beyond it are dropped).
    """

    OVERHEAD = -1  # tier index of an overhead sample
    PREFILL = -2  # tier index of a prefill pass's time
    CATCH_UP = -3  # tier index of a lagging draft's catch-up

    def __init__(self, chooser: TierChooser, rank: int, broadcast: Any, every: int = 16, capacity: int = 64) -> None:
        if every < 1 or capacity < 1:
            raise ValueError(f"every and capacity must be >= 1, got {every} and {capacity}")
        self.chooser = chooser
        self.rank = rank
        self.every = every
        self.capacity = capacity
        self._broadcast = broadcast
        self._index = {tier: i for i, tier in enumerate(chooser.tiers)}
        self._buf: deque[tuple[int, int, float]] = deque(maxlen=capacity)
        self._steps = 0
        self.shares = 0

    def record_cost(self, tier: Tier, batch_size: int, seconds: float) -> None:
        if self.rank == 0:
            self._buf.append((self._index[tier], batch_size, seconds))

    def record_overhead(self, seconds: float) -> None:
        if self.rank == 0:
            self._buf.append((self.OVERHEAD, 0, seconds))

    def record_prefill(self, seconds: float) -> None:
        if self.rank == 0:
            self._buf.append((self.PREFILL, 0, seconds))

    def record_catch_up(self, batch_size: int, seconds: float) -> None:
        if self.rank == 0:
            self._buf.append((self.CATCH_UP, batch_size, seconds))

    def end_step(self) -> None:
        self._steps += 1
        if self._steps % self.every:
            return
        # row 0: the count; rows 1..n: (tier index, batch size, seconds), float64 keeps the seconds exact
        msg = torch.zeros(self.capacity + 1, 3, dtype=torch.float64)
        if self.rank == 0:
            msg[0, 0] = len(self._buf)
            if self._buf:
                msg[1 : len(self._buf) + 1] = torch.tensor(list(self._buf), dtype=torch.float64)
            self._buf.clear()
        self._broadcast(msg)
        self.shares += 1
        for index, bs, seconds in msg[1 : int(msg[0, 0]) + 1].tolist():
            if int(index) == self.OVERHEAD:
                self.chooser.record_overhead(seconds)
            elif int(index) == self.PREFILL:
                self.chooser.record_prefill(seconds)
            elif int(index) == self.CATCH_UP:
                self.chooser.record_catch_up(int(bs), seconds)
            else:
                self.chooser.record_cost(self.chooser.tiers[int(index)], int(bs), seconds)


class TierSwitchLogFilter(logging.Filter):
    """Drops SGLang's per-switch info line ("Switch adaptive runtime state"): SAGE may switch tiers every step and
    reports its switch count in its own metrics instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith("Switch adaptive runtime state")
