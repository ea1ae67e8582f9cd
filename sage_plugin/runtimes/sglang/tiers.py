"""SAGE's serving tiers on SGLang 0.5.23's adaptive runtime states (``speculative/adaptive_runtime_state.py``).

SGLang's ``--speculative-adaptive`` builds one :class:`SpecRuntimeState` (draft, verify and draft-extend attention
backends and graph runners) per step count at start-up and swaps them by reference
(``EAGLEWorkerV2.build_adaptive_runtime_state`` / ``apply_runtime_state``); its ``AdaptiveController`` keys the
states by step count and builds ``steps + 1`` verified tokens (a chain).  SAGE's tiers are ``(steps, draft_tokens)``
pairs with the beam's topk fixed, so :class:`SageTierController` is that controller keyed by
:class:`~sage_plugin.core.tiers.Tier`, with :class:`~sage_plugin.core.tiers.TierChooser` as the policy:

* ``init_states`` (called by ``EAGLEWorkerV2.init_cuda_graphs``, as for ``--speculative-adaptive``) builds every
  tier's state through the worker's own ``build_adaptive_runtime_state``;
* ``activate_step_by_batch`` (called by ``EAGLEWorkerV2.forward_batch_generation`` before each decode step) asks
  the chooser for the step's tier from the batch size, the batch's mean SAGE alpha as last read on the host
  (:class:`~.clock.HostScalar`, set by the worker as :attr:`SageTierController.alpha`) and host-side estimates only, and
  swaps the state;
* ``on_verify_complete`` (SGLang's result processor, once accept lengths are on the host) feeds the chooser.

:class:`~.clock.StepClock` times each decode step for the chooser's cost table without a device sync and
:class:`~.clock.HostScalar` reads a device scalar (the batch's mean alpha) the same way (:mod:`.clock`).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import torch
from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController, SpecRuntimeState

from sage_plugin.core.tiers import Tier, TierChooser

__all__ = ["RankZeroTimes", "SageTierController", "TierSwitchLogFilter"]


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
    """

    def __init__(self, worker: Any, chooser: TierChooser, shared: RankZeroTimes | None = None) -> None:
        super().__init__(worker, _ChooserPolicy(chooser))
        self.chooser = chooser
        #: with tensor parallelism, rank 0's step timings shared with every rank (None: this rank's own)
        self.shared = shared
        self._states: dict[Tier, SpecRuntimeState] = {}  # type: ignore[assignment]
        self.active: Tier | None = None
        self.switches = 0
        #: the batch's mean SAGE alpha for the next choice (host float; None: not known yet)
        self.alpha: float | None = None

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
        tier = self.chooser.choose(batch_size, self.alpha)
        if tier != self.active:
            self._activate(tier)
            self.switches += 1

    def on_verify_complete(self, num_correct_drafts_per_req: list[int], batch_size: int) -> None:
        self.chooser.observe(num_correct_drafts_per_req)

    def record_cost(self, tier: Tier, batch_size: int, seconds: float) -> None:
        """A decode step's measured time, for the chooser (with tensor parallelism: rank 0's, at the next share)."""
        if self.shared is None:
            self.chooser.record_cost(tier, batch_size, seconds)
        else:
            self.shared.record_cost(tier, batch_size, seconds)

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
            else:
                self.chooser.record_cost(self.chooser.tiers[int(index)], int(bs), seconds)


class TierSwitchLogFilter(logging.Filter):
    """Drops SGLang's per-switch info line ("Switch adaptive runtime state"): SAGE may switch tiers every step and
    reports its switch count in its own metrics instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith("Switch adaptive runtime state")
