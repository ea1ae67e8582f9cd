"""A ragged verify on CPU (``ragged_verify``): each request verifies only the draft nodes likely to pay.

SGLang verifies ``N`` tokens per request at every drafted step (the tier's ``draft_tokens``).  Where a step is
compute-bound (a CPU at many requests) every verified row costs a sizeable share of a decoded token, while the draft's
least likely nodes are rarely accepted (docs/design/sglang-internals.md, "Ragged verify").  With ``ragged_verify`` a node whose draft path
probability (the beam's score of the node, :class:`.selection.BeamSelection` keeps it) is below the tier chooser's
:meth:`~sage_plugin.serving.tiers.TierChooser.row_threshold` at the batch size is dropped from the step:

* **unlinked** from the tree SGLang walks (:func:`unlink`: ``retrieve_next_token`` / ``retrieve_next_sibling`` skip
  it), so verification can never accept it or read its row;
* **not computed**: the TARGET_VERIFY forward runs on the live rows only (:class:`RaggedVerifyTarget`: input ids,
  positions, KV slots and M-RoPE positions of the live rows; the CPU attention op reads ragged extend lengths with
  the per-request ``[E_b, E_b]`` blocks of the tree mask, :func:`compact_mask`, handed to SGLang's AMX backend by the
  hook ``hooks.amx_extend_metadata`` as its verify input's ``sage_ragged``), and its logits (and hidden states)
  are scattered back to the ``[B * N]`` rows the rest of upstream's verify indexes.  A dropped row's logits are
  zeros: nothing reads them (a dropped node is never accepted, so it is never a parent of a checked token nor the
  last accepted node whose row gives the bonus token).

Greedy batches on CPU only (the live set is a host decision: a ``nonzero`` sync, free on CPU, and a shape a captured
graph could not take); sampling, grammar and TP > 1 batches, and CUDA, verify every node.  The output is unchanged:
the accepted path is the longest path of target-matching tokens among the live nodes, and every live node's logits
are computed over exactly the keys it saw before (its ancestors among the live rows, which are all its ancestors:
the live set is closed under ancestors).

Worked example (``B = 2``, ``N = 4``, threshold 0.3; request 0's nodes 1-3 score 0.6, 0.4, 0.2 with node 3 under
node 1; request 1's 0.25, 0.1, 0.05): live rows ``[[1, 1, 1, 0], [1, 0, 0, 0]]``, so the forward computes 4 rows
(extend lengths ``[3, 1]``) instead of 8, and request 1 is verified like a decode step.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

__all__ = ["RaggedVerifyTarget", "compact_mask", "live_rows", "ragged_runs", "ragged_target", "unlink", "verify_target"]


def ragged_runs(cfg: Any, device: Any) -> bool:
    """Whether a server verifies ragged (``cfg``: its serving section): ``ragged_verify`` with tiers (the threshold
    prices a node against the off tier's measured step), on CPU, one tensor-parallel rank (module docstring).  The
    rank count is read from SGLang only when the rest holds."""
    if not (cfg.ragged_verify and cfg.tiers) or torch.device(device).type != "cpu":
        return False
    from sglang.srt.distributed import get_tp_group  # imports SGLang; the rest of this module does not

    return get_tp_group().world_size == 1


def live_rows(node_scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """``[B, N]`` bool: the root (column 0) and every node whose path score ``node_scores [B, N - 1]`` reaches
    ``threshold``."""
    root = torch.ones_like(node_scores[:, :1], dtype=torch.bool)
    return torch.cat([root, node_scores >= threshold], dim=1)


def _skip_dead(ptr: torch.Tensor, next_sibling: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """Follow ``next_sibling`` from each pointer past dead nodes (``-1``: none)."""
    for _ in range(ptr.shape[1]):
        at = ptr.clamp(min=0)
        dead = (ptr >= 0) & ~live.gather(1, at)
        if not bool(dead.any()):
            break
        ptr = torch.where(dead, next_sibling.gather(1, at), ptr)
    return ptr


def unlink(
    next_token: torch.Tensor, next_sibling: torch.Tensor, live: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang's tree pointers without the dead nodes, and the nodes still reachable from the root.

    Args:
        next_token: ``[B, N]`` int64, each node's first child (``-1``: none), SGLang's ``retrieve_next_token``.
        next_sibling: ``[B, N]`` int64, each node's next sibling (``-1``: none), ``retrieve_next_sibling``.
        live: ``[B, N]`` bool, the nodes to keep (column 0, the root, must be True).

    Returns:
        ``(next_token, next_sibling, reach)``: the pointers of the kept tree (a live node points to its first live
        child and next live sibling; a node not reached points nowhere) and ``reach [B, N]`` bool, the nodes reachable
        from the root through live nodes only (``live`` closed under ancestors).
    """
    nt = _skip_dead(next_token, next_sibling, live)
    ns = _skip_dead(next_sibling, next_sibling, live)
    reach = torch.zeros_like(live)
    reach[:, 0] = True
    for _ in range(live.shape[1]):
        grown = reach.clone()
        for ptr in (nt, ns):
            rows, cols = (reach & (ptr >= 0)).nonzero(as_tuple=True)
            grown[rows, ptr[rows, cols]] = True
        if torch.equal(grown, reach):
            break
        reach = grown
    none = torch.full_like(nt, -1)
    return torch.where(reach, nt, none), torch.where(reach, ns, none), reach


def compact_mask(mask: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """The QLEN_ONLY tree mask of the live rows: ``mask`` holds ``B`` row-major ``[N, N]`` blocks (flat), the result
    the ``[E_b, E_b]`` blocks of each request's live rows and columns (``E_b = live[b].sum()``), concatenated."""
    b, n = live.shape
    pair = live[:, :, None] & live[:, None, :]
    return mask.reshape(b, n, n)[pair]


class RaggedVerifyTarget:
    """The target worker as a ragged verify sees it: its one TARGET_VERIFY forward runs on the ``live`` rows only
    (module docstring); every other attribute is the target worker's.

    Args:
        target: SGLang's target worker.
        live: ``[B, N]`` bool, the rows to compute (closed under ancestors, the root of every request included).
    """

    def __init__(self, target: Any, live: torch.Tensor) -> None:
        self._target = target
        self._live = live

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def forward_batch_generation(self, batch: Any = None, forward_batch: Any = None, **kwargs: Any) -> Any:
        if batch is not None or forward_batch is None or not forward_batch.forward_mode.is_target_verify():
            return self._target.forward_batch_generation(batch, forward_batch=forward_batch, **kwargs)
        live, fb = self._live, forward_batch
        idx = live.reshape(-1).nonzero().squeeze(1)
        lens = live.sum(1).to(torch.int32)
        sub = copy.copy(fb)
        sub.input_ids, sub.positions, sub.out_cache_loc = fb.input_ids[idx], fb.positions[idx], fb.out_cache_loc[idx]
        if getattr(fb, "mrope_positions", None) is not None:
            sub.mrope_positions = fb.mrope_positions[:, idx]
        spec = fb.spec_info
        mask = None if spec.tree_topk == 1 or spec.custom_mask is None else compact_mask(spec.custom_mask, live)
        start = (torch.cumsum(lens, 0) - lens).to(torch.int32)
        # the CPU attention backend plans every target verify from the batch; the hook amx_extend_metadata hands it
        # these lengths (carried by the batch's verify input) instead of draft_token_num for every request
        sub.spec_info = copy.copy(spec)  # SGLang may rebuild the forward batch (dataclass fields only) on its way
        sub.spec_info.sage_ragged = (sub.seq_lens + lens, lens, start, mask)
        out = self._target.forward_batch_generation(None, forward_batch=sub, **kwargs)
        logits = out.logits_output
        rows = live.numel()
        for name in ("next_token_logits", "hidden_states"):
            value = getattr(logits, name, None)
            if isinstance(value, torch.Tensor) and value.shape[0] == idx.numel():
                full = value.new_zeros((rows, *value.shape[1:]))
                full[idx] = value
                setattr(logits, name, full)
        return out


def ragged_target(target: Any, batch: Any, tiers: Any, selection: Any, counts: list[int]) -> RaggedVerifyTarget | None:
    """The target worker a drafted step's verify should use: a :class:`RaggedVerifyTarget` when some node falls below
    the tier chooser's break-even (the tree's pointers are unlinked in place first), None to verify every node.

    Args:
        target: SGLang's target worker.
        batch: the step's ``ScheduleBatch`` (its ``spec_info`` the verify input).
        tiers: the worker's :class:`~.tiers.SageTierController` (the active tier, the chooser, the batch's alpha).
        selection: the draft's :class:`~.selection.BeamSelection` (the chosen nodes' path scores).
        counts: ``[steps, rows computed, rows drafted]``, added to (``GET /server_info``).
    """
    spec = batch.spec_info
    scores = None if selection is None else selection.node_scores
    if scores is None or tiers.active is None or not batch.sampling_info.is_all_greedy or batch.has_grammar:
        return None
    bs, n = spec.retrieve_next_token.shape
    threshold = tiers.chooser.row_threshold(tiers.active, bs, tiers.alpha)
    if threshold <= 0.0 or n < 2 or n - 1 > scores.shape[1]:
        return None
    live = live_rows(scores[:bs, : n - 1], threshold)
    nt, ns, live = unlink(spec.retrieve_next_token, spec.retrieve_next_sibling, live)
    kept = int(live.sum())
    counts[0], counts[1], counts[2] = counts[0] + 1, counts[1] + kept, counts[2] + bs * n
    if kept == bs * n:
        return None
    spec.retrieve_next_token.copy_(nt)
    spec.retrieve_next_sibling.copy_(ns)
    return RaggedVerifyTarget(target, live)


def verify_target(worker: Any, target: Any, batch: Any) -> Any:
    """The target worker a SAGE worker's verify of ``batch`` runs its forward on: at the off tier on CPU
    (``tier_off_decode``) a :class:`~.off_decode.DecodeVerifyTarget`; at a drafted tier under ``ragged_verify``
    :func:`ragged_target`'s choice; otherwise ``target`` itself."""
    if worker._sage_off_decode and worker.speculative_num_steps == 0:
        from .off_decode import DecodeVerifyTarget  # imports SGLang; the rest of this module does not

        worker.sage_off_decode_steps += 1
        return DecodeVerifyTarget(target)
    if worker._sage_ragged and worker.speculative_num_steps > 0:
        selection = getattr(worker._draft_worker, "sage_selection", None)
        return ragged_target(target, batch, worker.sage_tiers, selection, worker.sage_ragged_rows) or target
    return target
