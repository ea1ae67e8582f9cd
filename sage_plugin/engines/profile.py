"""Measure a round's cost on this device: target verify time by node count, and one draft forward.

Feeds :class:`~sage_plugin.core.cost.RoundCost` (SAGE's ``node_budget="auto"``).  Timed on the batch's own
prefilled caches (so context length and batch size are the real ones), with dummy tokens whose KV rows are never
committed and are dropped afterwards.  Runs once per engine and batch size (a few forwards per measured count,
reported by ``sage bench`` as ``profile_s``), like SGLang's CUDA-graph capture at start-up.
"""

from __future__ import annotations

import statistics
import time

import torch

from .cost_samples import CostSamples
from .kv import SeqState
from .lm import EngineModel

__all__ = ["measure_cost_samples", "NODE_COUNTS"]

#: node counts (root excluded) timed; the others are interpolated.  Dense where a few-row BLAS call can cost more
#: than a larger one (the padding targets), sparse past it.
NODE_COUNTS = (*range(17), 20, 24, 32, 48, 64, 96, 128, 192, 256)
#: draft level widths timed when forwards are padded (``pad``); wider levels run unpadded.
MAX_PADDED_WIDTH = 16


def _forward_ms(forward, state: SeqState, q: int, repeats: int, sync) -> float:
    """Median wall time of a forward of ``q`` new tokens per request (causal among themselves), KV dropped after."""
    bsz, dev = state.next_pos.shape[0], state.next_pos.device
    ids = torch.zeros(bsz, q, dtype=torch.int64, device=dev)
    pos = state.next_pos[:, None] + torch.arange(q, device=dev)
    causal = torch.ones(q, q, dtype=torch.bool, device=dev).tril().expand(bsz, q, q)
    valid = torch.ones(bsz, q, dtype=torch.bool, device=dev)
    times = []
    for i in range(repeats + 1):  # the first run warms up
        mask = state.attention_mask(causal, valid)
        sync()
        t0 = time.perf_counter()
        forward(state, ids, pos, mask)
        sync()
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
        state.compact(slack=0.0)  # drop the uncommitted rows again
    return statistics.median(times)


@torch.inference_mode()
def measure_cost_samples(
    target: EngineModel,
    draft_forward,
    tstate: SeqState,
    dstate: SeqState,
    max_nodes: int,
    draft_width: int,
    repeats: int = 2,
    stop_ratio: float = 4.0,
    sync=lambda: None,
    pad: bool = False,
    max_width: int = 0,
    refresh: int = 0,
) -> CostSamples:
    """Time the target at the :data:`NODE_COUNTS` up to ``max_nodes`` and the draft at ``draft_width`` tokens.

    Counts are timed in increasing order until one costs more than ``stop_ratio`` plain steps: larger trees are
    then priced at infinity (a round would have to yield more than ``stop_ratio`` tokens just to break even), which
    keeps start-up short on slow devices.

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
        the samples (each timing the median of ``repeats``); ``.cost()`` is the :class:`RoundCost`.
    """
    counts = [c for c in NODE_COUNTS if c < max_nodes] + [max_nodes]
    out = CostSamples(max_nodes=max_nodes, pad=pad, typical_width=max(1, draft_width), refresh=refresh)
    first = None
    for c in counts:
        ms = _forward_ms(target.forward, tstate, c + 1, repeats, sync)
        out.add_verify(c, ms)
        out.limit = c
        first = ms if first is None else first
        if ms > stop_ratio * first:
            break
    for w in range(1, min(max_width, MAX_PADDED_WIDTH) + 1) if pad else ():
        out.add_draft(w, _forward_ms(draft_forward, dstate, w, repeats, sync))
    typical = out.cost().draft_width(out.typical_width) if out.draft else out.typical_width
    if typical not in out.draft:
        out.add_draft(typical, _forward_ms(draft_forward, dstate, typical, repeats, sync))
    return out.start()
