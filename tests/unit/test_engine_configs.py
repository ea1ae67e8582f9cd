"""Every YAML under ``engine_configs/`` is valid: SAGE keys form a valid SageConfig, SGLang sizes are derivable."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sage_plugin.config import SageConfig
from sage_plugin.runtimes.sglang.args import FLAGS, spec_sizes

ROOT = Path(__file__).resolve().parents[2] / "engine_configs"
SGLANG_CONFIGS = sorted((ROOT / "sglang").glob("*.yaml"))
BY_FLAG = {f.flag.removeprefix("--"): f for f in FLAGS}


def test_there_are_configs():
    assert SGLANG_CONFIGS and sorted((ROOT / "reference").glob("*.yaml"))


@pytest.mark.parametrize("path", sorted((ROOT / "reference").glob("*.yaml")), ids=lambda p: p.name)
def test_reference_config_loads(path):
    SageConfig.from_yaml(path)


@pytest.mark.parametrize("path", SGLANG_CONFIGS, ids=lambda p: p.name)
def test_sglang_config_is_a_valid_sage_launch(path):
    data = yaml.safe_load(path.read_text())
    assert data["speculative-algorithm"] == "sage"
    assert all("_" not in k for k in data), "SGLang --config keys are flags spelled with dashes"
    sage = {k: v for k, v in data.items() if k.startswith("sage-")}
    unknown = sorted(set(sage) - set(BY_FLAG))
    assert not unknown, f"not SAGE flags: {unknown}"
    # a list-valued flag may be written as its command-line JSON text (SGLang passes a string through to the parser)
    values = {
        k: BY_FLAG[k].parse(v) if isinstance(v, str) and BY_FLAG[k].kind == "paths" else v for k, v in sage.items()
    }
    cfg = SageConfig.from_mapping({BY_FLAG[k].field: v for k, v in values.items()})
    sizes = spec_sizes(
        cfg,
        topk=data.get("speculative-eagle-topk"),
        num_steps=data.get("speculative-num-steps"),
        num_draft_tokens=data.get("speculative-num-draft-tokens"),
    )
    assert sizes.topk >= 2 and sizes.num_steps >= 1 and sizes.num_draft_tokens >= 2
    if data.get("device") == "cpu":  # what the CPU demo can afford per verify
        assert sizes.num_draft_tokens <= 16 and sizes.topk * sizes.num_steps <= 32


GPU_CONFIGS = [p for p in SGLANG_CONFIGS if yaml.safe_load(p.read_text()).get("device", "cuda") != "cpu"]
#: the GPU serving configs the SGLang issue asks for: target, draft kind
EXPECTED_GPU = {
    "qwen2_5_vl_7b_eagle3_sage.yaml": ("Qwen/Qwen2.5-VL-7B-Instruct", "eagle3"),
    "qwen2_5_vl_72b_eagle3_sage.yaml": ("Qwen/Qwen2.5-VL-72B-Instruct", "eagle3"),
    "llava_ov_72b_7b_draft_sage.yaml": ("lmms-lab/llava-onevision-qwen2-72b-ov-sft", "standalone"),
}
#: attention heads / KV heads of the GPU targets (tensor parallelism must divide both)
HEADS = {
    "Qwen/Qwen2.5-VL-7B-Instruct": (28, 4),
    "Qwen/Qwen2.5-VL-72B-Instruct": (64, 8),
    "lmms-lab/llava-onevision-qwen2-72b-ov-sft": (64, 8),
}


def test_the_gpu_serving_configs_exist():
    assert sorted(p.name for p in GPU_CONFIGS) == sorted(EXPECTED_GPU)


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.name)
def test_gpu_config_is_a_serving_config(path):
    data = yaml.safe_load(path.read_text())
    target, kind = EXPECTED_GPU[path.name]
    assert data["model-path"] == target
    assert data["dtype"] in ("bfloat16", "float16")
    heads, kv_heads = HEADS[target]
    tp = data.get("tp-size", 1)
    assert heads % tp == 0 and kv_heads % tp == 0, (heads, kv_heads, tp)
    # a tree (topk > 1) with CUDA graphs needs a tree-capable GPU backend; CUDA graphs stay on
    assert data["attention-backend"] in ("fa3", "flashinfer", "triton")
    assert "cuda-graph-backend-decode" not in data and not data.get("disable-cuda-graph", False)
    assert data.get("sage-first-round-static") is False, "the SGLang worker plans round 1 from alpha_init"
    sage = {BY_FLAG[k].field: v for k, v in data.items() if k.startswith("sage-")}
    cfg = SageConfig.from_mapping(sage)
    sizes = spec_sizes(cfg)
    assert 2 <= sizes.topk <= 10 and sizes.num_draft_tokens <= 64
    # tiers down to speculation off: on an H200 the full shape costs several plain steps at 32 requests
    # (docs/benchmarks.md, "What a verify costs on a GPU"); the deepest tier is the shape sage-d-cap / sage-n-max describe
    assert (0, 1) in [(t.steps, t.draft_tokens) for t in sizes.tiers]
    assert (sizes.num_steps, sizes.num_draft_tokens) == (cfg.algorithm.d_cap, cfg.algorithm.n_max + 1)
    draft = data.get("speculative-draft-model-path")
    if kind == "standalone":
        assert draft, "a standalone draft is named in the file"
    text = path.read_text()
    assert ("SAGE_EAGLE3" in text) == (kind == "eagle3")
