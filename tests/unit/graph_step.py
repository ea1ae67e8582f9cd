"""SGLang's per-step inputs and the SAGE worker's per-step path, mirrored without SGLang or pytest.

Shared by ``tests/unit/test_graph_safety.py`` (the CPU proofs: no host sync, fake CUDA, ``make_fx`` replay) and
``tools/gpu_step_graph.py`` (the same path on a real GPU: ``torch.cuda.set_sync_debug_mode("error")``, a
``torch.cuda.graph`` capture replayed with new inputs against eager, step timings).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from sage_plugin.config import AlgorithmConfig
from sage_plugin.core.beam_selection import eagle_beam_candidates
from sage_plugin.core.controller import HistoryState
from sage_plugin.runtimes.sglang.selection import STAT_FIELDS, BeamSelection, DraftCounters, planned_draft
from sage_plugin.serving.slots import SlotState

from .config_cases import SELECTION_SWITCHES

TOPK = 4  # --speculative-eagle-topk
VOCAB = 32
MAX_BS = 8
NUM_SLOTS = 2 * MAX_BS + 1  # SGLang: req_to_token_pool.size + 1
#: the brief's small SGLang config and the paper defaults (first round: the static mc_sim_7b_63 tree, ranks <= 3)
SMALL = AlgorithmConfig(k=4, d_min=2, d_max=4, d_cap=6, w_min=1, w_max=4, n_max=11, first_round_static=False)
DEFAULTS = AlgorithmConfig()
#: the per-step path's switches: each field's values
SWITCHES: dict[str, tuple] = dict(
    alpha_source=("lag1", "fresh"),
    use_history=(True, False),
    use_entropy=(True, False),
    history_mode=("absolute", "relative"),
    history_tau=("drafts", "drafts_plus_bonus"),
    history_cooldown=("full_window", "none"),
    first_round_static=(True, False),
    **SELECTION_SWITCHES,
)


@dataclass
class Beam:
    """One draft step's inputs as SGLang 0.5.23 builds them (``EagleDraftWorker.draft_forward``)."""

    root: torch.Tensor  # spec.topk_p [B, t]: the root's top-t draft probabilities, descending
    score_list: list[torch.Tensor]  # [B, 1, t], then [B, t, t] per later step
    token_list: list[torch.Tensor]  # [B, t], then [B, t * t]
    parents_list: list[torch.Tensor]  # [B, t + 1], then [B, t]

    def tensors(self) -> list[torch.Tensor]:
        return [self.root, *self.score_list, *self.token_list, *self.parents_list]

    @staticmethod
    def of(tensors: list[torch.Tensor], steps: int) -> "Beam":
        return Beam(tensors[0], tensors[1 : 1 + steps], tensors[1 + steps : 1 + 2 * steps], tensors[1 + 2 * steps :])


