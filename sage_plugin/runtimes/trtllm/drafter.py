"""SAGE as a TensorRT-LLM drafter (``UserProvidedDecodingConfig(drafter=...)``): an entropy-sized chain per request.

TensorRT-LLM's executor gives every generation request ``K = max_draft_len`` draft slots per step
(``py_draft_tokens = [0] * K``, ``py_draft_pages_allocated = K``), calls ``drafter.prepare_draft_tokens(batch)``,
zero-pads each request's ``py_draft_tokens`` back to ``K`` and verifies ``1 + K`` tokens with the target
(``docs/design/trtllm.md``, "Executor loop").  The user-provided path verifies a linear draft, so SAGE's tree is a chain
(width 1) here, and what SAGE decides is its length, per request and per step:

1. the outcome of the previous step, ``py_num_accepted_draft_tokens``, feeds the request slot's history controller
   (:meth:`sage_plugin.serving.slots.SlotState.observe`; slot = ``py_seq_slot``; a new request resets its slot);
2. the draft model catches up with the request's tokens (``get_tokens(0)``; its KV cache is cropped to the accepted
   prefix first, :mod:`.runner`) and gives the root distribution;
3. alpha (Eq. 9, top-k of the root) and ``D`` (Eq. 10 with the slot's history ``D_max``) come from
   :meth:`SlotState.plan`; the chain length is ``min(D, n_max, py_draft_pages_allocated)``;
4. a greedy chain of that length is drafted and written to ``py_draft_tokens`` (the executor pads it), with
   ``py_draft_logits [D, V]`` and ``py_draft_use_greedy_sampling = True``: TensorRT-LLM's rejection sampler then
   treats each draft token as drawn from a one-hot distribution, which keeps sampling requests lossless.

Worked example (d_min 2, d_max 4, K = 6, alpha_source fresh)::

    root top-k probs [0.97, 0.01, 0.01, 0.01]  alpha 0.88  D = round(2 + 0.88 * 2) = 4  -> py_draft_tokens [a, b, c, d]
    next step: py_num_accepted_draft_tokens = 2 -> history sees tau 2; the draft KV is cropped after b

:class:`SageChainDrafter` holds all of it and imports no TensorRT-LLM (the fake executor of
``tests/engine/test_trtllm_fake_loop.py`` drives it); :func:`trtllm_drafter_class` makes it a subclass of the
installed ``Drafter``.
"""

from __future__ import annotations

import inspect
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping

import torch

from ...config import SageConfig
from ...serving.slots import SlotState
from .runner import DraftRunner, HFDraftRunner

__all__ = [
    "DEFAULT_SLOTS",
    "DraftRound",
    "DrafterSpec",
    "SageChainDrafter",
    "build_trtllm_drafter",
    "trtllm_drafter_class",
]

#: Request slots when the LLM's ``max_batch_size`` is not given (SAGE's state per slot is a few dozen bytes).
DEFAULT_SLOTS = 4096


@dataclass(frozen=True)
class DrafterSpec:
    """Everything that builds a drafter, picklable (TensorRT-LLM may ship the drafter to its worker process).

    Attributes:
        sage: the SageConfig fields (``SageConfig.to_dict()``).
        draft_model: HF causal LM directory or hub id (same vocabulary as the target).
        max_draft_len: ``K``, the executor's draft slots per request (``UserProvidedDecodingConfig.max_draft_len``).
        device, dtype: where and how the draft runs (``cuda``, ``bfloat16`` on a GPU server).
        num_slots: request slots (``py_seq_slot < num_slots``: at least the LLM's ``max_batch_size``).
        max_concurrency: TensorRT-LLM's gate: no speculation above this many requests (None: always).
        draft_logits: set ``py_draft_logits`` (lossless sampling for ``temperature > 0`` requests).
    """

    sage: Mapping[str, Any]
    draft_model: str
    max_draft_len: int
    device: str = "cpu"
    dtype: str = "float32"
    num_slots: int = DEFAULT_SLOTS
    max_concurrency: int | None = None
    draft_logits: bool = True

    def make_runner(self) -> DraftRunner:
        return HFDraftRunner.load(self.draft_model, self.device, self.dtype)


@dataclass(frozen=True)
class DraftRound:
    """One request's plan in one step: ``alpha`` and the slot's ``d_max`` gave ``depth`` (Eq. 10); ``drafted`` tokens
    were written (``min(depth, n_max, allocated)``)."""

    request_id: Hashable
    slot: int
    alpha: float
    d_max: int
    depth: int
    drafted: int


