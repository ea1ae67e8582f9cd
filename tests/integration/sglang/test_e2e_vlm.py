"""End to end on CPU: SGLang serves a VLM with ``--speculative-algorithm sage``, image prompts over the OpenAI API.

The target is Qwen2-VL whose language model is the real SmolLM2-135M-Instruct (tiny random vision tower, built once
offline: ``sage_plugin.engines.vlm.qwen_smollm2``); the draft is the bundled SmolLM2 draft padded to the target's
vocabulary, reading one placeholder id per image position.  Two servers (plain decoding and SAGE, from
``engine_configs/sglang/qwen2_vl_smollm2_cpu_sage.yaml``) get the same requests: bundled licensed images as base64
``image_url`` parts in ``/v1/chat/completions``, text-only requests mixed in, two images in one request, and broken
images.  Greedy outputs must be identical; a bad image is a 400 and the server goes on serving; the KV pool returns
to its starting size.  Qwen2.5-VL gets the same identity check on fewer image prompts and on video prompts.
"""

from __future__ import annotations

import base64

import pytest

pytest.importorskip("sglang")

from sage_plugin.bench.serving import Server, parallel  # noqa: E402
from sage_plugin.data.prompts import load_prompts, mixed_text_prompts, openai_messages  # noqa: E402

from .conftest import REPO  # noqa: E402
from .mm_client import answer, bad_media, chat, kv_returns, launch_pair, serving_pair  # noqa: E402

pytestmark = pytest.mark.slow

CONFIGS = {
    "qwen2_vl": REPO / "engine_configs" / "sglang" / "qwen2_vl_smollm2_cpu_sage.yaml",
    "qwen2_5_vl": REPO / "engine_configs" / "sglang" / "qwen2_5_vl_smollm2_cpu_sage.yaml",
}


def _models(kind: str):
    from sage_plugin.engines.vlm import ensure_qwen_vl_smollm2

    return (CONFIGS[kind], *ensure_qwen_vl_smollm2(kind))


@pytest.fixture(scope="module")
def servers(launch_env, target_dir, tmp_path_factory):
    yield from serving_pair(launch_env, tmp_path_factory.mktemp("vlm_logs"), *_models("qwen2_vl"))


def test_image_prompts_equal_plain_serving(servers, kv_start):
    plain, sage = servers
    msgs = [openai_messages(p) for p in load_prompts("vlm", 6)]
    ref = parallel(lambda m: chat(plain, m), msgs)
    got = parallel(lambda m: chat(sage, m), msgs)
    assert [answer(g) for g in got] == [answer(r) for r in ref]
    assert all(g["usage"]["prompt_tokens_details"]["image_tokens"] > 0 for g in got)


def test_text_and_image_requests_in_one_batch_equal_plain(servers, kv_start):
    plain, sage = servers
    vlm = [openai_messages(p) for p in load_prompts("vlm", 4)]
    text = [p.messages for p in mixed_text_prompts(4)]
    mixed = [m for pair in zip(vlm, text) for m in pair]
    ref = parallel(lambda m: chat(plain, m), mixed)
    got = parallel(lambda m: chat(sage, m), mixed)
    assert [answer(g) for g in got] == [answer(r) for r in ref]


def test_two_images_in_one_request(servers, kv_start):
    plain, sage = servers
    first, second = load_prompts("vlm", 2)
    msgs = openai_messages(first, images=[second.image])
    one = chat(sage, openai_messages(first))
    ref, got = chat(plain, msgs), chat(sage, msgs)
    assert answer(got) == answer(ref)
    two_images = got["usage"]["prompt_tokens_details"]["image_tokens"]
    assert two_images > one["usage"]["prompt_tokens_details"]["image_tokens"] > 0


