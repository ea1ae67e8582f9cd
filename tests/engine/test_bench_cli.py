"""`sage bench` end to end on the real target (tiny budget), engine configs, method parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sage_plugin.bench.methods import ABLATIONS, DEFAULT_METHODS, parse_method
from sage_plugin.cli import main
from sage_plugin.config import ConfigError, SageConfig

ROOT = Path(__file__).resolve().parents[2]


def test_reference_engine_config_is_valid_and_matches_defaults():
    cfg = SageConfig.from_yaml(ROOT / "engine_configs/reference/smollm2_cpu_sage.yaml")
    assert cfg == SageConfig()


def test_every_named_ablation_parses_to_a_valid_config():
    base = SageConfig()
    for name in ABLATIONS:
        spec = parse_method(name, base)
        assert spec.name == name and spec.config is not None
    assert parse_method("ar", base).config is None
    tuned = parse_method("static-tuned", base)
    assert tuned.tuned and tuned.name == "static-tuned" and tuned.config.algorithm.policy == "static"
    calibrated = parse_method("sage-calibrated", base)
    assert (
        calibrated.tuned
        and calibrated.config.algorithm.policy == "sage"
        and calibrated.config.algorithm.calibration == ()
    )
    custom = parse_method("tight=sage:n_max=16,theta0=0.2", base)
    assert custom.name == "tight" and custom.config.algorithm.n_max == 16 and custom.config.algorithm.theta0 == 0.2
    for bad in ("nope", "sage:n_max=0", "sage:unknown_knob=1", "ar:k=2", "sage:n_max", "static-tuned:k=2"):
        with pytest.raises(ConfigError):
            parse_method(bad, base)


def test_calibrate_writes_a_config_the_bench_reads(tmp_path, capsys):
    """``sage calibrate`` on the real pair (2 prompts x 6 tokens): a YAML whose table validates and loads."""
    out = tmp_path / "cal.yaml"
    rc = main(["calibrate", "--num-prompts", "2", "--max-new-tokens", "6", "--alpha-bins", "2", "--prob-bins", "5",
               "--out", str(out)])  # fmt: skip
    assert rc == 0
    cfg = SageConfig.from_yaml(out)
    assert len(cfg.algorithm.calibration) == 2 and all(len(r) == 5 for r in cfg.algorithm.calibration)
    assert all(all(x <= y for x, y in zip(r, r[1:])) for r in cfg.algorithm.calibration)
    assert out.read_text().startswith("# SAGE calibration (sage calibrate)")
    assert f"wrote {out} (" in capsys.readouterr().out


def test_bad_flag_is_one_clear_error(capsys):
    assert main(["bench", "--set", "w_max=99", "--num-prompts", "1"]) == 2
    err = capsys.readouterr().err
    assert "w_max" in err and "[2, 10]" in err


@pytest.mark.slow
def test_bench_quick_shape(tmp_path, capsys):
    out = tmp_path / "bench.json"
    plots = tmp_path / "plots"
    rc = main(
        [
            "bench",
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "6",
            "--methods",
            ",".join(DEFAULT_METHODS),
            "--warmup",
            "0",
            "--json",
            str(out),
            "--plots",
            str(plots),
            "--no-progress",
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["methods"]) == set(DEFAULT_METHODS)
    for name, m in doc["methods"].items():
        for key in ("tau", "tokens_per_s", "speedup", "exact_match", "mean_nodes"):
            assert key in m, (name, key)
        assert m["exact_match"] == 1.0, name
    assert doc["methods"]["ar"]["tau"] == 1.0 and doc["methods"]["ar"]["speedup"] == 1.0
    # tree-policy overhead: part of every speculative method's decode time, none for plain decoding
    assert doc["methods"]["ar"]["policy_ms_per_round"] == 0.0 and doc["methods"]["ar"]["policy_share"] == 0.0
    for name in DEFAULT_METHODS[1:]:
        m = doc["methods"][name]
        assert m["policy_ms_per_round"] > 0 and 0 < m["policy_share"] < 1, name
    assert doc["config"]["max_new_tokens"] == 6
    assert doc["config"]["draft"], "the draft in use must be stated"
    assert sorted(p.name for p in plots.iterdir()) == [
        "alpha_calibration.png",
        "entropy_autocorrelation.png",
        "tau_by_method.png",
    ]
    table = capsys.readouterr().out
    assert "| sage |" in table and "speed-up vs ar" in table
    # sage (node_budget=auto) measured the round cost once, outside decode time; sage-paper did not need it
    ((key, costs),) = doc["config"]["round_costs"].items()
    assert key == "batch 1, 64 nodes, padded"  # pad_forwards is on by default
    assert len(costs["verify_ms"]) == 65 and costs["draft_ms"] > 0
    assert len(costs["verify_run"]) == 65 and all(r >= q for q, r in enumerate(costs["verify_run"]))
    assert all(a <= b for a, b in zip(costs["verify_ms"], costs["verify_ms"][1:]))
    assert doc["methods"]["sage"]["profile_s"] > 0 and doc["methods"]["sage-paper"]["profile_s"] == 0
    assert "node_budget=auto, padded, batch 1: target forward ms by verified tokens" in table


@pytest.mark.slow
def test_bench_vlm_prompts(tmp_path):
    out = tmp_path / "vlm.json"
    rc = main(
        [
            "bench",
            "--datasets",
            "vlm",
            "--num-prompts",
            "1",
            "--max-new-tokens",
            "5",
            "--methods",
            "ar,sage",
            "--warmup",
            "0",
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["methods"]["sage"]["exact_match"] == 1.0
    assert "SmolVLM" in doc["config"]["target"] and "visual tokens removed" in doc["config"]["draft"]


@pytest.mark.slow
def test_bench_image_and_video_prompts_report_by_modality(tmp_path, capsys):
    """``--datasets vlm,vlm-video`` with a VLM draft: the Qwen2.5-VL on SmolLM2 serves both, the draft prunes 80% of
    an image's and 90% of a video's visual tokens, outputs stay exact, and the report has one row per modality with
    its tau and mean root alpha."""
    from sage_plugin.engines.vlm import ensure_qwen_vl_draft

    out = tmp_path / "media.json"
    argv = ["bench", "--datasets", "vlm,vlm-video", "--num-prompts", "2", "--max-new-tokens", "6", "--methods",
            "ar,sage", "--warmup", "0", "--draft-vlm", str(ensure_qwen_vl_draft("qwen2_5_vl")), "--json", str(out),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["methods"]["sage"]["exact_match"] == 1.0
    assert "Qwen2.5-VL" in doc["config"]["target"] and "90% of video tokens pruned" in doc["config"]["draft"]
    per = doc["methods"]["sage"]["per_modality"]
    assert set(per) == {"image", "video"} and all(m["requests"] == 1 and m["tau"] >= 1.0 for m in per.values())
    assert all(0.0 <= m["alpha"] <= 1.0 for m in per.values()), per
    assert "by modality" in capsys.readouterr().out
