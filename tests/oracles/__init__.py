"""Slow, obviously-correct per-request reference implementations (the test oracles; one per rule).

Every function here handles **one request** with plain Python lists and float64 arithmetic, in the most literal
loop form of the rule it implements, so that the batched tensor code in :mod:`sage_plugin.core` can be checked
against it.  Nothing here is meant to be fast and nothing here is used at runtime.  Imports: the standard library
and torch (only to accept tensors).

Conventions shared with the batched code:

* a tree is a list of nodes in level order, node 0 the root, ``parents[i] < i``, ``-1`` for the root (and for
  padding where a padded row is passed);
* "top-k" of a distribution is ordered by decreasing probability, ties by lower token id;
* rounding ``half_up`` is ``floor(x + 1/2)``; ``ceil`` / ``floor`` treat a value within ``1e-6`` of an integer as
  that integer (the batched code does the same).

Modules: :mod:`.layout` (confidence, masks, positions, index arrays), :mod:`.verify` (greedy, rejection
sampling), :mod:`.rules` (the SAGE shape rules: plan, level selection, static selection), :mod:`.trees` (tree
building for every policy), :mod:`.beam` (selection in a fixed beam), :mod:`.history` (controller, state),
:mod:`.penalties` (per-node penalties), :mod:`.tree_formats` (the batched layout's test-only conversions: positions,
SGLang's ``retrieve_*`` arrays, rank paths, CSR).  None of it ships in the wheel.
"""

from __future__ import annotations

from tests.oracles.beam import select_in_beam_ref
from tests.oracles.history import (
    HistoryRef,
    RefState,
    history_init_ref,
    history_update_ref,
    init_state_ref,
    observe_ref,
)
from tests.oracles.layout import (
    ancestor_mask_ref,
    children_ref,
    positions_ref,
    retrieve_arrays_ref,
    topk_confidence_ref,
    topk_entropy_ref,
)
from tests.oracles.rules import Margin, RefCand, plan_ref, round_ref, sage_level_ref, static_level_ref
from tests.oracles.trees import SELECTORS, RefNode, RefTree, build_tree_ref
from tests.oracles.verify import greedy_verify_ref, process_logits_ref, rejection_verify_one

__all__ = [
    "SELECTORS",
    "HistoryRef",
    "Margin",
    "RefCand",
    "RefNode",
    "RefState",
    "RefTree",
    "ancestor_mask_ref",
    "build_tree_ref",
    "children_ref",
    "greedy_verify_ref",
    "history_init_ref",
    "history_update_ref",
    "init_state_ref",
    "observe_ref",
    "plan_ref",
    "positions_ref",
    "process_logits_ref",
    "rejection_verify_one",
    "retrieve_arrays_ref",
    "round_ref",
    "sage_level_ref",
    "select_in_beam_ref",
    "static_level_ref",
    "topk_confidence_ref",
    "topk_entropy_ref",
]
