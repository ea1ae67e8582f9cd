"""The sections :class:`~sage_plugin.config.SageConfig` is composed of, one per layer that reads it.

==============  ======================  ===========================================================================
section         class                   read by
==============  ======================  ===========================================================================
``algorithm``   :class:`AlgorithmConfig`  the core (it satisfies :class:`sage_plugin.core.params.SageParams`) and the
                                        reference engine's pricing of the node budget
``serving``     :class:`ServingConfig`  the serving layer (:mod:`sage_plugin.serving`): the tiers, the tier chooser,
                                        ragged verify
``cpu``         :class:`CpuConfig`      the CPU paths: the draft's weights and lean decoder, SGLang's overlap on CPU
``runtime``     :class:`RuntimeConfig`  the SGLang adapter: tensor-parallel agreement, per-request opt-out
``vlm``         :class:`VlmConfig`      the VLM draft's visual-token pruning
==============  ======================  ===========================================================================

A user writes the fields flat (one YAML mapping, one ``--sage-<field>`` flag each); field names are unique across
sections, so each knob keeps one name everywhere.  Each section validates its own fields when it is built and raises
:class:`~sage_plugin.config.ConfigError` naming the field and its range.  The baselines' shapes sit in ``algorithm``:
the core builds them behind the same policy Protocol, ``policy`` chooses among them, and SAGE's first round drafts
the static baseline's tree.

>>> AlgorithmConfig(d_max=6).max_tree_nodes  # SAGE's node cap
64
>>> ServingConfig(tier_probe_every=-1)
Traceback (most recent call last):
...
sage_plugin.config.ConfigError: tier_probe_every must be an integer in [0, 1000000], got -1
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..core.policies import POLICIES
from ..core.tree import MC_SIM_7B_63
from ..serving.tiers import ACCEPTANCE_MODELS, TIER_CONTROLS
from .checks import (
    ConfigError,
    _bool,
    _choice,
    _float_in,
    _int_in,
    _validate_calibration,
    _validate_tiers,
    _validate_tree_choices,
)
from .opt_out import OPT_OUT_PARAMS, opt_out_names

__all__ = ["AlgorithmConfig", "CpuConfig", "RuntimeConfig", "ServingConfig", "VlmConfig"]


class _Section:
    """What every section shares: a validated copy with some fields changed."""

    __slots__ = ()

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` applied and validated again (:class:`ConfigError` for a bad value); rows given as
        lists (as YAML writes them) become the tuples a frozen, hashable section holds."""
        for name, value in changes.items():
            rows = isinstance(getattr(self, name, None), tuple) and isinstance(value, list)
            if rows and all(isinstance(row, (list, tuple)) for row in value):
                changes[name] = tuple(tuple(row) for row in value)
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class AlgorithmConfig(_Section):
    """The tree policy and its parameters: SAGE's (paper defaults [S], reconstructions [R]) and the baselines'."""

    # -- tree policy --------------------------------------------------------------------------
    policy: str = "sage"  # the tree policy: sage, or a baseline the reference engine compares (core/policies.py)
    # -- the SAGE shape (Eq. 7-12) [S] ------------------------------------------------------------
    k: int = 10  # top-k for the entropy (Eq. 7) and the candidate children per node
    d_min: int = 3  # depth at alpha = 0 (Eq. 10: D = D_min + alpha (D_max - D_min))
    d_max: int = 8  # depth at alpha = 1; the history controller moves it between d_min and d_cap
    w_min: int = 2  # width at alpha = 1 (Eq. 11: W = W_min + (1 - alpha)(W_max - W_min))
    w_max: int = 10  # width at alpha = 0
    n_max: int = 64  # node cap (draft nodes, root excluded)
    rerank_nodes: int = 0  # 0: the tree the levels keep (the paper's); N: its N best nodes by path value
    # rerank_pool: which nodes the final rerank (to rerank_nodes N, or n_max when 0) chooses from.  beam (default):
    # the W(alpha) best candidates of each level by path value are expanded, down to beam_depth; children: every child
    # of a node Eq. 10-12 expand is a candidate (EAGLE-2's pool); both expand only nodes still in the pool's N best.
    # kept: the nodes SAGE's levels keep (the paper's tree; rerank only with rerank_nodes N).  Not read with topology
    # planned (its replay keeps the planned tree).  docs/design/algorithm.md, "What the rerank chooses from"
    rerank_pool: str = "beam"
    # rerank_pool beam: the deepest level the beam grows (the rerank keeps a deep node only where its path value beats
    # a shallow one's; node_budget auto stops where the next level cannot pay).  Its own knob, not d_cap: d_cap bounds
    # the history controller's D_max and SGLang's derived draft steps.  Runtimes with a fixed draft beam (SGLang,
    # TensorRT-LLM) draft their own --speculative-num-steps / max_draft_len instead.  docs/design/algorithm.md, "What
    # the rerank chooses from"
    beam_depth: int = 16
    # -- trees sized to the device (reference engine) --------------------------------------------
    node_budget: str = "auto"  # auto: also the cost-optimal cut under the measured verify cost; fixed: n_max only
    pad_forwards: bool = True  # auto budget: run forwards at the cheapest measured size >= theirs, priced so
    cost_refresh: int = 0  # auto budget: re-price every R rounds from in-loop timing medians; 0: start-up only
    # node_budget auto: stop drafting when even the best the next level could add (one child per node of the last
    # level with its parent's probability) cannot pay for that level's forward (core/cost.next_level_can_pay)
    lookahead: bool = True
    # node_budget auto: price each drafted level's host time besides its forward (the policy's step and cut, the
    # engine's bookkeeping; the median of the run's last levels) with the forward, in the cut and the look-ahead
    price_level_host: bool = True
    # calibrated path values (core/calibration.py): rows = parent-alpha bins, columns = draft-probability bins,
    # acceptance rates in (0, 1] (`sage calibrate` fits one); empty: the draft's own probabilities
    calibration: tuple[tuple[float, ...], ...] = ()
    # -- level thresholds and the first round [S] ------------------------------------------------------
    theta0: float = 0.1  # theta_l = theta0 * l / D
    alpha_init: float = 0.5  # alpha before a request has a draft distribution (and always, with use_entropy false)
    first_round_static: bool = True  # round 1 uses the static mc_sim_7b_63 tree (A.1)
    # -- history controller [S] + [R] ---------------------------------------------------------
    use_history: bool = True  # False: D_max stays at d_max (ablation "entropy only")
    history_window: int = 10  # rounds of accepted drafts averaged before D_max moves
    history_lo: float = 2.0  # D_max down by history_step when the window's mean accepted drafts is below this
    history_hi: float = 3.0  # D_max up by history_step when the window's mean is above this
    history_step: int = 1  # open point 9: how far D_max moves at a time
    d_cap: int = 10  # open point 9: the highest D_max the history controller reaches
    history_cooldown: str = "full_window"  # open point 9: after D_max moves, wait a full new window, or none
    history_tau: str = "drafts"  # open point 10: history_lo/hi in accepted drafts, or drafts_plus_bonus
    history_mode: str = "absolute"  # absolute: history_lo/hi (the paper's); relative: ratios to the running mean
    history_lo_ratio: float = 0.8  # relative mode: D_max down when the window mean < ratio x the running mean
    history_hi_ratio: float = 1.25  # relative mode: D_max up when the window mean > ratio x the running mean
    # -- the paper's open points ----------------------------------------------------------------
    use_entropy: bool = True  # False: alpha stays at alpha_init (ablation "history only")
    alpha_source: str = "lag1"  # open point 1: lag1 (the previous round's root), fresh (this round's), path_mean
    rounding: str = "half_up"  # open point 2: how D, W and W_l are rounded (half_up, ceil, floor)
    clamp_level_width: bool = True  # open point 2: W_l >= 1 (False: a level's width may round to 0)
    parent_prob: str = "conditional"  # open point 3: P_parent in Eq. 12, the parent's own or its path probability
    threshold_on: str = "conditional"  # open point 4: theta_l against the node's own or (joint) its path's probability
    prob_space: str = "full"  # open point 5: W_l and theta_l read the full softmax (full) or the top-k renormalised
    budget_order: str = "best_first"  # open point 6: order under n_max, by path probability or parent order
    keep_top1: bool = True  # open point 7: always keep the root's rank-0 child (no empty tree)
    topology: str = "online"  # open point 8: online (level by level from live probabilities) or planned (Alg. 1)
    # -- baselines -----------------------------------------------------------------------------
    eagle_depth: int = 7  # EAGLE-2 expansion levels (the baseline: depth 7, top-k 10, 60 nodes)
    eagle_total_tokens: int = 60  # EAGLE-2 final rerank budget (draft nodes)
    chain_depth: int = 5  # SD-Chain: the draft's top-1 at each of this many levels
    topn_nodes: int = 60  # top-N tree (OPT-Tree style): nodes kept per level and verified
    topn_threshold: float = 0.5  # top-N tree: grows a level while the previous one gained more than this
    topn_max_depth: int = 10  # top-N tree: at most this many levels
    # the static tree (SD-Tree baseline, SAGE's first round): rank paths from the root, SpecVLM's 25-node mc_sim_7b_63
    static_tree: tuple[tuple[int, ...], ...] = field(default=MC_SIM_7B_63)

    def __post_init__(self) -> None:
        _choice("policy", self.policy, tuple(POLICIES))
        _int_in("k", self.k, 2, 64)
        _int_in("d_min", self.d_min, 1, 64)
        _int_in("d_max", self.d_max, self.d_min, 64, " (d_min <= d_max)")
        _int_in("d_cap", self.d_cap, self.d_max, 64, " (d_max <= d_cap: raise d_cap together with d_max)")
        _int_in("w_min", self.w_min, 1, self.k, " (w_min <= k)")
        _int_in("w_max", self.w_max, self.w_min, self.k, " (w_min <= w_max <= k)")
        _int_in("n_max", self.n_max, 1, 1024)
        _int_in("rerank_nodes", self.rerank_nodes, 0, 1024)
        _choice("node_budget", self.node_budget, ("auto", "fixed"))
        _float_in("theta0", self.theta0, 0.0, 1.0)
        _float_in("alpha_init", self.alpha_init, 0.0, 1.0)
        _bool("first_round_static", self.first_round_static)
        _bool("pad_forwards", self.pad_forwards)
        _int_in("cost_refresh", self.cost_refresh, 0, 1_000_000)
        _bool("lookahead", self.lookahead)
        _bool("price_level_host", self.price_level_host)
        _validate_calibration(self.calibration)
        _choice("rerank_pool", self.rerank_pool, ("kept", "children", "beam"))
        _int_in("beam_depth", self.beam_depth, 1, 64)
        if self.rerank_nodes and self.topology == "planned":
            raise ConfigError(
                "rerank_nodes works with topology online (the planned replay keeps its planned tree, and reads no "
                f"rerank_pool): leave it 0 with topology planned, got {self.rerank_nodes}"
            )
        if self.calibration and self.topology == "planned":
            raise ConfigError("calibration works with topology online (the planned replay ranks by draft probability)")
        _bool("use_history", self.use_history)
        _int_in("history_window", self.history_window, 1, 10_000)
        _float_in("history_lo", self.history_lo, 0.0, 1e6)
        _float_in("history_hi", self.history_hi, self.history_lo, 1e6)
        _int_in("history_step", self.history_step, 1, 64)
        _choice("history_cooldown", self.history_cooldown, ("full_window", "none"))
        _choice("history_tau", self.history_tau, ("drafts", "drafts_plus_bonus"))
        _choice("history_mode", self.history_mode, ("absolute", "relative"))
        _float_in("history_lo_ratio", self.history_lo_ratio, 0.0, 1e3)
        _float_in("history_hi_ratio", self.history_hi_ratio, self.history_lo_ratio, 1e3)
        _bool("use_entropy", self.use_entropy)
        _choice("alpha_source", self.alpha_source, ("lag1", "fresh", "path_mean"))
        _choice("rounding", self.rounding, ("half_up", "ceil", "floor"))
        _bool("clamp_level_width", self.clamp_level_width)
        _choice("parent_prob", self.parent_prob, ("conditional", "joint"))
        _choice("threshold_on", self.threshold_on, ("joint", "conditional"))
        _choice("prob_space", self.prob_space, ("full", "topk"))
        _choice("budget_order", self.budget_order, ("best_first", "parent_order"))
        _bool("keep_top1", self.keep_top1)
        _choice("topology", self.topology, ("online", "planned"))
        _int_in("eagle_depth", self.eagle_depth, 1, 64)
        _int_in("eagle_total_tokens", self.eagle_total_tokens, 1, 1024)
        _int_in("chain_depth", self.chain_depth, 1, 64)
        _int_in("topn_nodes", self.topn_nodes, 1, 1024)
        _float_in("topn_threshold", self.topn_threshold, 0.0, 1e6)
        _int_in("topn_max_depth", self.topn_max_depth, 1, 64)
        # the static tree's ranks must fit k only where it is used (static, SAGE's first round)
        uses_static = POLICIES[self.policy].uses_static_tree(self)
        _validate_tree_choices("static_tree", self.static_tree, self.k if uses_static else 64)

    # -- derived sizes (the policy's own, :mod:`sage_plugin.core.policies`) ------------------
    @property
    def max_tree_depth(self) -> int:
        """Deepest draft level any round of the configured policy can reach."""
        return POLICIES[self.policy].max_depth_for(self)

    @property
    def max_plan_depth(self) -> int:
        """Deepest draft level the configured policy's plan can reach: :attr:`max_tree_depth` less the reference
        engine's deeper beam (``beam_depth``); what a runtime with its own fixed beam drafts (SGLang's derived steps)."""
        return POLICIES[self.policy].plan_depth_for(self)

    @property
    def max_tree_nodes(self) -> int:
        """Largest number of draft nodes (root excluded) in one request's tree."""
        return POLICIES[self.policy].max_nodes_for(self)