def test_sage_rounds_and_acceptance_on_image_prompts(servers, kv_start):
    """The native /generate API with ``image_data`` reports SAGE's per-request summary and SGLang's accept length."""
    from transformers import AutoProcessor

    from sage_plugin.data.prompts import image_data_url, multimodal_messages
    from sage_plugin.engines.vlm import ensure_qwen_vl_smollm2

    _, sage = servers
    processor = AutoProcessor.from_pretrained(str(ensure_qwen_vl_smollm2("qwen2_vl")[0]))
    prompts = load_prompts("vlm", 4)
    texts = [processor.apply_chat_template(multimodal_messages(p), add_generation_prompt=True, tokenize=False)
             for p in prompts]  # fmt: skip
    params = {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}  # decode rounds even if it would stop
    outs = parallel(lambda i: sage.post("/generate", {"text": texts[i], "sampling_params": params,
                                                      "image_data": [image_data_url(prompts[i].image)]}), range(4))  # fmt: skip
    for o in outs:
        meta = o["meta_info"]
        [summary] = meta["sage"]
        assert summary["rounds"] + summary["off_steps"] == meta["spec_verify_ct"] >= 1
        assert meta["prompt_tokens"] > 40  # the image's tokens are in the prompt
    assert sum(o["meta_info"]["spec_accept_length"] for o in outs) / len(outs) > 1.0


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("data:image/png;base64," + base64.b64encode(b"not an image at all" * 10).decode(), "unreadable bytes"),
        ("data:image/png;base64,@@@not-base64@@@", "broken base64"),
        ("data:text/plain;base64," + base64.b64encode(b"hello").decode(), "not an image type"),
    ],
)
def test_bad_images_are_a_400_and_the_server_keeps_serving(servers, kv_start, url, what):
    status, body, after, plain_after = bad_media(*servers, {"type": "image_url", "image_url": {"url": url}})
    assert status == 400, (what, status, body[:500])
    assert after == plain_after


def test_kv_pool_returns_to_its_starting_free_size(servers, kv_start):
    _, sage = servers
    info = kv_returns(sage, kv_start)
    assert info["kv_available_tokens"] == kv_start, (info, kv_start)


def test_a_multimodal_draft_is_refused_before_the_server_starts(launch_env, tmp_path):
    """A Qwen2-VL draft of the target's width (SmolLM2's first 4 layers) stops the launch with one clear message:
    SGLang 0.5.23 misplaces a multimodal draft's image embeddings in its draft prefill (its own STANDALONE fails at
    the first image the same way), so only text drafts serve VLMs."""
    from sage_plugin.engines.vlm import ensure_qwen_vl_draft, ensure_qwen_vl_smollm2

    target, _ = ensure_qwen_vl_smollm2("qwen2_vl")
    with pytest.raises(RuntimeError, match=r"(?s)server exited with 1:.*a multimodal draft .*use a text draft"):
        Server(["--config", str(CONFIGS["qwen2_vl"]), "--model-path", str(target),
                "--speculative-draft-model-path", str(ensure_qwen_vl_draft("qwen2_vl"))],
               launch_env, tmp_path / "vlm-draft.log")  # fmt: skip


def test_qwen2_5_vl_image_and_video_prompts_equal_plain(launch_env, target_dir, tmp_path):
    """Qwen2.5-VL with tiers (a probe every 2 steps cycles them): drafted steps and speculation-off steps, whose
    forward runs as a DECODE forward (off_decode.py) with the M-RoPE positions of the verify it replaces; drafted steps
    verify ragged (``--sage-ragged-verify``, off in the VLM configs: the live rows' M-RoPE positions, ragged_verify.py).
    Image prompts and video prompts (bundled 2 s clips as base64 ``video_url`` parts: the draft reads one placeholder
    id per video position, as per image position)."""
    tiers = ("--sage-tiers", "[[0, 1], [1, 2], [3, 4]]", "--sage-tier-probe-every", "2", "--sage-ragged-verify", "true")
    plain, sage = launch_pair(launch_env, tmp_path, *_models("qwen2_5_vl"), *tiers)
    try:
        msgs = [openai_messages(p) for p in load_prompts("vlm", 3) + load_prompts("vlm-video", 2)]
        ref = parallel(lambda m: chat(plain, m), msgs)
        got = parallel(lambda m: chat(sage, m), msgs)
        info = sage.get("/server_info")
    finally:
        sage.stop()
        plain.stop()
    assert [answer(g) for g in got] == [answer(r) for r in ref]
    assert [g["usage"]["prompt_tokens_details"].get("video_tokens", 0) > 0 for g in got] == [False] * 3 + [True] * 2
    state = info["internal_states"][0]["sage"]
    assert state["sage_rounds"] > 0 and state["off_decode_steps"] > 0, state
    ragged = state["ragged_verify"]  # steps verified on their live rows only, some rows dropped
    assert ragged["steps"] > 0 and 0 < ragged["rows"] < ragged["rows_drafted"], state