@dataclass
class _Tracked:
    slot: int
    pending: int = 0  # real drafts proposed in the last step, awaiting py_num_accepted_draft_tokens


def _is_dummy(req: Any) -> bool:
    return any(bool(getattr(req, a, False)) for a in ("is_dummy", "is_cuda_graph_dummy", "is_attention_dp_dummy"))


def _request_id(req: Any) -> Hashable:
    rid = getattr(req, "py_request_id", None)
    return rid if rid is not None else req.request_id


class SageChainDrafter:
    """SAGE's per-request chain for TensorRT-LLM's executor, without TensorRT-LLM.

    Args:
        cfg: the SAGE config (checked against ``TRTLLM_SUPPORT`` by the launcher).
        runner: the draft model (:class:`~.runner.DraftRunner`), or a callable building it on first use.
        max_draft_len: ``K``.
        num_slots: request slots the SAGE state holds (``py_seq_slot`` must be smaller).
        max_concurrency: kept for TensorRT-LLM's ``should_use_spec_decode``.
        draft_logits: write ``py_draft_logits`` and ``py_draft_use_greedy_sampling``.
        record: how many recent :class:`DraftRound` to keep in :attr:`rounds`.
    """

    def __init__(
        self,
        cfg: SageConfig,
        runner: DraftRunner | Callable[[], DraftRunner],
        max_draft_len: int,
        *,
        num_slots: int = DEFAULT_SLOTS,
        max_concurrency: int | None = None,
        draft_logits: bool = True,
        record: int = 4096,
    ) -> None:
        self.sage_cfg = cfg
        self.max_draft_len = max_draft_len
        self.max_total_draft_tokens = max_draft_len
        self.max_concurrency = max_concurrency
        self.draft_logits = draft_logits
        self.num_slots = num_slots
        self._runner = runner if hasattr(runner, "catch_up") else None
        self._make_runner = None if self._runner is not None else runner
        self.sage_slots = SlotState(cfg.algorithm, num_slots)
        self._tracked: dict[Hashable, _Tracked] = {}
        self._owner: dict[int, Hashable] = {}
        self.rounds: deque[DraftRound] = deque(maxlen=record)

    @property
    def runner(self) -> DraftRunner:
        if self._runner is None:
            self._runner = self._make_runner()
        return self._runner

    def prepare_draft_tokens(self, scheduled_requests: Any, resource_manager: Any = None) -> None:
        """Write SAGE's chain into ``py_draft_tokens`` of every generation request that has draft slots."""
        gen = [r for r in scheduled_requests.generation_requests if not _is_dummy(r)]
        self._observe(gen)
        active = [r for r in gen if self._allocated(r) > 0]
        if not active:
            return
        device = self.sage_slots.alpha.device
        slot_list = [self._tracked[_request_id(r)].slot for r in active]
        slots = torch.tensor(slot_list, dtype=torch.int64, device=device)
        roots = torch.stack([self.runner.catch_up(_request_id(r), list(r.get_tokens(0))) for r in active])
        k = min(self.sage_cfg.algorithm.k, roots.shape[-1])
        top = torch.softmax(roots.float(), dim=-1).topk(k, dim=-1).values
        shape = self.sage_slots.plan(slots, top.to(device))
        d_max = self.sage_slots.history.d_max.index_select(0, slots)
        alpha, dmax, depth = torch.stack([shape.alpha, d_max.float(), shape.depth.float()]).tolist()  # one host copy
        for i, req in enumerate(active):
            n = max(1, min(int(depth[i]), self.sage_cfg.algorithm.n_max, self._allocated(req)))
            self._draft_chain(req, roots[i], n)
            self.rounds.append(DraftRound(_request_id(req), slot_list[i], alpha[i], int(dmax[i]), int(depth[i]), n))

    def _allocated(self, req: Any) -> int:
        if getattr(req, "py_disable_speculative_decoding", False):
            return 0
        return int(getattr(req, "py_draft_pages_allocated", 0) or 0)

    def _observe(self, gen: list[Any]) -> None:
        """Track new requests (their slot is reset) and feed last step's acceptance to the history controller."""
        fresh, seen, accept = [], [], []
        for req in gen:
            rid, slot = _request_id(req), req.py_seq_slot
            if slot is None or not 0 <= slot < self.num_slots:
                raise ValueError(f"py_seq_slot {slot} outside the drafter's {self.num_slots} slots (num_slots)")
            tracked = self._tracked.get(rid)
            if tracked is None or tracked.slot != slot:
                self._claim(rid, slot)
                fresh.append(slot)
            elif tracked.pending > 0:
                accepted = min(max(int(req.py_num_accepted_draft_tokens), 0), tracked.pending)
                seen.append(slot)
                accept.append(accepted + 1)  # accept length: accepted drafts + the target's own token
                tracked.pending = 0
        device = self.sage_slots.alpha.device
        if fresh:
            self.sage_slots.reset(torch.tensor(fresh, dtype=torch.int64, device=device))
        if seen:
            self.sage_slots.observe(
                torch.tensor(seen, dtype=torch.int64, device=device), torch.tensor(accept, device=device)
            )

    def _claim(self, rid: Hashable, slot: int) -> None:
        old = self._owner.get(slot)
        if old is not None and old != rid:  # the slot's previous request has finished
            self._tracked.pop(old, None)
            if self._runner is not None:
                self._runner.release(old)
        previous = self._tracked.get(rid)
        if previous is not None:
            self._owner.pop(previous.slot, None)
        self._owner[slot] = rid
        self._tracked[rid] = _Tracked(slot)

    def _draft_chain(self, req: Any, root: torch.Tensor, n: int) -> None:
        rid = _request_id(req)
        logits = [root]
        tokens = [int(root.argmax())]
        for _ in range(n - 1):
            logits.append(self.runner.extend(rid, tokens[-1]))
            tokens.append(int(logits[-1].argmax()))
        req.py_draft_tokens = tokens
        if self.draft_logits:
            req.py_draft_logits = torch.stack(logits)
            req.py_draft_use_greedy_sampling = True
        self._tracked[rid].pending = n


