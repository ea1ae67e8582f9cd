"""The SageConfig fields SAGE's SGLang worker honours (pure data: importable without SGLang).

SGLang drafts a fixed EAGLE beam per step and verifies a fixed number of tokens (``--speculative-num-draft-tokens``,
one CUDA graph per shape); SAGE chooses which candidates of the beam form each request's verified tree
(:func:`sage_plugin.core.beam_selection.select_shaped`) from a per-slot plan (:class:`sage_plugin.serving.slots.SlotState`).
:func:`.algo.validate_server_args` checks this table at launch, naming the ``--sage-*`` flag.
"""

from __future__ import annotations

from ...support import FIXED_BEAM_SELECTION, Honoured, RuntimeSupport

__all__ = ["SGLANG_SUPPORT"]

_ALL = Honoured()

SGLANG_SUPPORT = RuntimeSupport(
    runtime="SGLang 0.5.23",
    honours={
        "policy": Honoured({"sage"}, "SGLang's own --speculative-algorithm EAGLE / STANDALONE build the baselines"),
        "k": Honoured(note="beam width --speculative-eagle-topk = min(k, 10); alpha over the beam's top-k"),
        "d_min": _ALL,
        "d_max": _ALL,
        "w_min": _ALL,
        "w_max": _ALL,
        "n_max": Honoured(note="SAGE-shaped nodes per tree; the verify width is --speculative-num-draft-tokens"),
        "node_budget": Honoured(
            {"fixed"},
            "SGLang verifies --speculative-num-draft-tokens per request every step; the default auto acts as fixed",
        ),
        "theta0": _ALL,
        "alpha_init": _ALL,
        "first_round_static": Honoured(note="the static tree's nodes that the beam holds"),
        "use_history": _ALL,
        "history_window": _ALL,
        "history_lo": _ALL,
        "history_hi": _ALL,
        "history_step": _ALL,
        "d_cap": _ALL,
        "history_cooldown": _ALL,
        "history_tau": _ALL,
        "history_mode": _ALL,
        "history_lo_ratio": _ALL,
        "history_hi_ratio": _ALL,
        "use_entropy": _ALL,
        "alpha_source": Honoured({"lag1", "fresh"}, "path_mean needs the accepted path's draft distributions"),
        "rounding": _ALL,
        "clamp_level_width": _ALL,
        "parent_prob": _ALL,
        "threshold_on": _ALL,
        **FIXED_BEAM_SELECTION,
        "budget_order": _ALL,
        "keep_top1": _ALL,
        "topology": Honoured({"online"}, "planned needs the previous round's draft distributions per rank path"),
        "static_tree": _ALL,
        "tiers": Honoured(
            note="[steps, draft_tokens] states built at start-up through SGLang's adaptive runtime states; one per "
            "step by measured tokens per second (--speculative-eagle-topk fixed)"
        ),
        "tier_probe_every": _ALL,
        "tier_probe_backoff": _ALL,
        "tier_probe_confidence": _ALL,
        "tier_bound_slack": _ALL,
        "tier_acceptance": _ALL,
        "tier_control": _ALL,
        "tier_request_gate": _ALL,
        "tier_request_prior": _ALL,
        "tier_median_request": _ALL,
        "tier_off_lag": Honoured(note="standalone drafts on CPU; EAGLE heads and CUDA run the off tier's draft extend"),
        "tier_off_decode": Honoured(note="CPU; CUDA verifies the root in its captured TARGET_VERIFY graph"),
        "ragged_verify": Honoured(note="greedy batches on CPU, one rank; CUDA's captured verify has fixed rows"),
        "admission_hold_steps": Honoured(
            note="with SGLang's --min-free-slots-delay; counted in drafted steps, so every rank alike"
        ),
        "tier_alpha_bins": _ALL,
        "cpu_overlap": Honoured(note="CPU servers; on GPUs SGLang's overlap scheduler stays on unless disabled"),
        "tp_sync": _ALL,
        "opt_out_params": Honoured(
            note="a request using a listed parameter verifies its root only, in a batch that speculates"
        ),
        "cpu_lean_draft": Honoured(
            note="CPU servers, a standalone Llama-family draft on one rank; EAGLE heads and GPUs run SGLang's forward"
        ),
        "cpu_draft_dtype": Honoured(
            note="CPU servers: the draft's own linear layers and head (never a weight it shares with the target); "
            "GPUs serve the draft in the server's dtype"
        ),
    },
    not_read={
        "pad_forwards": "with node_budget auto only (a fixed verify width has nothing to pad)",
        "lookahead": "with node_budget auto only (SGLang drafts each tier's steps)",
        "price_level_host": "with node_budget auto only (the tiers' step clock times whole steps, host time included)",
        "cost_refresh": "with node_budget auto only (the tiers' step clock times every step in the loop)",
        "calibration": "SGLang's beam ranks candidates by its own draft scores",
        "rerank_nodes": "SGLang fills --speculative-num-draft-tokens with the best candidates after SAGE's shape",
        "beam_depth": "SGLang's beam is --speculative-num-steps deep (derived from d_cap, or the tiers')",
        "eagle_depth": "baseline policies only",
        "eagle_total_tokens": "baseline policies only",
        "chain_depth": "baseline policies only",
        "topn_nodes": "baseline policies only",
        "topn_threshold": "baseline policies only",
        "topn_max_depth": "baseline policies only",
        "prune_ratio_image": "no draft-side visual-token pruning in the SGLang worker",
        "prune_ratio_video": "no draft-side visual-token pruning in the SGLang worker",
    },
)