def sglang_beam(bsz: int, steps: int, *, gen: torch.Generator | None = None, device: str = "cpu") -> Beam:
    """``steps`` draft steps of a ``TOPK``-wide beam over random draft distributions (``select_top_k_tokens``);
    each request's distributions have their own sharpness, so confidence (and D, W) differ between requests."""
    sharp = torch.rand(bsz, generator=gen, device=device) * 6.0 + 0.2

    def draft(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # one draft forward: top-t (p, token)
        logits = torch.randn(rows.shape[0], VOCAB, generator=gen, device=device) * rows[:, None]
        return torch.topk(torch.softmax(logits, -1), TOPK, dim=-1)

    topk_p, topk_index = draft(sharp)
    beam = Beam(topk_p, [topk_p.unsqueeze(1)], [topk_index], [torch.arange(-1, TOPK, device=device).expand(bsz, -1)])
    scores = topk_p
    for i in range(1, steps):
        topk_p, topk_index = draft(sharp.repeat_interleave(TOPK))
        expand_scores = scores.unsqueeze(2) * topk_p.view(-1, TOPK, TOPK)
        scores, cs_index = torch.topk(expand_scores.flatten(start_dim=1), TOPK, dim=-1)
        beam.score_list.append(expand_scores)
        beam.token_list.append(topk_index.view(-1, TOPK * TOPK))
        beam.parents_list.append(cs_index + (TOPK * TOPK * (i - 1) + TOPK))
    return beam


def n_select(cfg: AlgorithmConfig, steps: int) -> int:
    """``--speculative-num-draft-tokens - 1`` as the SGLang adapter derives it (``args.spec_sizes``)."""
    return min(cfg.max_tree_nodes, TOPK + (steps - 1) * TOPK * TOPK)


def new_selection(cfg: AlgorithmConfig, device: str = "cpu", max_bs: int = MAX_BS) -> BeamSelection:
    """The worker's :class:`BeamSelection` (persistent ``[max_bs]`` buffers: depth, width, shaped, first)."""
    return BeamSelection(cfg, TOPK, max_bs, device)


def selection_buffers(sel: BeamSelection) -> list[torch.Tensor]:
    return [sel.depth, sel.width, sel.shaped, sel.first]


def bind_selection(template: BeamSelection, tensors: list[torch.Tensor]) -> BeamSelection:
    """A BeamSelection whose buffers are ``tensors`` (a captured graph's inputs)."""
    sel = copy.copy(template)
    sel.depth, sel.width, sel.shaped, sel.first = tensors
    return sel


def new_counters(device: str = "cpu", max_bs: int = MAX_BS) -> DraftCounters:
    """The worker's :class:`DraftCounters` (``stats [6]`` float64, ``rounds [max_bs, 4]`` float32)."""
    return DraftCounters(max_bs, device)


def counter_buffers(counters: DraftCounters) -> list[torch.Tensor]:
    return [counters.stats, counters.rounds]


def bind_counters(tensors: list[torch.Tensor]) -> DraftCounters:
    """DraftCounters whose buffers are ``tensors`` (a captured graph's inputs)."""
    counters = DraftCounters.__new__(DraftCounters)
    counters.stats, counters.rounds = tensors
    return counters


#: the metrics that sum integers (exact in float64); ``alpha_sum`` sums floats, so its order of summation shows
STATS_EXACT = [i for i, name in enumerate(STAT_FIELDS) if name != "alpha_sum"]

#: the outputs of :func:`draft_step` and :func:`decode_step`, in order
STEP_OUTPUTS = ("alpha", "depth", "width", "first_round", "parent_list", "index", "draft_tokens")


def draft_step(state: SlotState, sel: BeamSelection, counters: DraftCounters, slots, beam: Beam, num_draft_token):
    """The SAGE worker's draft forward (``SageDraftMixin.draft_forward``, the part SGLang's draft graph captures):
    :func:`planned_draft` around the selection (``organize_draft_results``; the draft model's forwards, which
    make ``beam``, are SGLang's).

    ``slots`` ``[B]``, ``beam`` of ``B`` rows; returns :data:`STEP_OUTPUTS`: ``[B]`` alpha (float32), D, W (int64),
    first round (bool) of each row's plan, then the selection's ``parent_list``, ``index`` and ``draft_tokens``."""
    parent_list, index, draft_tokens = planned_draft(
        state, sel, counters, slots, beam.root,
        lambda: sel(beam.score_list, beam.token_list, beam.parents_list, num_draft_token),
    )  # fmt: skip
    bs = slots.shape[0]
    plan = (counters.rounds[:bs, 0], sel.depth[:bs], sel.width[:bs], sel.first[:bs])
    return (*(t.clone() for t in plan), parent_list, index, draft_tokens)


def observe_step(state: SlotState, counters: DraftCounters, slots, accept_lens) -> None:
    """After verify (``SageDraftMixin.sage_observe``, eager in the worker): ``accept_lens [B]`` into the slots'
    history and the accept-length counter."""
    state.observe(slots, accept_lens)
    counters.add_accepted(accept_lens)


def decode_step(
    state: SlotState, sel: BeamSelection, counters: DraftCounters, slots, beam: Beam, accept_lens, num_draft_token
):
    """One decode step of the SAGE worker: :func:`draft_step`, then :func:`observe_step`; returns the draft step's
    :data:`STEP_OUTPUTS`."""
    out = draft_step(state, sel, counters, slots, beam, num_draft_token)
    observe_step(state, counters, slots, accept_lens)
    return out


def padded(slots: torch.Tensor, beam: Beam, bs: int, gen: torch.Generator | None = None) -> tuple[torch.Tensor, Beam]:
    """The batch as SGLang's draft graph runner sees it at captured size ``bs`` (``EagleDraftCudaGraphRunner.execute``
    pads ``req_pool_indices`` with slot 0 and ``topk_p`` with zeros): ``(slots [bs], beam of bs rows)``.

    The padded rows' beam is what SGLang's draft steps make of a zero root: zero scores and tokens, and parents
    from a random beam (the structure ``select_top_k_tokens`` gives any row)."""
    raw, steps = slots.shape[0], len(beam.score_list)
    pad = sglang_beam(bs - raw, steps, gen=gen, device=slots.device.type)
    zero = [torch.zeros_like(t) for t in [pad.root, *pad.score_list, *pad.token_list]]
    pad = Beam.of([*zero, *pad.parents_list], steps)
    tensors = [torch.cat([a, b]) for a, b in zip(beam.tensors(), pad.tensors())]
    return torch.cat([slots, slots.new_zeros(bs - raw)]), Beam.of(tensors, steps)


def state_tensors(state: SlotState) -> list[torch.Tensor]:
    return [state.alpha, state.first_round, *(getattr(state.history, f) for f in HistoryState.__slots__)]


def bind(template: SlotState, tensors: list[torch.Tensor]) -> SlotState:
    """A SlotState whose state tensors are ``tensors`` (a captured graph's inputs)."""
    state = copy.copy(template)
    state.alpha, state.first_round = tensors[:2]
    state.history = HistoryState(*tensors[2:])
    return state


def copies(state: SlotState, sel: BeamSelection, counters: DraftCounters):
    """``(state, sel, counters)`` of the SAGE step on copies of every tensor (an eager twin from the same point)."""
    return (
        bind(state, [t.clone() for t in state_tensors(state)]),
        bind_selection(sel, [t.clone() for t in selection_buffers(sel)]),
        bind_counters([t.clone() for t in counter_buffers(counters)]),
    )


def random_round(gen: torch.Generator, bsz: int, steps: int, pool: torch.Tensor):
    """A decode step's batch: distinct slot ids from ``pool``, SGLang's beam, accept lengths in [1, steps + 1]."""
    slots = pool[torch.randperm(pool.shape[0], generator=gen)[:bsz]]
    return slots, sglang_beam(bsz, steps, gen=gen), torch.randint(1, steps + 2, (bsz,), generator=gen)


def assert_is_beam_tree(index: torch.Tensor, beam: Beam) -> None:
    """Ascending distinct candidates whose parents are selected too (the tree SGLang's verify builds)."""
    scores = torch.cat(beam.score_list, dim=1).flatten(1)
    parents = beam.parents_list[0][:, :1] if len(beam.parents_list) == 1 else torch.cat(beam.parents_list[:-1], 1)
    parent = eagle_beam_candidates(scores, parents, TOPK).parent.gather(1, index)
    assert bool((index[:, 1:] > index[:, :-1]).all()) and bool((index >= 0).all())
    assert bool((index < scores.shape[1]).all())
    assert bool(((parent == -1) | (parent[:, :, None] == index[:, None, :]).any(-1)).all())