class _TrtllmDrafter(SageChainDrafter):
    """The part of ``SageTrtllmDrafter`` that knows TensorRT-LLM's ``Drafter`` (see :func:`trtllm_drafter_class`)."""

    _needs_padding_kv_extension = True  # main: pad extends the KV capacity when the sampler rewinds padded drafts

    def __init__(self, spec: DrafterSpec, runner: DraftRunner | None = None) -> None:
        cfg = SageConfig.from_mapping(spec.sage)
        super().__init__(
            cfg, runner or spec.make_runner, spec.max_draft_len, num_slots=spec.num_slots,
            max_concurrency=spec.max_concurrency, draft_logits=spec.draft_logits,
        )  # fmt: skip
        self._spec = spec
        base_init = super(SageChainDrafter, self).__init__
        offered = {
            "max_draft_len": spec.max_draft_len,
            "max_total_draft_tokens": spec.max_draft_len,
            "max_concurrency": spec.max_concurrency,
            "draft_len_schedule": None,
        }
        accepted = inspect.signature(base_init).parameters
        base_init(**{name: value for name, value in offered.items() if name in accepted})
        self.max_draft_len = spec.max_draft_len  # 1.2.0rc2's Drafter pads to this attribute and does not set it

    def __reduce__(self) -> tuple:
        return build_trtllm_drafter, (self._spec, self._drafter_base)


_CLASSES: dict[type, type] = {}


def trtllm_drafter_class(base: type | None = None, *, skip_check: bool = False) -> type:
    """``SageTrtllmDrafter``: :class:`SageChainDrafter` on TensorRT-LLM's ``Drafter`` (``base``; default the
    installed one, which runs the contract check).  ``Drafter.__init__`` gets the keywords its signature accepts (the
    1.2.0rc2 one takes only ``max_concurrency``); its final ``should_use_spec_decode`` and
    ``pad_draft_tokens_for_cuda_graph`` are inherited."""
    if base is None:
        from .installed import drafter_base

        base = drafter_base(skip_check=skip_check)
    cls = _CLASSES.get(base)
    if cls is None:
        attrs = {"__module__": __name__, "_drafter_base": base}
        cls = _CLASSES[base] = type("SageTrtllmDrafter", (_TrtllmDrafter, base), attrs)
    return cls


def build_trtllm_drafter(spec: DrafterSpec, base: type | None = None, runner: DraftRunner | None = None) -> Any:
    """A ``SageTrtllmDrafter`` for ``spec`` (the draft model loads on the first step, in the executor's process)."""
    return trtllm_drafter_class(base)(spec, runner)
