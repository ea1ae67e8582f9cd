"""Measure a round's cost on this device: target verify time by node count, and one draft forward.

Feeds :class:`~sage_plugin.core.cost.RoundCost` (SAGE's ``node_budget="auto"``).  Timed on the batch's own
prefilled caches (so context length and batch size are the real ones), with dummy tokens whose KV rows are never
committed and are dropped afterwards.  Runs once per engine and batch size (a few forwards per measured count,
reported by ``sage bench`` as ``profile_s``), like SGLang's CUDA-graph capture at start-up.
"""

from __future__ import annotations

from typing import Iterator, Sequence, TypeVar

import torch

from .cost_samples import CostSamples, timed_ms
from .kv import SeqState
from .lm import EngineModel

__all__ = ["measure_cost_samples", "alternating", "interleaved_ms", "NODE_COUNTS"]

T = TypeVar("T")

#: node counts (root excluded) timed; the others are interpolated.  Dense where a few-row BLAS call can cost more
#: than a larger one (the padding targets), sparse past it.
NODE_COUNTS = (*range(17), 20, 24, 32, 48, 64, 96, 128, 192, 256)
#: draft level widths timed when forwards are padded (``pad``); wider levels run unpadded.
MAX_PADDED_WIDTH = 16


def _forward_ms(forward, state: SeqState, q: int, sync) -> float:
    """Wall time of one forward of ``q`` new tokens per request (causal among themselves), its KV dropped after."""
    bsz, dev = state.next_pos.shape[0], state.next_pos.device
    ids = torch.zeros(bsz, q, dtype=torch.int64, device=dev)
    pos = state.next_pos[:, None] + torch.arange(q, device=dev)
    causal = torch.ones(q, q, dtype=torch.bool, device=dev).tril().expand(bsz, q, q)
    mask = state.attention_mask(causal, torch.ones(bsz, q, dtype=torch.bool, device=dev))
    _, ms = timed_ms(forward, sync, state, ids, pos, mask)
    state.compact(slack=0.0)  # drop the uncommitted rows again
    return ms


def alternating(items: Sequence[T], rounds: int) -> Iterator[tuple[int, T]]:
    """``(round, item)`` for every item in every round, the rounds alternating between ``items``' order and its
    reverse.

    >>> "".join(item for _, item in alternating("abc", 3))
    'abccbaabc'

    Timing repeats in this order, a device whose speed drifts linearly while it is timed (a shared VM, a GPU warming
    up) moves every item's samples alike: over an even number of rounds the two middle samples of each item were
    taken at times whose mean is the same for all.  Timing each item's repeats back to back puts the drift between
    items instead.
    """
    for r in range(rounds):
        for item in items if r % 2 == 0 else reversed(items):
            yield r, item


def interleaved_ms(time_one, sizes: Sequence[T], sweeps: int) -> dict[T, list[float]]:
    """``{size: [ms per sweep]}``: ``time_one(size)`` over every size once per sweep, in :func:`alternating` order,
    so the curve's shape (which size is cheapest, where padding pays) survives a drifting device."""
    out: dict[T, list[float]] = {s: [] for s in sizes}
    for _, s in alternating(sizes, sweeps):
        out[s].append(time_one(s))
    return out


@torch.inference_mode()
def measure_cost_samples(
    target: EngineModel,
    draft_forward,
    tstate: SeqState,
    dstate: SeqState,
    max_nodes: int,
    draft_width: int,
    repeats: int = 4,
    stop_ratio: float = 4.0,
    sync=lambda: None,
    pad: bool = False,
    max_width: int = 0,
    refresh: int = 0,
) -> CostSamples:
    """Time the target at the :data:`NODE_COUNTS` up to ``max_nodes`` and the draft at ``draft_width`` tokens.

    A first sweep warms every size up, in increasing order, and stops at the first count that costs more than
    ``stop_ratio`` plain steps: larger trees are then priced at infinity (a round would have to yield more than
    ``stop_ratio`` tokens just to break even), which keeps start-up short on slow devices.  Then ``repeats`` sweeps
    over every kept size, target and draft together, alternate in direction (:func:`interleaved_ms`): a machine
    whose speed drifts during the timing shifts the whole curve, not the cost of one size against its neighbours,
    which is what decides the tree sizes and the padding.

    Args:
        draft_forward: the draft forward the decode loop runs (``SpecEngine.draft_forward``: a restricted head's
            :meth:`~.lm.TextModel.forward_head`, else the draft's ``forward``), called as ``(state, ids, pos, mask)``.
        tstate, dstate: prefilled target / draft states of the batch (left as they were).
        max_nodes: largest tree (draft nodes, root excluded) the policy can build.
        draft_width: tokens per request in a typical draft level.
        sync: device synchronisation (``torch.cuda.synchronize`` on CUDA).
        pad: price and run forwards at the cheapest measured size at or above theirs
            (:meth:`RoundCost.from_samples`); the draft is then also timed at every width ``1..max_width`` (at most
            :data:`MAX_PADDED_WIDTH`) and ``draft_ms`` is the padded ``draft_width``'s.
        refresh: the samples' in-loop rebuild period (:class:`~.cost_samples.CostSamples`).

    Returns:
        the samples (``repeats`` timings of each size; ``.cost()`` prices their medians).
    """
    counts = [c for c in NODE_COUNTS if c < max_nodes] + [max_nodes]
    out = CostSamples(max_nodes=max_nodes, pad=pad, typical_width=max(1, draft_width), refresh=refresh)
    kept, first = [], None
    for c in counts:  # the warm-up sweep, which also finds where the tree stops paying
        ms = _forward_ms(target.forward, tstate, c + 1, sync)
        kept.append(c)
        first = ms if first is None else first
        if ms > stop_ratio * first:
            break
    out.limit = kept[-1]
    widths = list(range(1, min(max_width, MAX_PADDED_WIDTH) + 1)) if pad else []
    if out.typical_width > len(widths):  # past the padded widths (or unpadded): timed at its own size as well
        widths.append(out.typical_width)
    for w in widths:
        _forward_ms(draft_forward, dstate, w, sync)  # warm-up
    jobs = [("verify", c) for c in kept] + [("draft", w) for w in widths]

    def time_one(job: tuple[str, int]) -> float:
        kind, size = job
        if kind == "verify":
            return _forward_ms(target.forward, tstate, size + 1, sync)
        return _forward_ms(draft_forward, dstate, size, sync)

    for (kind, size), times in interleaved_ms(time_one, jobs, max(1, repeats)).items():
        for ms in times:
            (out.add_verify if kind == "verify" else out.add_draft)(size, ms)
    return out.start()
