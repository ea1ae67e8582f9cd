"""The SageConfig fields SAGE's two TensorRT-LLM tiers honour (pure data: importable without TensorRT-LLM).

* :data:`TRTLLM_SUPPORT`, the drafter tier (TensorRT-LLM 1.2.x, ``UserProvidedDecodingConfig``): the executor
  verifies a linear draft of ``max_draft_len`` tokens per request, so SAGE's tree is a chain whose length is Eq. 10's
  ``D`` (:mod:`.drafter`); the width and level-inclusion rules of a tree do not apply.
* :data:`TRTLLM_TREE_SUPPORT`, the dynamic-tree tier (TensorRT-LLM main, EAGLE-3 ``use_dynamic_tree``): SAGE chooses
  the verified nodes inside the worker's fixed beam and budget with the same function as SGLang
  (:func:`sage_plugin.core.beam_selection.select_shaped`, :mod:`.dynamic_tree`).

``sage trtllm-serve`` checks the config against its tier's table before anything starts
(:func:`.config.check_sage_config`); ``docs/reference/runtime-support.md`` shows both.
"""

from __future__ import annotations

from ...support import FIXED_BEAM_SELECTION, Honoured, RuntimeSupport

__all__ = ["TRTLLM_SUPPORT", "TRTLLM_TREE_SUPPORT"]

_ALL = Honoured()
_POLICY = Honoured({"sage"}, "TensorRT-LLM's own drafters and EAGLE-3 worker run the baselines")
_HISTORY = {
    name: _ALL
    for name in (
        "d_min", "d_max", "d_cap", "alpha_init", "use_history", "history_window", "history_lo", "history_hi",
        "history_step", "history_cooldown", "history_tau", "history_mode", "history_lo_ratio", "history_hi_ratio",
        "use_entropy", "rounding",
    )
}  # fmt: skip
_BASELINES = {
    "eagle_depth": "baseline policies only",
    "eagle_total_tokens": "baseline policies only",
    "chain_depth": "baseline policies only",
    "topn_nodes": "baseline policies only",
    "topn_threshold": "baseline policies only",
    "topn_max_depth": "baseline policies only",
    "prune_ratio_image": "no draft-side visual-token pruning in the TensorRT-LLM adapter",
    "prune_ratio_video": "no draft-side visual-token pruning in the TensorRT-LLM adapter",
}
_NO_PAD = "with node_budget auto only (a fixed verify width has nothing to pad)"
_NO_COST = "with node_budget auto only (a fixed verify width needs no cost curve)"
_TIERS = {
    "tiers": "TensorRT-LLM's draft lengths are set by its own config (max_draft_len, max_total_draft_tokens)",
    "tier_probe_every": "no tiers",
    "tier_probe_backoff": "no tiers",
    "tier_probe_confidence": "no tiers",
    "tier_bound_slack": "no tiers",
    "tier_acceptance": "no tiers",
    "tier_control": "no tiers",
    "tier_request_gate": "no tiers",
    "tier_request_prior": "no tiers",
    "tier_median_request": "no tiers",
    "tier_off_lag": "no tiers",
    "tier_off_decode": "no tiers",
    "ragged_verify": "no tiers",
    "tier_alpha_bins": "no tiers",
    "admission_hold_steps": "TensorRT-LLM's own scheduler admits requests; it has no min-free-slots delayer",
    "cpu_overlap": "TensorRT-LLM's own disable_overlap_scheduler decides (the drafter needs it off)",
    "tp_sync": "the drafter proposes one chain for every rank",
    "opt_out_params": "the drafter proposes for every request of the step",
    "lookahead": _NO_COST,
    "price_level_host": _NO_COST,
    "cpu_draft_dtype": "GPU only: the drafter runs in the engine's dtype",
    "cpu_lean_draft": "GPU only: the drafter is TensorRT-LLM's",
}

_CHAIN = "a chain keeps each of its D levels: the level-inclusion rule (Eq. 12) shapes trees"
_WIDTH = "width 1: TensorRT-LLM's user-provided drafter path verifies a linear draft"

TRTLLM_SUPPORT = RuntimeSupport(
    runtime="TensorRT-LLM drafter",
    honours={
        "policy": _POLICY,
        "k": Honoured(note="alpha over the top-k of the draft's root distribution"),
        **_HISTORY,
        "n_max": Honoured(note="caps the chain: min(D, n_max, max_draft_len) tokens"),
        "node_budget": Honoured(
            {"fixed"},
            "the executor verifies max_draft_len tokens per request every step; the default auto acts as fixed",
        ),
        "first_round_static": Honoured({False}, "a chain has no static first tree; the default is not applied"),
        "alpha_source": Honoured({"lag1", "fresh"}, "path_mean needs the accepted path's draft distributions"),
    },
    not_read={
        "w_min": _WIDTH,
        "w_max": _WIDTH,
        "theta0": _CHAIN,
        "clamp_level_width": _CHAIN,
        "parent_prob": _CHAIN,
        "threshold_on": _CHAIN,
        "prob_space": _CHAIN,
        "budget_order": _CHAIN,
        "keep_top1": _CHAIN,
        "topology": "a chain has no topology to plan",
        "pad_forwards": _NO_PAD,
        "cost_refresh": _NO_COST,
        "calibration": "a chain has no nodes to rank",
        "rerank_nodes": "a chain has no nodes to rank",
        "rerank_pool": "a chain has no nodes to rank",
        "beam_depth": "a chain has no beam: its length is D (Eq. 10)",
        **_TIERS,
        "static_tree": "a chain has no static first tree",
        **_BASELINES,
    },
)

_FIRST_TREE = (
    "a request's first draft is made at prefill and verified as a linear chain, so there is no first tree to make "
    "static; the default is not applied"
)

TRTLLM_TREE_SUPPORT = RuntimeSupport(
    runtime="TensorRT-LLM dynamic tree",
    honours={
        "policy": _POLICY,
        "k": Honoured(note="alpha over the beam's top-K (dynamic_tree_max_topK) root probabilities"),
        **_HISTORY,
        "w_min": _ALL,
        "w_max": _ALL,
        "n_max": Honoured(note="SAGE-shaped nodes per tree; the verify width is max_total_draft_tokens"),
        "node_budget": Honoured(
            {"fixed"},
            "the worker verifies max_total_draft_tokens per request every step; the default auto acts as fixed",
        ),
        "theta0": _ALL,
        "first_round_static": Honoured({False}, _FIRST_TREE),
        "alpha_source": Honoured({"lag1", "fresh"}, "path_mean needs the accepted path's draft distributions"),
        "clamp_level_width": _ALL,
        "parent_prob": _ALL,
        "threshold_on": _ALL,
        **FIXED_BEAM_SELECTION,
        "budget_order": _ALL,
        "keep_top1": _ALL,
        "topology": Honoured({"online"}, "planned needs the previous round's draft distributions per rank path"),
    },
    not_read={
        "static_tree": "the first-round static tree is not applied (first_round_static)",
        "pad_forwards": _NO_PAD,
        "cost_refresh": _NO_COST,
        "calibration": "the worker ranks candidates by its own draft scores",
        "rerank_nodes": "the worker resamples max_total_draft_tokens nodes by its own scores",
        "beam_depth": "the worker's beam is max_draft_len deep",
        **_TIERS,
        **_BASELINES,
    },
)
