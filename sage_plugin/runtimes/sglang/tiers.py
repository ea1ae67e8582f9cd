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

__all__ = ["HostScalar", "SageTierController", "StepClock", "TierSwitchLogFilter"]


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

    def __init__(self, worker: Any, chooser: TierChooser) -> None:
        super().__init__(worker, _ChooserPolicy(chooser))
        self.chooser = chooser
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

    def _activate(self, tier: Tier) -> None:  # type: ignore[override]
        state = self._states.get(tier)
        if state is None:
            raise ValueError(f"no runtime state built for SAGE tier {tier}")
        self.worker.apply_runtime_state(state)
        self.active = tier


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
    late; the previous value, or None, while none has).
    """

    RING = 4

    def __init__(self, device: torch.device | str) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self._value: float | None = None
        self._open = _EventQueue()
        self._free: list[torch.Tensor] = (
            [torch.empty((), dtype=torch.float32, pin_memory=True) for _ in range(self.RING)] if self.cuda else []
        )

    def push(self, value: torch.Tensor) -> None:
        """Start reading ``value`` (a 0-d float tensor on the device); dropped while every buffer is in flight."""
        if not self.cuda:
            self._value = float(value)
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
