"""End to end on CPU: SAGE over an EAGLE-3 head on a VLM target, the shipped GPU configuration's code path
(``engine_configs/sglang/qwen2_5_vl_7b_eagle3_sage.yaml``: Qwen2.5-VL with an EAGLE-3 head).

The target is the demo Qwen2.5-VL whose language model is the real SmolLM2-135M-Instruct; the draft is the bundled
SmolLM2 EAGLE-3 head fitted to it (``ensure_qwen_vl_eagle3``: the target's vocabulary size and M-RoPE section).
``--speculative-algorithm sage`` must resolve to ``SAGE_EAGLE3``: the target captures three of SmolLM2's layers for
the head, and the head's prefill reads the target's multimodal embeddings (image and video rows included) at their
M-RoPE positions.  Two servers, plain and SAGE (``qwen2_5_vl_smollm2_cpu_sage.yaml`` at SAGE's one largest shape, so
every step drafts and the accept length measures the head), get the same requests: bundled images and clips
(``vlm-video``: 2 s MP4s, 8 frames at the config's 4 frames a second) as base64 ``image_url`` / ``video_url`` parts
over the OpenAI API and as ``image_data`` / ``video_data`` over the native one, text requests mixed in.  Greedy
outputs must be identical, the head's drafts must be accepted (accept length above 1 on image and on video prompts),
a broken video is a 400 with the server serving on, and the KV pool must return to its starting size.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")

import base64  # noqa: E402

from sage_plugin.bench.serving import parallel, serving_requests  # noqa: E402
from sage_plugin.data.prompts import load_prompts, mixed_text_prompts, openai_messages  # noqa: E402

from .conftest import REPO  # noqa: E402
from .mm_client import answer, bad_media, chat, kv_returns, serving_pair  # noqa: E402

pytestmark = pytest.mark.slow

CONFIG = REPO / "engine_configs" / "sglang" / "qwen2_5_vl_smollm2_cpu_sage.yaml"


@pytest.fixture(scope="module")
def servers(launch_env, target_dir, tmp_path_factory):
    from sage_plugin.engines.vlm import ensure_qwen_vl_eagle3, ensure_qwen_vl_smollm2

    target, _ = ensure_qwen_vl_smollm2("qwen2_5_vl")
    head = ensure_qwen_vl_eagle3("qwen2_5_vl")
    logs = tmp_path_factory.mktemp("vlm_eagle3_logs")
    yield from serving_pair(launch_env, logs, CONFIG, target, head, "--sage-tiers", "[]")


def test_sage_resolves_to_sage_eagle3_and_image_video_text_prompts_equal_plain(servers, kv_start):
    plain, sage = servers
    images = [openai_messages(p) for p in load_prompts("vlm", 3)]
    videos = [openai_messages(p) for p in load_prompts("vlm-video", 3)]
    text = [p.messages for p in mixed_text_prompts(1)]
    msgs = images + videos + text
    ref = parallel(lambda m: chat(plain, m), msgs)
    got = parallel(lambda m: chat(sage, m), msgs)
    assert [answer(g) for g in got] == [answer(r) for r in ref]
    assert all(g["usage"]["prompt_tokens_details"]["video_tokens"] > 0 for g in got[3:6])
    assert sage.get("/server_info")["speculative_algorithm"] == "SAGE_EAGLE3"
    assert "is an EAGLE3 draft head: running as SAGE_EAGLE3" in sage.log.read_text()


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("data:video/mp4;base64," + base64.b64encode(b"not a video at all" * 10).decode(), "unreadable bytes"),
        ("data:video/mp4;base64,@@@not-base64@@@", "broken base64"),
    ],
)
def test_bad_videos_are_a_400_and_the_server_keeps_serving(servers, kv_start, url, what):
    status, body, after, plain_after = bad_media(*servers, {"type": "video_url", "video_url": {"url": url}})
    assert status == 400, (what, status, body[:500])
    assert after == plain_after


def test_eagle3_drafts_are_accepted_on_image_and_video_prompts(servers, kv_start):
    """The native ``/generate`` API with ``image_data`` / ``video_data``: the same tokens as plain serving, SAGE's
    per-request summary, and SGLang's accept length above 1 on each modality (the head's drafts after an image or a
    video are accepted, not only the bonus token)."""
    from sage_plugin.engines.vlm import ensure_qwen_vl_smollm2

    plain, sage = servers
    prompts = load_prompts("vlm", 5)[3:] + load_prompts("vlm-video", 5)[3:]  # not the first test's
    payloads = serving_requests(prompts, ensure_qwen_vl_smollm2("qwen2_5_vl")[0])
    params = {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}
    ref = parallel(lambda q: plain.post("/generate", {**q, "sampling_params": params}), payloads)
    outs = parallel(lambda q: sage.post("/generate", {**q, "sampling_params": params}), payloads)
    assert [o["output_ids"] for o in outs] == [r["output_ids"] for r in ref]
    for o in outs:
        [summary] = o["meta_info"]["sage"]
        assert summary["rounds"] + summary["off_steps"] == o["meta_info"]["spec_verify_ct"] >= 1
    accept = {p.modality: [] for p in prompts}
    for p, o in zip(prompts, outs):
        accept[p.modality].append(o["meta_info"]["spec_accept_length"])
    assert set(accept) == {"image", "video"} and all(sum(a) / len(a) > 1.0 for a in accept.values()), accept


def test_kv_pool_returns_to_its_starting_free_size(servers, kv_start):
    _, sage = servers
    info = kv_returns(sage, kv_start)
    assert info["kv_available_tokens"] == kv_start, (info, kv_start)
