"""End to end on CPU: SGLang serves LLaVA-OneVision in lmms-lab's format (``LlavaQwenForCausalLM``, the architecture of
``engine_configs/sglang/llava_ov_72b_7b_draft_sage.yaml``'s 72B target) with ``--speculative-algorithm sage``.

The target is the demo LLaVA-OV whose language model is the real SmolLM2-135M-Instruct (tiny random SigLIP tower,
built once offline: ``sage_plugin.engines.vlm.llava_smollm2``); the draft is the bundled SmolLM2 draft padded to the
target's vocabulary (a standalone draft, as SGLang's llava.py captures no EAGLE-3 layers).  It serves only with the
plugin's three LLaVA hooks (``runtimes/sglang/llava_compat.py``: transformers 5 sub-configs, one dtype, verify
forwards).  Two servers (plain and SAGE from ``llava_ov_smollm2_cpu_sage.yaml``, with its tiers) get the same
requests: one image (SGLang's anyres path: a base tile, the best grid of tiles unpadded, a newline token per row),
two images (``multi-images``: one tile each), a video as 8 frames (``"modalities": "video"``: frames pooled 2x2)
and text.  Greedy outputs must be identical, SAGE must draft, a broken image is a 400 with the server serving on, and
the KV pool returns to its starting size.
"""

from __future__ import annotations

import base64

import pytest

pytest.importorskip("sglang")

from sage_plugin.bench.serving import parallel  # noqa: E402
from sage_plugin.data.prompts import load_prompts, mixed_text_prompts, openai_messages  # noqa: E402

from .conftest import REPO  # noqa: E402
from .mm_client import answer, bad_media, chat, kv_returns, serving_pair  # noqa: E402

pytestmark = pytest.mark.slow

CONFIG = REPO / "engine_configs" / "sglang" / "llava_ov_smollm2_cpu_sage.yaml"


@pytest.fixture(scope="module")
def servers(launch_env, target_dir, tmp_path_factory):
    from sage_plugin.engines.vlm import ensure_llava_ov_smollm2

    target, draft = ensure_llava_ov_smollm2()
    logs = tmp_path_factory.mktemp("llava_ov_logs")
    yield from serving_pair(launch_env, logs, CONFIG, target, draft)


def test_image_multi_image_video_and_text_prompts_equal_plain(servers, kv_start):
    from transformers import AutoTokenizer

    from sage_plugin.engines.vlm import ensure_llava_ov_smollm2

    plain, sage = servers
    first, second, third = load_prompts("vlm", 3)
    msgs = [
        openai_messages(first),
        openai_messages(third),
        openai_messages(first, images=[second.image], tag_multi_images=True),
        *[openai_messages(p, video_frames=8) for p in load_prompts("vlm-video", 2)],
        mixed_text_prompts(1)[0].messages,
    ]
    ref = parallel(lambda m: chat(plain, m), msgs)
    got = parallel(lambda m: chat(sage, m), msgs)
    assert [answer(g) for g in got] == [answer(r) for r in ref]
    # each medium's visual tokens are in the prompt: anyres (a base tile of 16 and more), two pad-mode tiles of 16,
    # 8 frames of at least 4 pooled tokens (the template adds tokens, never removes any)
    tok = AutoTokenizer.from_pretrained(str(ensure_llava_ov_smollm2()[0]))
    questions = [len(tok(m[-1]["content"][-1]["text"]).input_ids) for m in msgs[:-1]]
    visual = [g["usage"]["prompt_tokens"] - q for g, q in zip(got, questions)]
    assert all(v >= least for v, least in zip(visual, [16, 16, 32, 32, 32])), visual
    state = sage.get("/server_info")["internal_states"][0]["sage"]
    assert state["sage_rounds"] > 0, state


def test_bad_image_is_a_400_and_the_server_keeps_serving(servers, kv_start):
    url = "data:image/png;base64," + base64.b64encode(b"not an image at all" * 10).decode()
    status, body, after, plain_after = bad_media(*servers, {"type": "image_url", "image_url": {"url": url}})
    assert status == 400, (status, body[:500])
    assert after == plain_after


def test_kv_pool_returns_to_its_starting_free_size(servers, kv_start):
    _, sage = servers
    info = kv_returns(sage, kv_start)
    assert info["kv_available_tokens"] == kv_start, (info, kv_start)


def test_the_72b_config_takes_the_same_architecture_path():
    """The demo's architecture is lmms-lab's, which SGLang's registry resolves to the class the LLaVA hooks wrap; the
    shipped 72B config serves an lmms-lab checkpoint of that family with the chat template the demo config uses."""
    import json

    import yaml
    from sglang.srt.models.llava import LlavaQwenForCausalLM
    from sglang.srt.models.registry import ModelRegistry

    from sage_plugin.engines.vlm import ensure_llava_ov_smollm2
    from sage_plugin.engines.vlm.llava_smollm2 import LLAVA_OV_ARCHITECTURE
    from sage_plugin.runtimes.sglang.llava_compat import LLAVA_QWEN_INIT

    target, _ = ensure_llava_ov_smollm2()
    assert json.loads((target / "config.json").read_text())["architectures"] == [LLAVA_OV_ARCHITECTURE]
    cls, _ = ModelRegistry.resolve_model_cls([LLAVA_OV_ARCHITECTURE])
    assert cls is LlavaQwenForCausalLM and LLAVA_QWEN_INIT.endswith(f"{cls.__name__}.__init__")
    shipped = yaml.safe_load((REPO / "engine_configs" / "sglang" / "llava_ov_72b_7b_draft_sage.yaml").read_text())
    demo = yaml.safe_load(CONFIG.read_text())
    assert shipped["model-path"].startswith("lmms-lab/llava-onevision-qwen2-")
    assert shipped["chat-template"] == demo["chat-template"] == "chatml-llava"
