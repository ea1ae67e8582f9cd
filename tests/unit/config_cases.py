"""Shared test data: a valid non-default value of every SageConfig field (unit and SGLang tiers)."""

from __future__ import annotations

import json

#: field -> every valid non-default value worth trying (each alone, the rest at their defaults)
OTHER_VALUES: dict[str, list] = {
    "policy": ["eagle2", "static", "chain", "topn"],
    "k": [12, 16],
    "d_min": [2, 4],
    "d_max": [6, 10],
    "w_min": [1, 3],
    "w_max": [6],
    "n_max": [16],
    "node_budget": ["fixed"],
    "theta0": [0.2],
    "alpha_init": [0.3],
    "first_round_static": [False],
    "pad_forwards": [False],
    "cost_refresh": [16, 1],
    "rerank_nodes": [8],
    "rerank_pool": ["children", "kept"],
    "calibration": [((0.2, 0.6), (0.4, 0.9))],
    "tiers": [((0, 1), (2, 5)), ((3, 8),)],
    "tier_probe_every": [4, 0],
    "tier_probe_backoff": [1, 64],
    "tier_bound_slack": [0.0, 1.0],
    "tier_acceptance": ["pooled", "per_tier"],
    "tier_off_lag": [16, 1, 1024],
    "tier_off_decode": [False],
    "ragged_verify": [True],
    "cpu_overlap": [True],
    "lookahead": [False],
    "cpu_draft_dtype": ["float32"],
    "price_level_host": [False],
    "tp_sync": ["tree", "off"],
    "tier_alpha_bins": [0, 8],
    "use_history": [False],
    "history_window": [5],
    "history_lo": [1.5],
    "history_hi": [2.5],
    "history_step": [2],
    "d_cap": [12],
    "history_cooldown": ["none"],
    "history_tau": ["drafts_plus_bonus"],
    "history_mode": ["relative"],
    "history_lo_ratio": [0.5],
    "history_hi_ratio": [1.5],
    "use_entropy": [False],
    "alpha_source": ["fresh", "path_mean"],
    "rounding": ["ceil", "floor"],
    "clamp_level_width": [False],
    "parent_prob": ["joint"],
    "threshold_on": ["joint"],
    "prob_space": ["topk"],
    "budget_order": ["parent_order"],
    "keep_top1": [False],
    "topology": ["planned"],
    "eagle_depth": [5],
    "eagle_total_tokens": [32],
    "chain_depth": [4],
    "topn_nodes": [16],
    "topn_threshold": [0.1],
    "topn_max_depth": [6],
    "static_tree": [((0,), (1,), (0, 0))],
    "prune_ratio_image": [0.5],
    "prune_ratio_video": [0.5],
}


#: the open-point switches SAGE's selection inside a fixed beam reads (``core.budgeted.select_shaped``), each with its
#: values (default first): the selection tests draw from them
SELECTION_SWITCHES: dict[str, tuple] = dict(
    parent_prob=("conditional", "joint"),
    threshold_on=("conditional", "joint"),
    prob_space=("full", "topk"),
    rounding=("half_up", "ceil", "floor"),
    clamp_level_width=(True, False),
    keep_top1=(True, False),
    budget_order=("best_first", "parent_order"),
    rerank_pool=("beam", "children", "kept"),
)


def flag_value(value) -> list[str]:
    """The command-line spelling of a value (``--sage-*`` flags)."""
    if isinstance(value, bool):
        return [str(value).lower()]
    if isinstance(value, tuple):
        return [json.dumps([list(p) for p in value])]
    return [str(value)]
