"""SAGE's node policy in TensorRT-LLM's EAGLE-3 dynamic tree (``Eagle3OneModelDynamicTreeWorker``, main).

TensorRT-LLM main's dynamic-tree worker drafts a fixed beam inside CUDA graphs: layer 0 takes the root's top-``K``
children (``K = dynamic_tree_max_topK``), each later layer expands the ``K`` best nodes by path score into ``K``
children each, and the history buffers keep every candidate::

    history_score_buffer         [bs, K + K*K*(D-1)]   path (joint) probabilities, level order
    history_draft_tokens_buffer  [bs, K + K*K*(D-1)]   their tokens
    history_draft_tokens_parent_buffer [bs, 1 + K*(D-1)]  -1, then each layer's K beam nodes (history indices)

which is exactly the candidate layout of SGLang's EAGLE beam (:func:`sage_plugin.core.beam_selection.eagle_beam_candidates`).
At the end, ``resampling_final_draft_tokens`` keeps the top ``M = max_total_draft_tokens`` candidates by path score
(``_resample_final_tokens``: top-M, indices sorted) and the worker builds the tree from them.  SAGE decides which
``M``, with the same function as the SGLang worker:

* ``update_draft_tokens_and_scores`` (wrapped): at layer 0 the policy feeds the step's accept lengths
  (``_num_accepted_tokens_buf``) to each slot's history, resets the slots of context requests and plans alpha, D, W
  per slot from the root's top-K probabilities (:class:`sage_plugin.serving.slots.SlotState`, slots =
  ``spec_tree_manager.slot_storage.all_ids_buf``, i.e. ``py_seq_slot``);
* ``resampling_final_draft_tokens`` (replaced): :func:`~sage_plugin.core.beam_selection.select_shaped` picks the ``M``
  nodes (``rerank_pool``: the most probable paths by default, or SAGE's shape first); their scores are raised by 2
  (scores are probabilities, so every chosen node now outranks every other) and the worker's own
  ``_resample_final_tokens`` runs on them, so its top-M is SAGE's choice, in its own output format;
* ``sample`` is left alone.

Context rows (whose first draft TensorRT-LLM verifies as a chain) keep the worker's own choice.  Shapes stay fixed
and nothing copies device values to the host, so the captured draft loop runs it.  Worked example (K = 2, D = 2,
M = 3; candidates ``0 a .6, 1 b .3 | 2 a->c .54, 3 a->d .03, 4 b->e .15, 5 b->f .12``)::

    worker:  top-3 by score         -> [0, 1, 2]
    SAGE, confident (D 2, W 1):     kept {0, 2}, filled with 1 -> [0, 1, 2]
    SAGE, unsure (D 1, W 2):        kept {0, 1}, filled with 2 -> [0, 1, 2]   (others differ once M < K + K*K*(D-1))

The patch is a class-attribute patch of the two methods, pinned to ``eagle3_dynamic_tree.py`` @
:data:`~.contract.DYNAMIC_TREE_COMMIT` and checked against the recorded signatures when installed
(``patches/INDEX.md``, "TensorRT-LLM").
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch

from ...config import AlgorithmConfig, SageConfig
from ...core.beam_selection import eagle_beam_candidates, select_shaped
from ...serving.slots import SlotState
from .contract import DYNAMIC_TREE_COMMIT, TREE_WORKER, check_class_against_contract
from .support import TRTLLM_TREE_SUPPORT

__all__ = ["PATCHED", "SageTreePolicy", "install_dynamic_tree_policy", "uninstall_dynamic_tree_policy"]

logger = logging.getLogger(__name__)

#: The worker methods the policy replaces (``sample`` is left alone).
PATCHED = ("update_draft_tokens_and_scores", "resampling_final_draft_tokens")
#: Every chosen node's score is raised by this (scores are probabilities in [0, 1]).
BOOST = 2.0


class SageTreePolicy:
    """SAGE's per-slot state and node choice for one dynamic-tree worker (all on the worker's device).

    Args:
        cfg: the algorithm section of the SAGE config (checked against ``TRTLLM_TREE_SUPPORT``).
        num_slots: request slots (``py_seq_slot`` values, plus the CUDA-graph dummy slot).
        max_batch: the worker's ``_max_batch_size`` (rows of the persistent plan buffers).
        topk: ``K`` (``dynamic_tree_max_topK``).
        n_select: ``M`` (``max_total_draft_tokens``), the nodes verified per request.
    """

    def __init__(
        self, cfg: AlgorithmConfig, num_slots: int, max_batch: int, topk: int, n_select: int, device: torch.device | str
    ) -> None:
        self.cfg, self.topk, self.n_select = cfg, topk, n_select
        self.slots = SlotState(cfg, num_slots, device)
        self.depth = torch.ones(max_batch, dtype=torch.int64, device=device)
        self.width = torch.ones(max_batch, dtype=torch.int64, device=device)
        self.num_contexts = 0
        self.planned = False

    def plan_root(
        self, slot_ids: torch.Tensor, root_probs: torch.Tensor, accept_lens: torch.Tensor, num_contexts: int
    ) -> None:
        """Observe, reset and plan one step's batch (rows ``[contexts | generations]``).

        Args:
            slot_ids: ``[bs]`` int64 slot of each row.
            root_probs: ``[bs, K]`` the root's top-K draft probabilities (descending).
            accept_lens: ``[bs]`` accepted drafts + 1 of this step's verification (generation rows).
            num_contexts: rows ``< num_contexts`` are context requests (a new request: its slot is reset).
        """
        bs = slot_ids.shape[0]
        if num_contexts < bs:
            self.slots.observe(slot_ids[num_contexts:], accept_lens[num_contexts:].to(torch.int64))
        if num_contexts > 0:
            self.slots.reset(slot_ids[:num_contexts])
        shape = self.slots.plan(slot_ids, root_probs)
        self.depth[:bs].copy_(shape.depth)
        self.width[:bs].copy_(shape.width)
        self.num_contexts = num_contexts
        self.planned = True

    def shaped_scores(self, scores: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """``[bs, C]`` history scores with SAGE's ``M`` chosen nodes raised by :data:`BOOST` (generation rows).

        Args:
            scores: ``[bs, C]`` the worker's history scores, ``C = K + K*K*(D-1)``.
            parents: ``[bs, 1 + K*(D-1)]`` int64, its history parent buffer.
        """
        bs = scores.shape[0]
        cands = eagle_beam_candidates(scores, parents, self.topk)
        sel = select_shaped(cands, self.depth[:bs], self.width[:bs], self.n_select, self.cfg)
        boost = torch.zeros_like(scores).scatter_(1, sel.index, BOOST)
        if self.num_contexts > 0:
            boost[: self.num_contexts] = 0.0
        return scores + boost


def _policy(worker: Any) -> SageTreePolicy | None:
    """The worker's policy, created once its spec-tree manager exists (None before: the worker's own path runs)."""
    policy = worker.__dict__.get("_sage_policy")
    if policy is None:
        manager = getattr(worker, "spec_tree_manager", None)
        storage = getattr(manager, "slot_storage", None)
        if storage is None:
            return None
        ids = storage.all_ids_buf
        policy = SageTreePolicy(
            type(worker)._sage_config.algorithm, ids.shape[0] + 1, worker._max_batch_size, worker.K,
            worker.max_total_draft_tokens, ids.device,
        )  # fmt: skip
        worker._sage_policy = policy
    return policy


def _original(worker: Any, name: str) -> Any:
    return type(worker)._sage_originals[name]


def _update_draft_tokens_and_scores(
    self: Any,
    cur_draft_idx: int,
    new_draft_tokens: torch.Tensor,
    new_draft_scores: torch.Tensor,
    previous_draft_scores: torch.Tensor,
    batch_size: int,
    attn_metadata: Any = None,
) -> torch.Tensor:
    """The worker's method, then (layer 0) SAGE's plan from the root's top-K probabilities it returns."""
    out = _original(self, "update_draft_tokens_and_scores")(
        self, cur_draft_idx, new_draft_tokens, new_draft_scores, previous_draft_scores, batch_size, attn_metadata
    )
    if cur_draft_idx == 0:
        policy = _policy(self)
        if policy is not None:
            slots = self.spec_tree_manager.slot_storage.all_ids_buf[:batch_size]
            contexts = int(getattr(attn_metadata, "num_contexts", 0) or 0)  # a host int of the batch layout
            accept = self._num_accepted_tokens_buf[:batch_size]
            policy.plan_root(slots, out.reshape(batch_size, -1), accept, contexts)
    return out