@dataclass(frozen=True, slots=True)
class ServingConfig(_Section):
    """The serving layer's speculation control: the tiers captured at start-up and how one is chosen per step."""

    # -- serving tiers (SGLang) ----------------------------------------------------------------------
    # serving tiers (serving/tiers.py): [steps, draft_tokens] shapes captured at start-up, one chosen per step by
    # measured tokens per second; [0, 1] is speculation off.  Empty: one shape (the largest SAGE can plan)
    tiers: tuple[tuple[int, ...], ...] = ()
    tier_probe_every: int = 16  # steps between re-measurements of a tier not chosen (0: never)
    # a tier that loses its re-measurement waits twice as long for the next, up to this many tier_probe_every (1: no
    # back-off; every probe of a tier that cannot pay costs a whole step at its price)
    tier_probe_backoff: int = 8
    # a probe backs its tier off only if the tier loses even at its fastest measured step and its expected tokens this
    # many standard errors high (TierChooser.optimistic_rate): estimates from a few early steps cannot hold it out
    # (0: every probe another tier out-rates backs off)
    tier_probe_confidence: float = 1.0
    # acceptance of each tier kept per bin of the batch's mean alpha (0: one average per tier, alpha not used)
    tier_alpha_bins: int = 4
    # a tier is measured at a new batch size only if its rate could still beat the best measured there, its cost
    # bounded below from the sizes around it less this fraction (1: every tier measured at every batch size)
    tier_bound_slack: float = 0.1
    # how a tier's expected tokens are estimated: pooled (one per-level acceptance model shared by every tier, per
    # alpha bin), width (one such model per verify width: tiers of the same draft tokens share it) or per_tier (each
    # tier's own moving averages); serving/tiers.py
    tier_acceptance: str = "width"
    # calibrated: acceptance per batch-size class and alpha bin with the draft's confidence as the prior, change
    # detection, speculation off under doubt, admissions priced; measured: each bin's counts (docs/design/serving-control.md)
    tier_control: str = "calibrated"
    # a request whose own drafts keep failing stops speculating while its batch goes on (serving/request_gate.py)
    tier_request_gate: bool = False
    # each request's drafts priced at its own acceptance: the drafts the tier control expected of it and those it
    # accepted, shrunk toward the population's rate by this many expected drafts (serving/request_acceptance.py;
    # 0: every request priced at the population's rate)
    tier_request_prior: float = 2.0
    # with tier_request_prior > 0, a drafted tier must also pay for the batch's median request: a step whose drafts
    # pay for the batch through a few requests that accept most drafts, while the median request waits longer per
    # token than an off step would keep it, runs off (serving/break_even.py, BreakEven.median_pays)
    tier_median_request: bool = True
    # steps the off tier may leave a standalone draft behind on CPU instead of running its draft extend; the draft
    # catches up in one forward before the next drafted step, and the tier control prices each catch-up (0: every off
    # step runs the extend; the shipped CPU config sets 128; docs/design/sglang-internals.md, "The speculation-off
    # tier")
    tier_off_lag: int = 0
    # the off tier's target forward runs as SGLang's DECODE forward instead of a one-node TARGET_VERIFY (CPU; same
    # tokens, slots and logits; docs/design/sglang-internals.md, "The speculation-off tier")
    tier_off_decode: bool = True
    # a drafted tier's verify computes only the nodes whose draft path probability reaches the tier chooser's
    # break-even (TierChooser.row_threshold, from the measured step costs at the batch size); greedy batches on CPU
    # (docs/design/sglang-internals.md, "Ragged verify")
    ragged_verify: bool = False
    # SGLang's --min-free-slots-delay holds new requests while fewer slots are free, unbounded; SAGE's requests finish
    # one or two at a time, so the hold leaves slots empty for many steps: hold until this many drafted decode steps
    # ran (off steps do not count; 0: SGLang's unbounded hold; serving/admission_hold.py)
    admission_hold_steps: int = 0

    def __post_init__(self) -> None:
        _validate_tiers(self.tiers)
        _int_in("tier_probe_every", self.tier_probe_every, 0, 1_000_000)
        _int_in("tier_probe_backoff", self.tier_probe_backoff, 1, 1024)
        _float_in("tier_probe_confidence", self.tier_probe_confidence, 0.0, 10.0)
        _int_in("tier_alpha_bins", self.tier_alpha_bins, 0, 64)
        _float_in("tier_bound_slack", self.tier_bound_slack, 0.0, 1.0)
        _choice("tier_acceptance", self.tier_acceptance, ACCEPTANCE_MODELS)
        _choice("tier_control", self.tier_control, tuple(TIER_CONTROLS))
        _bool("tier_request_gate", self.tier_request_gate)
        _float_in("tier_request_prior", self.tier_request_prior, 0.0, 1000.0)
        _bool("tier_median_request", self.tier_median_request)
        _int_in("tier_off_lag", self.tier_off_lag, 0, 1024)
        _bool("tier_off_decode", self.tier_off_decode)
        _bool("ragged_verify", self.ragged_verify)
        _int_in("admission_hold_steps", self.admission_hold_steps, 0, 1_000_000)


