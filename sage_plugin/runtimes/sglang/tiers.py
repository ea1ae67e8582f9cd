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
  (:class:`HostScalar`, set by the worker as :attr:`SageTierController.alpha`) and host-side estimates only, and
  swaps the state;
* ``on_verify_complete`` (SGLang's result processor, once accept lengths are on the host) feeds the chooser.

:class:`StepClock` times each decode step for the chooser's cost table without a device sync: on CPU the step has
finished when the worker returns; on CUDA a pair of events per step is read once it has completed (``query()``),
one or more steps late.  :class:`HostScalar` reads a device scalar (the batch's mean alpha) the same way.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import torch
from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController, SpecRuntimeState

from sage_plugin.core.tiers import Tier, TierChooser

__all__ = ["HostScalar", "RankZeroTimes", "SageTierController", "StepClock", "TierSwitchLogFilter"]


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


class _EventQueue:
    """Payloads waiting for their CUDA event, released in launch order once ``query()`` says the event completed
    (never a sync)."""

    def __init__(self) -> None:
        self._open: deque[tuple[Any, Any]] = deque()

    def add(self, payload: Any, event: Any) -> None:
        self._open.append((payload, event))

    def ready(self) -> list[Any]:
        done = []
        while self._open and self._open[0][1].query():
            done.append(self._open.popleft()[0])
        return done


class StepClock:
    """Wall time of decode steps on ``device`` without a host sync (CPU: at once; CUDA: events, read late)."""

    def __init__(self, device: torch.device | str) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self._open = _EventQueue()

    def start(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, started: Any, key: Any) -> list[tuple[Any, float]]:
        """End the step begun at ``started``; returns ``(key, seconds)`` for every step whose time is known now."""
        if not self.cuda:
            return [(key, time.perf_counter() - started)]
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._open.add((key, started, end), end)
        return [(k, s.elapsed_time(e) / 1000.0) for k, s, e in self._open.ready()]


class HostScalar:
    """The latest value of a device scalar that has reached the host, without a sync.

    CPU: the value is on the host at once.  CUDA: :meth:`push` starts a non-blocking copy into one of a few pinned
    buffers and records an event; :meth:`latest` returns the newest copy whose event has completed (one or more steps
    late; the previous value, or None, while none has).  With ``fixed_lag`` (CUDA, tensor parallelism) the value is
    the one pushed exactly ``fixed_lag`` pushes ago on every rank (its copy waited for if it has not completed, which
    ``fixed_lag`` steps later it has in practice), so ranks that read their copies at different moments still agree.
    """

    RING = 4

    def __init__(self, device: torch.device | str, fixed_lag: int | None = None) -> None:
        self.cuda = torch.device(device).type == "cuda"
        if fixed_lag is not None and not 1 <= fixed_lag < self.RING:
            raise ValueError(f"fixed_lag must be in [1, {self.RING - 1}], got {fixed_lag}")
        self.fixed_lag = fixed_lag if self.cuda else None
        self._value: float | None = None
        self._open = _EventQueue()
        self._lagged: deque[tuple[torch.Tensor, Any]] = deque()
        self._free: list[torch.Tensor] = (
            [torch.empty((), dtype=torch.float32, pin_memory=True) for _ in range(self.RING)] if self.cuda else []
        )

    def push(self, value: torch.Tensor) -> None:
        """Start reading ``value`` (a 0-d float tensor on the device); dropped while every buffer is in flight."""
        if not self.cuda:
            self._value = float(value)
            return
        if self.fixed_lag is not None:
            if len(self._lagged) == self.fixed_lag:
                buf, ev = self._lagged.popleft()
                ev.synchronize()
                self._value = float(buf)
                self._free.append(buf)
            buf = self._free.pop()
            buf.copy_(value, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            self._lagged.append((buf, ev))
            return
        self._reap()
        if not self._free:
            return
        buf = self._free.pop()
        buf.copy_(value, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._open.add(buf, ev)

    def latest(self) -> float | None:
        if self.fixed_lag is None:
            self._reap()
        return self._value

    def _reap(self) -> None:
        for buf in self._open.ready():
            self._value = float(buf)
            self._free.append(buf)


class TierSwitchLogFilter(logging.Filter):
    """Drops SGLang's per-switch info line ("Switch adaptive runtime state"): SAGE may switch tiers every step and
    reports its switch count in its own metrics instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith("Switch adaptive runtime state")
