"""SageConfig validation, (de)serialisation and replace()."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from sage_plugin.config import MC_SIM_7B_63, AlgorithmConfig, ConfigError, SageConfig, from_mapping, knob_fields
from sage_plugin.core.sage import pool_of

# field -> bad values (each alone, all other fields at their defaults)
BAD_VALUES: dict[str, list] = {
    "policy": ["medusa", "", None, 1],
    "k": [1, 65, True, 2.0, "10"],
    "d_min": [0, 65, -1, 3.5],
    "d_max": [2, 65, None],  # d_max < d_min (3)
    "w_min": [0, 11, 1.5],  # w_min > k (10)
    "w_max": [1, 11],  # w_max < w_min (2), > k
    "n_max": [0, 1025, 64.0],
    "node_budget": ["gpu", "", None, True],
    "theta0": [-0.1, 1.5, math.nan, math.inf, True, "0.1"],
    "alpha_init": [-0.01, 1.01, math.nan, None],
    "first_round_static": [1, "yes", None],
    "pad_forwards": [0, "no", None],
    "cost_refresh": [-1, 1.5, "16", None],
    "rerank_nodes": [-1, 2000, 1.5, "4"],
    "rerank_pool": ["beams", "", None],
    "calibration": [[[0.5, 0.0]], [[1.5]], [[0.5], [0.5, 0.6]], [0.5]],
    "tiers": [[[0, 2]], [[1, 1]], [[3, 5], [3, 5]], [[2, 4, 6]], [3, 5], "3:5"],
    "tier_probe_every": [-1, 1.5, "16", None],
    "tier_probe_backoff": [0, 1025, 2.5, "8", None],
    "tier_probe_confidence": [-0.5, 10.5, "1", None],
    "tier_bound_slack": [-0.1, 1.5, "0.1", None],
    "tier_acceptance": ["pool", "", None],
    "tier_control": ["calibrate", "", None],
    "tier_request_gate": [1, "yes", None],
    "tier_request_prior": [-1.0, 1000.5, "2", None],
    "tier_median_request": [1, "yes", None],
    "tier_off_lag": [-1, 1025, 2.5, "16", None],
    "tier_off_decode": [1, "true", None],
    "ragged_verify": [1, "true", None],
    "admission_hold_steps": [-1, 1_000_001, 2.5, "10", None],
    "cpu_overlap": [1, "yes", None],
    "lookahead": [0, "no", None],
    "cpu_draft_dtype": ["fp16", "bf16", None],
    "cpu_lean_draft": ["yes", 1, None],
    "price_level_host": [0, "no", None],
    "tp_sync": ["on", 1, None],
    "opt_out_params": ["bogus", "presence_penalty,seed"],
    "tier_alpha_bins": [-1, 65, 1.5, "4", None],
    "use_history": [0, "true"],
    "history_window": [0, 10_001, 2.5],
    "history_lo": [-1.0, math.nan, 1e7],
    "history_hi": [1.0, math.inf],  # history_hi < history_lo (2.0)
    "history_step": [0, 65],
    "d_cap": [7, 65],  # d_cap < d_max (8)
    "beam_depth": [0, 65, 2.5, None],
    "history_cooldown": ["half", True],
    "history_tau": ["tokens", None],
    "history_mode": ["ratio", None],
    "history_lo_ratio": [-0.1, math.nan, 2000.0],
    "history_hi_ratio": [0.5, math.inf],  # history_hi_ratio < history_lo_ratio (0.8)
    "use_entropy": [1, None],
    "alpha_source": ["lag2", ""],
    "rounding": ["nearest", "round"],
    "clamp_level_width": ["no", 0],
    "parent_prob": ["marginal"],
    "threshold_on": ["node"],
    "prob_space": ["softmax"],
    "budget_order": ["dfs"],
    "keep_top1": [None, 1],
    "topology": ["static"],
    "eagle_depth": [0, 65],
    "eagle_total_tokens": [0, 1025],
    "chain_depth": [0, 65],
    "topn_nodes": [0, 1025, 2.5],
    "topn_threshold": [-0.1, math.nan, "0.5"],
    "topn_max_depth": [0, 65],
    "static_tree": [(), ((0,), (0,)), ((1, 1),), ((10,),), ((),), ((0, -1),), [[0]], ((0.0,),)],
    "prune_ratio_image": [1.0, -0.1, 1.5, math.nan],
    "prune_ratio_video": [1.0, -0.5, 2.0],
}


def test_every_field_has_bad_values():
    assert set(BAD_VALUES) == {f.name for f in knob_fields()}


@pytest.mark.parametrize("name,value", [(n, v) for n, vs in BAD_VALUES.items() for v in vs])
def test_bad_value_raises_config_error_naming_the_field(name, value):
    with pytest.raises(ConfigError) as err:
        SageConfig(**{name: value})
    assert name in str(err.value)
    assert isinstance(err.value, ValueError)


def test_defaults_are_valid_and_match_the_paper():
    cfg = SageConfig().algorithm
    assert (cfg.k, cfg.d_min, cfg.d_max, cfg.w_min, cfg.w_max, cfg.n_max) == (10, 3, 8, 2, 10, 64)
    assert cfg.theta0 == 0.1 and cfg.alpha_init == 0.5
    assert (cfg.history_window, cfg.history_lo, cfg.history_hi) == (10, 2.0, 3.0)
    assert cfg.static_tree == MC_SIM_7B_63 and len(MC_SIM_7B_63) == 25


def test_boundary_values_are_accepted():
    SageConfig(k=2, w_min=1, w_max=2, static_tree=((0,), (1,), (0, 0)))
    SageConfig(d_min=8, d_max=8)
    SageConfig(theta0=0.0)
    SageConfig(theta0=1.0, alpha_init=0.0)
    SageConfig(alpha_init=1)
    SageConfig(history_lo=3.0, history_hi=3.0)
    SageConfig(prune_ratio_image=0.0, prune_ratio_video=0.999)


def test_frozen():
    cfg = SageConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.k = 4  # type: ignore[misc]


def test_from_mapping_unknown_key():
    with pytest.raises(ConfigError) as err:
        from_mapping({"k": 10, "thetta0": 0.2, "zzz": 1})
    assert "thetta0" in str(err.value) and "zzz" in str(err.value)
    with pytest.raises(ConfigError):
        SageConfig.from_mapping({"nope": 1})


def test_from_mapping_converts_static_tree_lists():
    cfg = from_mapping({"static_tree": [[0], [1], [0, 0]], "policy": "static"})
    assert cfg.algorithm.static_tree == ((0,), (1,), (0, 0))
    with pytest.raises(ConfigError) as err:
        from_mapping({"static_tree": "0,1"})
    assert "static_tree" in str(err.value)
    with pytest.raises(ConfigError) as err:
        from_mapping({"static_tree": [0, 1]})
    assert "static_tree" in str(err.value)


@pytest.mark.parametrize("section", [None, "sage"])
def test_yaml_round_trip(tmp_path, section):
    cfg = SageConfig(
        policy="eagle2",
        k=8,
        w_max=8,
        theta0=0.25,
        rounding="ceil",
        threshold_on="conditional",
        static_tree=((0,), (1,), (0, 0), (0, 0, 7)),
        prune_ratio_video=0.5,
    )
    data = cfg.to_dict()
    assert data["static_tree"] == [[0], [1], [0, 0], [0, 0, 7]]
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"sage": data} if section else data))
    back = SageConfig.from_yaml(path, section=section)
    assert back == cfg
    assert SageConfig.from_yaml(path) == cfg  # default section "sage", or the whole file


def test_yaml_partial_and_bad(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("sage:\n  n_max: 32\n  alpha_source: fresh\nother: 1\n")
    cfg = SageConfig.from_yaml(path)
    assert cfg.algorithm.n_max == 32 and cfg.algorithm.alpha_source == "fresh" and cfg.algorithm.k == 10
    path.write_text("sage:\n  n_max: 0\n")
    with pytest.raises(ConfigError, match="n_max"):
        SageConfig.from_yaml(path)
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError):
        SageConfig.from_yaml(path)
    path.write_text("")
    assert SageConfig.from_yaml(path) == SageConfig()


def test_replace():
    cfg = SageConfig()
    new = cfg.replace(n_max=16, policy="chain", tier_off_lag=4)
    assert (new.algorithm.n_max, new.algorithm.policy, new.serving.tier_off_lag) == (16, "chain", 4)
    assert cfg.algorithm.n_max == 64 and cfg.algorithm.policy == "sage" and cfg.serving.tier_off_lag == 0
    assert (
        dataclasses.replace(new, algorithm=new.algorithm.replace(n_max=64, policy="sage"), serving=cfg.serving) == cfg
    )
    assert new.replace(static_tree=[[0], [0, 0]]).algorithm.static_tree == ((0,), (0, 0))
    assert new.algorithm.replace(static_tree=[[0], [0, 0]]).static_tree == ((0,), (0, 0))
    with pytest.raises(ConfigError, match="n_max"):
        cfg.replace(n_max=-1)
    with pytest.raises(ConfigError, match="bogus"):
        cfg.replace(bogus=1)


def test_reranking_needs_the_online_topology():
    SageConfig().replace(rerank_nodes=8)  # online: accepted
    with pytest.raises(ConfigError, match="rerank_nodes works with topology online"):
        SageConfig(topology="planned").replace(rerank_nodes=8)


@pytest.mark.parametrize("pool", ["kept", "children", "beam"])
def test_the_planned_topology_builds_the_kept_tree_whatever_the_pool(pool):
    planned = AlgorithmConfig(topology="planned", rerank_pool=pool)
    assert pool_of(planned) == "kept" and pool_of(AlgorithmConfig(rerank_pool=pool)) == pool
    assert planned.max_tree_nodes == AlgorithmConfig(topology="planned", rerank_pool="kept").max_tree_nodes


def test_derived_sizes():
    for pool in ("kept", "children"):  # the plan's depth: d_cap with history, d_max without, the static tree's
        assert AlgorithmConfig(rerank_pool=pool).max_tree_depth == 10
        assert AlgorithmConfig(rerank_pool=pool, use_history=False).max_tree_depth == 8
        kw = dict(rerank_pool=pool, use_history=False, d_max=4, d_cap=4)
        assert AlgorithmConfig(**kw, first_round_static=True).max_tree_depth == 5
        assert AlgorithmConfig(**kw, first_round_static=False).max_tree_depth == 4
    # the beam (the default pool) grows to beam_depth whatever the plan; the plan's depth is what SGLang drafts
    assert AlgorithmConfig().max_tree_depth == 16 and AlgorithmConfig().max_plan_depth == 10
    assert AlgorithmConfig(beam_depth=4, first_round_static=False).max_tree_depth == 4
    assert AlgorithmConfig(beam_depth=4).max_tree_depth == 5  # the static first tree is 5 deep
    assert AlgorithmConfig(use_history=False, beam_depth=4, first_round_static=False).max_plan_depth == 8
    assert AlgorithmConfig(topology="planned").max_tree_depth == 10  # the planned replay builds the kept tree
    assert AlgorithmConfig(n_max=10, rerank_pool="kept").max_tree_nodes == 25  # the static first round is not cut
    assert AlgorithmConfig(n_max=10).max_tree_nodes == 10  # the beam's rerank to n_max cuts every round, the first too
    assert AlgorithmConfig(n_max=10, first_round_static=False).max_tree_nodes == 10
    assert AlgorithmConfig(policy="eagle2").max_tree_nodes == 60
    assert AlgorithmConfig(policy="chain", chain_depth=4).max_tree_nodes == 4
    assert (
        AlgorithmConfig(policy="static").max_tree_nodes == 25 and AlgorithmConfig(policy="static").max_tree_depth == 5
    )


def test_sections_compose_the_config_and_each_field_has_one_home():
    """Flat fields go to the section of the layer that reads them; a section object may be given whole, with flat
    fields of that section applied on top; names are unique across sections and the flat view round-trips."""
    from sage_plugin.config import KNOBS, SECTIONS, CpuConfig, RuntimeConfig, ServingConfig, VlmConfig

    assert list(SECTIONS) == ["algorithm", "serving", "cpu", "runtime", "vlm"]
    assert {KNOBS[n] for n in ("d_max", "eagle_depth", "static_tree", "cost_refresh")} == {"algorithm"}
    assert {KNOBS[n] for n in ("tiers", "tier_off_lag", "ragged_verify")} == {"serving"}
    assert (KNOBS["cpu_lean_draft"], KNOBS["tp_sync"], KNOBS["prune_ratio_video"]) == ("cpu", "runtime", "vlm")
    assert [f.name for f in knob_fields()] == list(KNOBS)
    cfg = SageConfig(d_max=6, tier_off_lag=128, cpu_draft_dtype="float32", tp_sync="tree", prune_ratio_image=0.5)
    assert cfg.algorithm == AlgorithmConfig(d_max=6) and cfg.serving == ServingConfig(tier_off_lag=128)
    assert cfg.cpu == CpuConfig(cpu_draft_dtype="float32") and cfg.runtime == RuntimeConfig(tp_sync="tree")
    assert cfg.vlm == VlmConfig(prune_ratio_image=0.5)
    for name, value in cfg.to_dict().items():  # rows (static_tree, calibration, tiers) flatten to lists
        got = cfg.knob(name)
        assert ([list(row) for row in got] if isinstance(got, tuple) else got) == value, name
    assert from_mapping(cfg.to_dict()) == cfg == cfg.replace()
    given = SageConfig(algorithm=AlgorithmConfig(d_max=6), d_min=2, tier_off_lag=1)
    assert (given.algorithm.d_min, given.algorithm.d_max, given.serving.tier_off_lag) == (2, 6, 1)
    with pytest.raises(ConfigError, match="algorithm must be a AlgorithmConfig, got ServingConfig"):
        SageConfig(algorithm=ServingConfig())
    with pytest.raises(ConfigError, match="unknown SAGE option"):
        SageConfig(tier_probe=3)
    with pytest.raises(ConfigError, match="d_min must be an integer in \\[1, 64\\]"):
        SageConfig(algorithm=AlgorithmConfig(), d_min=0)
    with pytest.raises(KeyError):
        cfg.knob("algorithm")
