"""Host reads of device work without a sync: step times (:class:`StepClock`) and a device scalar (:class:`HostScalar`).

On CPU both are immediate.  On CUDA each step records events and the host reads a result once ``query()`` says its
event completed, one or more steps late, never blocking; with tensor parallelism :class:`HostScalar` can instead read
at a fixed lag, the same on every rank.  Torch and the standard library only (no SGLang), so a GPU machine without
SGLang can check them (``tools/gpu_host_reads.py``).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch

__all__ = ["HostScalar", "StepClock"]


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
        self._free: list[torch.Tensor] = [self._pinned() for _ in range(self.RING)] if self.cuda else []

    @staticmethod
    def _pinned() -> torch.Tensor:
        return torch.empty((), dtype=torch.float32, pin_memory=True)

    def push(self, value: torch.Tensor) -> None:
        """Start reading ``value`` (a 0-d float tensor on the device); dropped while every buffer is in flight."""
        if not self.cuda:
            self._value = float(value)
            return
        if self.fixed_lag is not None:
            if len(self._lagged) == self.fixed_lag:
                buf, ev = self._lagged.popleft()
                if not ev.query():  # rare: a copy still in flight fixed_lag steps later is waited for
                    ev.synchronize()
                self._value = float(buf)
                self._free.append(buf)
            self._lagged.append(self._copy(value))
            return
        self._reap()
        if self._free:
            self._open.add(*self._copy(value))

    def _copy(self, value: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Start ``value``'s non-blocking copy into a free pinned buffer; ``(buffer, its completion event)``."""
        buf = self._free.pop()
        buf.copy_(value, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        return buf, ev

    def latest(self) -> float | None:
        if self.fixed_lag is None:
            self._reap()
        return self._value

    def _reap(self) -> None:
        for buf in self._open.ready():
            self._value = float(buf)
            self._free.append(buf)