@dataclass(frozen=True, slots=True)
class CpuConfig(_Section):
    """How the CPU paths run the draft and the scheduler; GPUs keep the runtime's own."""

    # -- CPU serving ---------------------------------------------------------------------------
    # keep SGLang's overlap scheduler on a CPU server (it is on by default on GPUs); off by default on CPU, where the
    # step's host work has no device time to hide behind; on, the CPU runs the GPU's code path
    # (docs/design/sglang-internals.md, "Overlap scheduling")
    cpu_overlap: bool = False
    # the draft's linear weights on CPU: bfloat16 = stored in bfloat16 and widened to float32 by the rows kernel as
    # they stream (half the bytes of a memory-bound draft forward; float32 products), float32 = as loaded.  Lossless
    # either way (the target verifies); the draft's distribution moves by bfloat16 rounding.  GPUs: the server dtype
    cpu_draft_dtype: str = "bfloat16"
    # the draft's forwards through a lean decoder: the same layers and parameters without the runtime's per-layer
    # Python (reference engine: engines/lean.py instead of transformers' modules; SGLang on CPU: a standalone
    # Llama-family draft's LlamaModel.forward, runtimes/sglang/lean_draft.py; SGLang on GPUs captures its own).
    # Lossless (the target verifies); the draft's numbers move by float rounding
    cpu_lean_draft: bool = True

    def __post_init__(self) -> None:
        _bool("cpu_overlap", self.cpu_overlap)
        _choice("cpu_draft_dtype", self.cpu_draft_dtype, ("bfloat16", "float32"))
        _bool("cpu_lean_draft", self.cpu_lean_draft)


