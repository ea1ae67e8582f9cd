"""``sage bench-serving`` pieces that need no SGLang: the plain server's flags and the report table."""

from __future__ import annotations

from pathlib import Path

import yaml

from sage_plugin.bench.serving import format_table, plain_flags

CPU_CONFIG = Path(__file__).resolve().parents[2] / "engine_configs" / "sglang" / "smollm2_cpu_sage.yaml"


def test_plain_flags_are_the_yaml_without_speculative_keys(tmp_path):
    argv = plain_flags(CPU_CONFIG)
    assert not any(a.startswith(("--speculative", "--sage")) for a in argv)
    data = yaml.safe_load(CPU_CONFIG.read_text())
    for key, value in data.items():
        if key.startswith(("speculative-", "sage-")):
            continue
        i = argv.index(f"--{key}")
        if value is not True:
            assert argv[i + 1] == str(value)
    odd = tmp_path / "c.yaml"
    odd.write_text("device: cpu\nsleep-on-idle: true\nenable-metrics: false\nsage-k: 4\nspeculative-algorithm: sage\n")
    assert plain_flags(odd) == ["--device", "cpu", "--sleep-on-idle"]


def test_format_table():
    report = {
        "speculative_algorithm": "SAGE", "max_new_tokens": 64, "draft": "d",
        "rows": [{"batch_size": 1, "plain_tok_s": 14.8, "sage_tok_s": 7.7, "speedup": 0.52, "sage_accept_length": 1.8,
                  "sage_mean_alpha": 0.41, "sage_mean_depth": 2.6, "sage_mean_width": 2.8, "identical_outputs": True},
                 {"batch_size": 8, "plain_tok_s": 52.4, "sage_tok_s": 28.4, "speedup": 0.54, "sage_accept_length": None,
                  "sage_mean_alpha": None, "sage_mean_depth": None, "sage_mean_width": None,
                  "identical_outputs": False}],
    }  # fmt: skip
    table = format_table(report).splitlines()
    assert table[0].startswith("SGLang serving, SAGE vs plain, greedy, 64 new tokens")
    assert table[4] == "| 1 | 14.8 | 7.7 | 0.52x | 1.80 | 0.41 | 2.60 | 2.80 | yes |"
    assert table[5] == "| 8 | 52.4 | 28.4 | 0.54x | - | - | - | - | NO |"


def test_serving_requests_render_text_and_image_prompts(tmp_path):
    """Text prompts become the target's chat text; image prompts the processor's text with the image placeholder
    and the image as base64 ``image_data`` (SGLang's native /generate API)."""
    from sage_plugin.bench.serving import serving_requests
    from sage_plugin.data.prompts import load_prompts, mixed_text_prompts
    from sage_plugin.engines.vlm import build_tiny_vlm

    target = build_tiny_vlm("qwen2_vl", tmp_path / "tiny")
    text, image = mixed_text_prompts(1)[0], load_prompts("vlm", 1)[0]
    plain, vlm = serving_requests([text, image], target)
    assert set(plain) == {"text"} and text.messages[-1]["content"] in plain["text"]
    assert plain["text"].rstrip().endswith("assistant")
    assert "<|vision_start|><|image_pad|><|vision_end|>" in vlm["text"]
    assert image.messages[-1]["content"] in vlm["text"]
    assert len(vlm["image_data"]) == 1 and vlm["image_data"][0].startswith("data:image/png;base64,")
