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
    cfg = SageConfig.from_mapping({BY_FLAG[k].field: v for k, v in sage.items()})
    sizes = spec_sizes(cfg, topk=data.get("speculative-eagle-topk"), num_steps=data.get("speculative-num-steps"),
                       num_draft_tokens=data.get("speculative-num-draft-tokens"))
    assert sizes.topk >= 2 and sizes.num_steps >= 1 and sizes.num_draft_tokens >= 2
    if data.get("device") == "cpu":  # what the CPU demo can afford per verify
        assert sizes.num_draft_tokens <= 16 and sizes.topk * sizes.num_steps <= 32