def _resampling_final_draft_tokens(self: Any, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SAGE's ``M`` nodes through the worker's own ``_resample_final_tokens`` (same outputs and shapes)."""
    original = _original(self, "resampling_final_draft_tokens")
    policy = _policy(self)
    if policy is None or not policy.planned:
        return original(self, batch_size)
    scores = policy.shaped_scores(
        self.history_score_buffer[:batch_size], self.history_draft_tokens_parent_buffer[:batch_size]
    )
    resample = sys.modules[original.__module__]._resample_final_tokens
    return resample(scores, self.history_draft_tokens_buffer[:batch_size], self.max_total_draft_tokens)


_REPLACEMENTS = {
    "update_draft_tokens_and_scores": _update_draft_tokens_and_scores,
    "resampling_final_draft_tokens": _resampling_final_draft_tokens,
}


def install_dynamic_tree_policy(cfg: SageConfig, worker_cls: type | None = None, *, skip_check: bool = False) -> type:
    """Patch SAGE's node policy onto the dynamic-tree worker class (idempotent; a second call updates ``cfg``).

    Args:
        cfg: the SAGE config; refused here if the tier does not honour it (``TRTLLM_TREE_SUPPORT``).
        worker_cls: the class to patch (default: the installed ``Eagle3OneModelDynamicTreeWorker``, after the
            contract check); its three recorded methods are checked against the contract either way.
        skip_check: warn instead of failing on a contract mismatch of the installed TensorRT-LLM.

    Returns:
        The patched class.
    """
    TRTLLM_TREE_SUPPORT.check(cfg)
    if worker_cls is None:
        from .installed import dynamic_tree_worker_class

        worker_cls = dynamic_tree_worker_class(skip_check=skip_check)
    if "_sage_originals" in worker_cls.__dict__:
        worker_cls._sage_config = cfg
        return worker_cls
    check_class_against_contract(worker_cls, TREE_WORKER)
    missing = [name for name in PATCHED if name not in worker_cls.__dict__]
    if missing:
        raise TypeError(f"{worker_cls.__qualname__} does not define {missing} itself; nothing to patch")
    worker_cls._sage_originals = {name: worker_cls.__dict__[name] for name in PATCHED}
    worker_cls._sage_config = cfg
    for name, replacement in _REPLACEMENTS.items():
        setattr(worker_cls, name, replacement)
    logger.info("SAGE node policy installed on %s (written against @%s)", worker_cls.__qualname__, DYNAMIC_TREE_COMMIT)
    return worker_cls


def uninstall_dynamic_tree_policy(worker_cls: type) -> None:
    """Restore the worker's own methods (no-op if not installed)."""
    originals = worker_cls.__dict__.get("_sage_originals")
    if originals is None:
        return
    for name, method in originals.items():
        setattr(worker_cls, name, method)
    del worker_cls._sage_originals
    del worker_cls._sage_config
