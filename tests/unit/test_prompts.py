"""Bundled evaluation prompts and images (the demo's data, demo/sage_plugin_demo/data) and their loaders."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from sage_plugin.data.prompts import (
    DATASETS,
    GSM8K_SUFFIX,
    HUMANEVAL_PREFIX,
    TEXT_DATASETS,
    Prompt,
    data_dir,
    load_prompts,
    mixed_text_prompts,
    multimodal_messages,
    render_chat,
)

EXPECTED_COUNTS = {"mt_bench": 80, "gsm8k": 200, "humaneval": 164, "vlm": 24, "vlm-video": 6}
SMOLLM2_DIR = Path.home() / ".cache" / "sage_plugin" / "smollm2-135m-instruct-f32"
BUDGET_BYTES = 5_000_000


def test_dataset_names():
    assert DATASETS == ("mt_bench", "gsm8k", "humaneval", "vlm", "vlm-video")
    assert TEXT_DATASETS == ("mt_bench", "gsm8k", "humaneval")
    assert set(TEXT_DATASETS) < set(DATASETS)


@pytest.mark.parametrize("dataset", DATASETS)
def test_every_dataset_loads_with_expected_count(dataset):
    prompts = load_prompts(dataset)
    assert len(prompts) == EXPECTED_COUNTS[dataset]
    for p in prompts:
        assert isinstance(p, Prompt)
        assert p.dataset == dataset
        assert isinstance(p.id, str) and p.id
        assert isinstance(p.messages, tuple) and len(p.messages) == 1
        (msg,) = p.messages
        assert msg["role"] == "user"
        assert isinstance(msg["content"], str) and msg["content"].strip()
        assert p.completion_prefix is None
        assert (p.image is not None) == (dataset == "vlm")
        assert (p.video is not None) == (dataset == "vlm-video")
        assert p.modality == {"vlm": "image", "vlm-video": "video"}.get(dataset, "text")


@pytest.mark.parametrize("dataset", DATASETS)
def test_ids_unique(dataset):
    ids = [p.id for p in load_prompts(dataset)]
    assert len(ids) == len(set(ids))


def test_text_ids_unique_across_sets():
    ids = [p.id for d in TEXT_DATASETS for p in load_prompts(d)]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("dataset", DATASETS)
def test_limit_takes_first_n_and_is_deterministic(dataset):
    full = load_prompts(dataset)
    assert load_prompts(dataset, limit=5) == full[:5]
    assert load_prompts(dataset, limit=0) == []
    assert load_prompts(dataset, limit=10_000) == full
    assert load_prompts(dataset) == full


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown dataset"):
        load_prompts("squad")
    with pytest.raises(ValueError):
        load_prompts("gsm8k", limit=-1)
    with pytest.raises(ValueError):
        mixed_text_prompts(-1)
    with pytest.raises(ValueError):
        mixed_text_prompts(sum(EXPECTED_COUNTS[d] for d in TEXT_DATASETS) + 1)


def _jsonl(rel: str) -> list[dict]:
    with (data_dir() / rel).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_mt_bench_uses_first_turn():
    raw = _jsonl("prompts/mt_bench.jsonl")
    prompts = load_prompts("mt_bench")
    assert [p.id for p in prompts] == [str(r["question_id"]) for r in raw]
    assert [p.messages[0]["content"] for p in prompts] == [r["turns"][0] for r in raw]
    assert prompts[0].id == "81" and prompts[-1].id == "160"


def test_gsm8k_message_format():
    raw = _jsonl("prompts/gsm8k_200.jsonl")
    prompts = load_prompts("gsm8k")
    assert [p.messages[0]["content"] for p in prompts] == [r["question"] + GSM8K_SUFFIX for r in raw]
    assert GSM8K_SUFFIX == "\nAnswer step by step."
    assert prompts[0].id == "gsm8k/0"


def test_humaneval_message_format():
    raw = _jsonl("prompts/humaneval.jsonl")
    prompts = load_prompts("humaneval")
    assert [p.id for p in prompts] == [r["task_id"] for r in raw]
    for p, r in zip(prompts, raw, strict=True):
        text = p.messages[0]["content"]
        assert text == "Complete the following Python function.\n\n```python\n" + r["prompt"] + "```"
        assert text.startswith(HUMANEVAL_PREFIX)
        assert text.endswith("\n```")  # every HumanEval prompt ends with a newline


def test_vlm_prompts_and_images():
    from PIL import Image

    raw = _jsonl("vlm/questions.jsonl")
    prompts = load_prompts("vlm")
    vlm_root = (data_dir() / "vlm").resolve()
    assert [p.id for p in prompts] == [str(r["question_id"]) for r in raw]
    for p, r in zip(prompts, raw, strict=True):
        assert p.messages[0]["content"] == r["text"]
        assert p.image is not None and p.image.is_absolute()
        assert p.image == (vlm_root / r["image"]).resolve()
        assert p.image.is_relative_to(vlm_root)
        assert p.image.is_file()
    for path in sorted({p.image for p in prompts}):
        with Image.open(path) as im:
            im.verify()
        with Image.open(path) as im:
            im.load()
            assert im.width > 0 and im.height > 0
    assert Counter(r["category"] for r in raw) == {"detail": 12, "clevr_vqa": 5, "open_ended": 7}
    assert len({p.image for p in prompts}) == 12


def test_downscaled_clevr_example_size():
    from PIL import Image

    with Image.open(data_dir() / "vlm" / "clevr_examples" / "images" / "example1080.png") as im:
        assert im.size in {(640, 360), (1920, 1080)}  # 640x360 when downscaled for the size budget


def test_multimodal_messages():
    p = load_prompts("vlm", limit=1)[0]
    (msg,) = multimodal_messages(p)
    assert msg["role"] == "user"
    assert msg["content"] == [
        {"type": "image", "path": str(p.image)},
        {"type": "text", "text": p.messages[0]["content"]},
    ]
    assert p.messages[0]["content"] == load_prompts("vlm", limit=1)[0].messages[0]["content"]  # not mutated
    t = load_prompts("gsm8k", limit=1)[0]
    assert multimodal_messages(t)[0]["content"] == [{"type": "text", "text": t.messages[0]["content"]}]
    v = load_prompts("vlm-video", limit=1)[0]
    assert multimodal_messages(v)[0]["content"][0] == {"type": "video", "path": str(v.video)}


LICENCE_FILES = {
    "prompts": ["LICENSE.mt_bench", "LICENSE.gsm8k", "LICENSE.humaneval"],
    "vlm/clevr_examples": ["LICENSE", "README_excerpt.md"],
    "vlm/skimage_photos": ["LICENSE.txt", "IMAGE_PROVENANCE.txt"],
    "vlm/videos": ["README.md"],
}


@pytest.mark.parametrize("folder", sorted(LICENCE_FILES))
def test_licence_files_next_to_each_set(folder):
    for name in LICENCE_FILES[folder]:
        path = data_dir() / folder / name
        assert path.is_file(), path
        assert path.stat().st_size > 0


def test_licence_texts():
    d = data_dir()
    assert "Apache License" in (d / "prompts/LICENSE.mt_bench").read_text()
    assert "Copyright (c) 2021 OpenAI" in (d / "prompts/LICENSE.gsm8k").read_text()
    assert "Copyright (c) OpenAI" in (d / "prompts/LICENSE.humaneval").read_text()
    assert "Facebook, Inc." in (d / "vlm/clevr_examples/LICENSE").read_text()
    assert "public domain" in (d / "vlm/skimage_photos/IMAGE_PROVENANCE.txt").read_text()


def test_sources_md_lists_every_file_and_budget():
    d = data_dir()
    sources = (d / "SOURCES.md").read_text(encoding="utf-8")
    files = [p for p in d.rglob("*") if p.is_file()]
    for p in files:
        rel = p.relative_to(d).as_posix()
        if rel == "SOURCES.md":
            continue
        # a row names the file, or (for licence files / numbered images) its folder + name
        assert p.name in sources or rel in sources or p.stem.rstrip("0123456789") in sources, rel
    assert "downscaled" in sources
    assert (d / "vlm" / "README.md").is_file()
    assert sum(p.stat().st_size for p in files) < BUDGET_BYTES


def test_mixed_text_prompts_composition():
    mixed = mixed_text_prompts(20)
    assert len(mixed) == 20
    assert Counter(p.dataset for p in mixed) == {"mt_bench": 7, "gsm8k": 7, "humaneval": 6}
    assert [p.dataset for p in mixed[:6]] == list(TEXT_DATASETS) * 2
    for d in TEXT_DATASETS:
        got = [p for p in mixed if p.dataset == d]
        assert got == load_prompts(d, limit=len(got))
    assert mixed_text_prompts(20) == mixed
    assert mixed_text_prompts(0) == []
    assert len({(p.dataset, p.id) for p in mixed}) == 20


def test_mixed_text_prompts_all():
    n = sum(EXPECTED_COUNTS[d] for d in TEXT_DATASETS)
    mixed = mixed_text_prompts(n)
    assert Counter(p.dataset for p in mixed) == {d: EXPECTED_COUNTS[d] for d in TEXT_DATASETS}


class _FakeTokenizer:
    def __init__(self, result):
        self.result = result
        self.calls = []

    def apply_chat_template(self, messages, **kw):
        self.calls.append((messages, kw))
        return self.result

    def encode(self, text, add_special_tokens=True):
        return [900 + i for i, _ in enumerate(text)]


@pytest.mark.parametrize(
    "result",
    [[1, 2, 3], [[1, 2, 3]], {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1]}, {"input_ids": [[1, 2, 3]]}],
)
def test_render_chat_accepts_every_return_shape(result):
    tok = _FakeTokenizer(result)
    p = load_prompts("mt_bench", limit=1)[0]
    ids = render_chat(tok, p)
    assert ids == [1, 2, 3] and all(type(t) is int for t in ids)
    (messages, kw) = tok.calls[0]
    assert messages == list(p.messages)
    assert kw == {"add_generation_prompt": True, "tokenize": True}


def test_render_chat_tensor_and_completion_prefix():
    torch = pytest.importorskip("torch")
    p = Prompt(id="x", dataset="t", messages=({"role": "user", "content": "hi"},), completion_prefix="ab")
    ids = render_chat(_FakeTokenizer(torch.tensor([[5, 6]])), p)
    assert ids == [5, 6, 900, 901] and all(type(t) is int for t in ids)


def test_render_chat_real_smollm2_tokenizer():
    if not SMOLLM2_DIR.is_dir():
        pytest.skip(f"SmolLM2 tokenizer not found at {SMOLLM2_DIR}")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(SMOLLM2_DIR))
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    assert isinstance(im_start, int) and im_start != tok.unk_token_id
    for p in mixed_text_prompts(6) + load_prompts("vlm", limit=1):
        ids = render_chat(tok, p)
        assert isinstance(ids, list) and ids and all(type(t) is int for t in ids)
        assert ids[0] == im_start
        text = tok.decode(ids)
        assert text.startswith("<|im_start|>")
        assert p.messages[0]["content"] in text
        assert text.endswith("<|im_start|>assistant\n")


def test_prompt_file_formats_categories_and_images(tmp_path):
    from sage_plugin.data.prompts import load_prompt_file

    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(b"png")
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"question_id": 7, "category": "writing", "turns": ["Write a haiku.", "Another one."]}\n'
        "\n"
        '{"prompt": "What is 2 + 2?", "category": "math"}\n'
        '{"id": "v1", "prompt": "Describe it.", "image": "img/a.png"}\n'
    )
    got = load_prompt_file(path)
    assert [p.id for p in got] == ["7", "mine/3", "v1"]
    assert got[0].messages == ({"role": "user", "content": "Write a haiku."},)  # the first turn
    assert [p.category for p in got] == ["writing", "math", None]
    assert got[2].image == (tmp_path / "img" / "a.png").resolve() and got[0].image is None
    assert [p.id for p in load_prompt_file(path, categories=["math"])] == ["mine/3"]
    assert len(load_prompt_file(path, limit=2)) == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [("not json\n", ":1: expected"), ('{"turns": []}\n', ":1: expected"), ('{"prompt": ""}\n{"x": 1}\n', ":1:"),
     ('{"prompt": "a", "category": "c"}\n', "no prompt in categories")],
)  # fmt: skip
def test_prompt_file_errors_name_the_line(tmp_path, text, message):
    from sage_plugin.config import ConfigError
    from sage_plugin.data.prompts import load_prompt_file

    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_prompt_file(path, categories=["other"] if "categories" in message else None)


def test_openai_messages_put_images_before_the_text():
    from sage_plugin.data.prompts import openai_messages

    first, second = load_prompts("vlm", 2)
    msgs = openai_messages(first, images=[second.image])
    parts = msgs[-1]["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert parts[2]["text"] == first.messages[-1]["content"]
    assert (
        openai_messages(load_prompts("mt_bench", 1)[0])[0]["content"]
        == load_prompts("mt_bench", 1)[0].messages[0]["content"]
    )


def test_video_prompts_and_clips():
    """Every video prompt names a bundled MP4 clip (its ``ftyp`` box) that videos/README.md lists with the photo it
    was made from; ``openai_messages`` sends it as a base64 ``video_url`` part before the text."""
    from sage_plugin.data.prompts import openai_messages

    readme = (data_dir() / "vlm" / "videos" / "README.md").read_text()
    prompts = load_prompts("vlm-video")
    for p in prompts:
        assert p.video.is_relative_to((data_dir() / "vlm" / "videos").resolve()) and p.video.suffix == ".mp4"
        assert p.video.read_bytes()[4:8] == b"ftyp"
        assert p.video.name in readme
    parts = openai_messages(prompts[0])[-1]["content"]
    assert [q["type"] for q in parts] == ["video_url", "text"]
    assert parts[0]["video_url"]["url"].startswith("data:video/mp4;base64,")
