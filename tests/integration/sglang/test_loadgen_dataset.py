"""``sage bench-serving --load sglang`` against the installed SGLang: the prompt file it writes is what SGLang's own
load generator reads (its ``custom`` dataset, with the local target's tokenizer and chat template), and the
``spec_totals`` counters it differences come from SGLang's own metrics reporter.

The whole loop (servers launched one at a time, the load generator run per load, outputs compared) runs against
stand-ins in ``tests/unit/test_bench_loadgen.py``; one real run per method at a tiny load is the smoke command in
``docs/design/serving-control.md``.
"""

from __future__ import annotations

import random
import types

import pytest

pytest.importorskip("sglang")

from sage_plugin.bench.loadgen import write_custom_prompts  # noqa: E402
from sage_plugin.data.prompts import ood_prompts  # noqa: E402
from sage_plugin.runtimes.sglang.request_meta import spec_totals  # noqa: E402


def test_sglangs_custom_dataset_reads_the_prompts_with_the_chat_template(tmp_path, target_dir):
    from sglang.benchmark.datasets.custom import sample_custom_requests
    from transformers import AutoTokenizer

    texts = [p.messages[-1]["content"] for p in ood_prompts(10)]
    path = write_custom_prompts(texts, tmp_path / "p.jsonl")
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    random.seed(1)  # what the load generator does with --seed before loading
    rows = sample_custom_requests(str(path), 10, tokenizer, fixed_output_len=32, apply_chat_template=True)
    assert len(rows) == 10 and all(r.output_len == 32 for r in rows)
    assert sorted(t for t in texts if any(t in r.prompt for r in rows)) == sorted(texts)  # every prompt, once
    assert all(r.prompt.rstrip().endswith("assistant") for r in rows)  # rendered by the target's chat template
    random.seed(1)
    again = sample_custom_requests(str(path), 10, tokenizer, fixed_output_len=32, apply_chat_template=True)
    assert [r.prompt for r in again] == [r.prompt for r in rows]  # the same order on every server


def test_spec_totals_read_sglangs_metrics_reporter_including_the_open_interval():
    import inspect

    from sglang.srt.managers.scheduler_components import metrics_reporter

    reporter = types.SimpleNamespace(
        spec_total_num_accept_tokens=300, spec_num_accept_tokens=15, spec_total_num_forward_ct=200,
        spec_num_forward_ct=10,
    )  # fmt: skip
    source = inspect.getsource(metrics_reporter)
    assert all(f"self.{name} = 0" in source or f"self.{name} +=" in source for name in vars(reporter))  # SGLang's
    spec = types.SimpleNamespace(is_none=lambda: False)
    assert spec_totals(types.SimpleNamespace(metrics_reporter=reporter, spec_algorithm=spec)) == {
        "spec_totals": {"accept_tokens": 315, "forwards": 210}
    }
    none = types.SimpleNamespace(is_none=lambda: True)
    assert spec_totals(types.SimpleNamespace(metrics_reporter=reporter, spec_algorithm=none)) == {}


def test_the_generated_datasets_build_offline_from_the_local_models(target_dir):
    """``random-ids`` with the target's tokenizer and ``image`` with the CPU VLM's processor (one 640x360 image, as
    ``sage bench-serving`` asks), from local directories: nothing from a hub."""
    from pathlib import Path

    from sglang.benchmark.datasets.image import ImageDataset
    from sglang.benchmark.datasets.random import RandomDataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    ids = RandomDataset(input_len=64, output_len=16, num_requests=3, range_ratio=1.0, dataset_path="",
                        return_text=True, random_sample=False)  # what --dataset-name random-ids builds  # fmt: skip
    rows = ids.load(tokenizer=tokenizer)
    assert len(rows) == 3 and all(r.output_len == 16 and r.prompt_len == 64 for r in rows)
    vlm = Path.home() / ".cache" / "sage_plugin" / "qwen2-vl-smollm2-135m"
    if not (vlm / "config.json").exists():
        pytest.skip(f"the CPU VLM is not built at {vlm} (sage build-vlm)")
    images = ImageDataset(num_requests=2, image_count=1, input_len=32, output_len=16, range_ratio=1.0,
                          image_content="random", image_format="jpeg", image_resolution="360p", backend="sglang",
                          random_image_count=False, seed=1)  # fmt: skip
    rows = images.load(model_id=str(vlm))
    assert len(rows) == 2 and all(r.image_data for r in rows) and all(r.output_len == 16 for r in rows)