@dataclass(frozen=True, slots=True)
class RuntimeConfig(_Section):
    """What the SGLang adapter does beyond the algorithm: agreement across ranks, per-request opt-out."""

    # -- tensor parallelism and requests ----------------------------------------------------------
    # tensor parallelism: broadcast each step's verified tree (and the tier chooser's alpha) from rank 0, so ranks
    # whose draft scores differ still verify the same tokens: auto = where SGLang itself broadcasts the verify result
    # (ROCm, a batch with sampling requests), tree = every step, off = never (docs/design/sglang-internals.md,
    # "Tensor parallelism")
    tp_sync: str = "auto"
    # request parameters (comma-separated, OPT_OUT_PARAMS) whose requests run without speculation inside a batch that
    # speculates (they verify their root only); penalties, min_tokens and min_p are exact under SAGE without it
    opt_out_params: str = ""

    def __post_init__(self) -> None:
        _choice("tp_sync", self.tp_sync, ("auto", "tree", "off"))
        if not isinstance(self.opt_out_params, str):
            raise ConfigError(f"opt_out_params must be a comma-separated list of {', '.join(OPT_OUT_PARAMS)}")
        for name in opt_out_names(self.opt_out_params):
            _choice("opt_out_params", name, OPT_OUT_PARAMS)


@dataclass(frozen=True, slots=True)
class VlmConfig(_Section):
    """A VLM draft's prompt: the share of visual tokens pruned (SpecVLM's draft-side pruning)."""

    # -- VLM draft-side visual-token pruning (SpecVLM) ------------------------------------------
    prune_ratio_image: float = 0.8  # share of a VLM draft's image tokens pruned from its prompt
    prune_ratio_video: float = 0.9  # share of a VLM draft's video tokens pruned from its prompt

    def __post_init__(self) -> None:
        _float_in("prune_ratio_image", self.prune_ratio_image, 0.0, 1.0)
        _float_in("prune_ratio_video", self.prune_ratio_video, 0.0, 1.0)
        if self.prune_ratio_image >= 1.0 or self.prune_ratio_video >= 1.0:
            raise ConfigError("prune_ratio_image and prune_ratio_video must be < 1 (keep at least one token)")
