"""``tp_sync``: the verified tree broadcast from tensor-parallel rank 0 (pure torch; the group is passed in).

Every rank drafts, shapes and verifies its own copy of each step's tree.  The inputs are the same on every rank (the
draft's logits are all-gathered), so on CUDA the trees agree; where a rank's kernels can round differently (SGLang
broadcasts its verify result from rank 0 on ROCm, and for batches with sampling requests, for that reason), ranks
could verify different tokens and write different KV.  With ``tp_sync`` the draft step's output, i.e. the verify
input SGLang builds from SAGE's selection (draft tokens, tree mask, positions, retrieve indices, draft probabilities),
and the tier chooser's batch alpha are broadcast from rank 0 in place, as device collectives in the step's stream (no
host sync), before the target verifies.

Example: rank 1 drafted ``[5, 9, 7]`` where rank 0 drafted ``[5, 9, 8]``; after :func:`sync_verify_input` both verify
``[5, 9, 8]``, and their tree masks and retrieve indices are rank 0's too.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["VERIFY_FIELDS", "sync_due", "sync_verify_input"]

#: the verify input's tensors that define the tree and its acceptance walk (``EagleVerifyInput``, SGLang 0.5.23)
VERIFY_FIELDS = (
    "draft_token",
    "custom_mask",
    "positions",
    "retrieve_index",
    "retrieve_next_token",
    "retrieve_next_sibling",
    "retrieve_cum_len",
    "draft_probs",
)


def sync_due(mode: str, world_size: int, is_hip: bool, all_greedy: bool) -> bool:
    """Whether this step's tree is broadcast: never with one rank; ``tree`` always; ``auto`` where SGLang broadcasts
    its own verify result (ROCm, or a batch with sampling requests); ``off`` never.  Every argument is the same on
    every rank, so every rank takes the same branch (the broadcast is a collective).

    >>> sync_due("auto", 2, False, True), sync_due("auto", 2, False, False), sync_due("tree", 1, False, True)
    (False, True, False)
    """
    if world_size <= 1 or mode == "off":
        return False
    return mode == "tree" or is_hip or not all_greedy


def sync_verify_input(out: Any, broadcast: Callable[[torch.Tensor], Any]) -> None:
    """Broadcast, in place from rank 0, each tensor of :data:`VERIFY_FIELDS` on ``out`` (a verify input, or SGLang's
    ``(verify_input, parent_list, top_scores_index)`` with topology, whose two extra tensors are broadcast too)."""
    extra: tuple = ()
    if isinstance(out, tuple):
        out, *rest = out
        extra = tuple(t for t in rest if isinstance(t, torch.Tensor))
    tensors = [getattr(out, name, None) for name in VERIFY_FIELDS] + list(extra)
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            _broadcast_in_place(t, broadcast)


def _broadcast_in_place(t: torch.Tensor, broadcast: Callable[[torch.Tensor], Any]) -> None:
    if t.is_contiguous():
        broadcast(t)
    else:  # collectives take contiguous tensors
        c = t.contiguous()
        broadcast(c)
        t.copy_(c)
