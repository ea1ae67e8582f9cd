"""End to end on CPU: SAGE over an EAGLE-3 head on a VLM target, the shipped GPU configuration's code path
(``engine_configs/sglang/qwen2_5_vl_7b_eagle3_sage.yaml``: Qwen2.5-VL with an EAGLE-3 head).

The target is the demo Qwen2.5-VL whose language model is the real SmolLM2-135M-Instruct; the draft is the bundled
SmolLM2 EAGLE-3 head fitted to it (``ensure_qwen_vl_eagle3``: the target's vocabulary size and M-RoPE section).
``--speculative-algorithm sage`` must resolve to ``SAGE_EAGLE3``: the target captures three of SmolLM2's layers for
the head, and the head's prefill reads the target's multimodal embeddings (image rows included) at their M-RoPE
positions.  Two servers, plain and SAGE (``qwen2_5_vl_smollm2_cpu_sage.yaml`` at SAGE's one largest shape, so every
step drafts and the accept length measures the head), get the same requests; greedy outputs must be identical, the
head's drafts must be accepted (accept length above 1), and the KV pool must return to its starting size.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")

from sage_plugin.bench.serving import parallel, plain_flags  # noqa: E402
from sage_plugin.data.prompts import load_prompts, mixed_text_prompts, openai_messages  # noqa: E402

from .conftest import REPO, launch_servers  # noqa: E402
from .mm_client import answer, chat, kv_returns  # noqa: E402

pytestmark = pytest.mark.slow

CONFIG = REPO / "engine_configs" / "sglang" / "qwen2_5_vl_smollm2_cpu_sage.yaml"


@pytest.fixture(scope="module")
def servers(launch_env, target_dir, tmp_path_factory):
    from sage_plugin.engines.vlm import ensure_qwen_vl_eagle3, ensure_qwen_vl_smollm2

    target, _ = ensure_qwen_vl_smollm2("qwen2_5_vl")
    head = ensure_qwen_vl_eagle3("qwen2_5_vl")
    logs = tmp_path_factory.mktemp("vlm_eagle3_logs")
    plain, sage = launch_servers(
        launch_env,
        (["--model-path", str(target), *plain_flags(CONFIG)], logs / "plain.log"),
        (["--config", str(CONFIG), "--model-path", str(target), "--speculative-draft-model-path", str(head),
          "--sage-tiers", "[]"], logs / "sage.log"),
    )  # fmt: skip
    yield plain, sage
    sage.stop()
    plain.stop()


def test_sage_resolves_to_sage_eagle3_and_image_prompts_equal_plain(servers, kv_start):
    plain, sage = servers
    vlm = [openai_messages(p) for p in load_prompts("vlm", 4)]
    text = [p.messages for p in mixed_text_prompts(2)]
    msgs = vlm + text
    ref = parallel(lambda m: chat(plain, m), msgs)
    got = parallel(lambda m: chat(sage, m), msgs)
    assert [answer(g) for g in got] == [answer(r) for r in ref]
    assert sage.get("/server_info")["speculative_algorithm"] == "SAGE_EAGLE3"
    assert "is an EAGLE3 draft head: running as SAGE_EAGLE3" in sage.log.read_text()


def test_eagle3_drafts_are_accepted_on_image_prompts(servers, kv_start):
    """The native ``/generate`` API with ``image_data``: SAGE's per-request summary, and SGLang's accept length
    above 1 (the head's drafts after an image are accepted, not only the bonus token)."""
    from transformers import AutoProcessor

    from sage_plugin.data.prompts import image_data_url, multimodal_messages
    from sage_plugin.engines.vlm import ensure_qwen_vl_smollm2

    _, sage = servers
    processor = AutoProcessor.from_pretrained(str(ensure_qwen_vl_smollm2("qwen2_5_vl")[0]))
    prompts = load_prompts("vlm", 4)
    texts = [processor.apply_chat_template(multimodal_messages(p), add_generation_prompt=True, tokenize=False)
             for p in prompts]  # fmt: skip
    params = {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}
    outs = parallel(lambda i: sage.post("/generate", {"text": texts[i], "sampling_params": params,
                                                      "image_data": [image_data_url(prompts[i].image)]}), range(4))  # fmt: skip
    for o in outs:
        [summary] = o["meta_info"]["sage"]
        assert summary["rounds"] + summary["off_steps"] == o["meta_info"]["spec_verify_ct"] >= 1
    accept = [o["meta_info"]["spec_accept_length"] for o in outs]
    assert sum(accept) / len(accept) > 1.0, accept


def test_kv_pool_returns_to_its_starting_free_size(servers, kv_start):
    _, sage = servers
    info = kv_returns(sage, kv_start)
    assert info["kv_available_tokens"] == kv_start, (info, kv_start)
