"""Evaluation prompts bundled with the package, as chat messages.

The data lives in the demo distribution's ``data`` folder (:func:`data_dir`; ``demo/sage_plugin_demo/data`` in a
checkout; sources, licences and the one modified file are listed in its ``SOURCES.md``).  Five sets are available:

============  =====  ==========================================================================
dataset       count  user message (one turn, ``role="user"``)
============  =====  ==========================================================================
``mt_bench``     80  the FIRST turn of each MT-Bench question, verbatim; id = ``question_id``
``gsm8k``       200  the GSM8K question + ``"\\nAnswer step by step."`` (:data:`GSM8K_SUFFIX`);
                     id = ``"gsm8k/<line index>"``
``humaneval``   164  ``"Complete the following Python function.\\n\\n```python\\n"`` + the
                     HumanEval ``prompt`` + ``"```"`` (every ``prompt`` already ends with a
                     newline, so the fence closes on its own line); id = ``task_id``
``vlm``          24  the question ``text`` verbatim; :attr:`Prompt.image` is the image path
                     (absolute, resolved under ``data/vlm``); id = ``question_id``
``vlm-video``     6  the question ``text`` verbatim; :attr:`Prompt.video` is the clip's path (a
                     2 s MP4 under ``data/vlm/videos``); id = ``question_id``
============  =====  ==========================================================================

Besides, :func:`ood_prompts` reads the out-of-domain set (100 prompts of five task types unlike the bundled draft's
training data: summaries and questions over passages, translations, word problems, table questions; written for the
project, ``data/SOURCES.md``).

No system message is added: the tokenizer's chat template supplies its default one, if any.
Prompts come in file order and ``limit`` keeps the first N, so every call is deterministic::

    >>> [p.id for p in load_prompts("mt_bench", limit=3)]
    ['81', '82', '83']
    >>> [p.dataset for p in mixed_text_prompts(4)]
    ['mt_bench', 'gsm8k', 'humaneval', 'mt_bench']
"""

from __future__ import annotations

import base64
import functools
import json
import mimetypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..demo_assets import demo_path

__all__ = [
    "DATASETS",
    "TEXT_DATASETS",
    "GSM8K_SUFFIX",
    "HUMANEVAL_PREFIX",
    "HUMANEVAL_SUFFIX",
    "Prompt",
    "data_dir",
    "image_data_url",
    "load_prompt_file",
    "load_prompts",
    "mixed_text_prompts",
    "ood_prompts",
    "multimodal_messages",
    "openai_messages",
    "render_chat",
    "video_frame_urls",
]

DATASETS: tuple[str, ...] = ("mt_bench", "gsm8k", "humaneval", "vlm", "vlm-video")
"""Every dataset name :func:`load_prompts` accepts."""

TEXT_DATASETS: tuple[str, ...] = ("mt_bench", "gsm8k", "humaneval")
"""The text-only datasets, in the round-robin order of :func:`mixed_text_prompts`."""

GSM8K_SUFFIX = "\nAnswer step by step."
HUMANEVAL_PREFIX = "Complete the following Python function.\n\n```python\n"
HUMANEVAL_SUFFIX = "```"

# dataset -> file, relative to data_dir()
_FILES: dict[str, str] = {
    "mt_bench": "prompts/mt_bench.jsonl",
    "gsm8k": "prompts/gsm8k_200.jsonl",
    "humaneval": "prompts/humaneval.jsonl",
    "vlm": "vlm/questions.jsonl",
    "vlm-video": "vlm/video_questions.jsonl",
}


@dataclass(frozen=True, slots=True)
class Prompt:
    """One evaluation prompt.

    ``messages`` are chat messages (``{"role": ..., "content": str}``) ready for
    ``tokenizer.apply_chat_template``.  ``image`` is set for the ``vlm`` set only, ``video`` (a clip's path) for
    ``vlm-video`` only.
    ``completion_prefix`` (no bundled set uses it) is text the assistant turn should start with;
    :func:`render_chat` appends its tokens after the generation prompt.  ``category`` is the set's own label
    (MT-Bench's ``writing``, ``coding``, ...; a prompt file's ``category``), None where there is none.
    """

    id: str
    dataset: str
    messages: tuple[dict, ...]
    image: Path | None = None
    completion_prefix: str | None = None
    category: str | None = None
    video: Path | None = None

    @property
    def modality(self) -> str:
        """``"video"``, ``"image"`` or ``"text"``: what the prompt carries besides its text (reports group by it)."""
        return "video" if self.video is not None else "image" if self.image is not None else "text"


def data_dir() -> Path:
    """The demo distribution's ``data`` folder; :class:`~sage_plugin.demo_assets.DemoAssetsMissing` naming the
    install command when the demo is not installed."""
    return demo_path("data")


@functools.lru_cache(maxsize=None)
def _records(dataset: str) -> tuple[dict[str, Any], ...]:
    path = data_dir() / _FILES[dataset]
    with path.open(encoding="utf-8") as fh:
        return tuple(json.loads(line) for line in fh if line.strip())


def _user(content: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": content},)


def _make(dataset: str, index: int, rec: Mapping[str, Any]) -> Prompt:
    if dataset == "mt_bench":
        return Prompt(
            id=str(rec["question_id"]), dataset=dataset, messages=_user(rec["turns"][0]), category=rec.get("category")
        )
    if dataset == "gsm8k":
        return Prompt(id=f"gsm8k/{index}", dataset=dataset, messages=_user(rec["question"] + GSM8K_SUFFIX))
    if dataset == "humaneval":
        text = HUMANEVAL_PREFIX + rec["prompt"] + HUMANEVAL_SUFFIX
        return Prompt(id=str(rec["task_id"]), dataset=dataset, messages=_user(text))
    if dataset in ("vlm", "vlm-video"):
        media = {k: (data_dir() / "vlm" / rec[k]).resolve() for k in ("image", "video") if rec.get(k)}
        return Prompt(
            id=str(rec["question_id"]), dataset=dataset, messages=_user(rec["text"]), category=rec.get("category"),
            **media,
        )  # fmt: skip
    raise AssertionError(dataset)  # pragma: no cover - guarded by load_prompts


def load_prompts(dataset: str, limit: int | None = None) -> list[Prompt]:
    """Prompts of ``dataset`` (one of :data:`DATASETS`) in file order; ``limit`` keeps the first N.

    >>> load_prompts("humaneval", limit=1)[0].id
    'HumanEval/0'
    >>> load_prompts("squad")
    Traceback (most recent call last):
    ...
    ValueError: unknown dataset 'squad'; expected one of ('mt_bench', 'gsm8k', 'humaneval', 'vlm', 'vlm-video')
    """
    if dataset not in _FILES:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {DATASETS}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an integer >= 0, got {limit!r}")
    recs = _records(dataset)
    if limit is not None:
        recs = recs[:limit]
    return [_make(dataset, i, r) for i, r in enumerate(recs)]


def mixed_text_prompts(n: int) -> list[Prompt]:
    """``n`` text prompts taken round-robin from :data:`TEXT_DATASETS` (first items of each).

    Order: mt_bench[0], gsm8k[0], humaneval[0], mt_bench[1], ...  so ``n=20`` gives 7 mt_bench,
    7 gsm8k and 6 humaneval prompts.  A set that runs out is skipped; ``n`` larger than all text
    prompts together (444) raises ``ValueError``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    pools = [load_prompts(d, limit=n) for d in TEXT_DATASETS]
    total = sum(len(p) for p in pools)
    if n > total:
        raise ValueError(f"only {total} text prompts are bundled, asked for {n}")
    out: list[Prompt] = []
    i = 0
    while len(out) < n:
        for pool in pools:
            if i < len(pool) and len(out) < n:
                out.append(pool[i])
        i += 1
    return out


#: the out-of-domain prompt set, relative to data_dir() (built by tools/build_ood_prompts.py)
OOD_FILE = "prompts/ood_prompts.jsonl"


def ood_prompts(n: int | None = None) -> list[Prompt]:
    """The out-of-domain set's first ``n`` prompts (None: all 100), round-robin over its five categories in file order.

    >>> [p.category for p in ood_prompts(6)]
    ['summarization', 'rag', 'translation', 'math', 'table_qa', 'summarization']
    """
    by_category: dict[str | None, list[Prompt]] = {}
    for p in load_prompt_file(data_dir() / OOD_FILE):
        by_category.setdefault(p.category, []).append(p)
    ordered = [p for group in zip(*by_category.values(), strict=True) for p in group]
    return ordered if n is None else ordered[:n]


def multimodal_messages(prompt: Prompt) -> list[dict]:
    """``prompt.messages`` in the Hugging Face multimodal chat format, for VLM processors.

    The last user message's content becomes ``[{"type": "image", "path": ...}, {"type": "text",
    "text": ...}]`` (``"video"`` for a clip); prompts without media are returned as plain text parts.
    """
    msgs = [dict(m) for m in prompt.messages]
    for m in msgs:
        if isinstance(m.get("content"), str):
            m["content"] = [{"type": "text", "text": m["content"]}]
    if prompt.modality != "text":
        path = prompt.video if prompt.video is not None else prompt.image
        last_user = max(i for i, m in enumerate(msgs) if m.get("role") == "user")
        msgs[last_user]["content"] = [{"type": prompt.modality, "path": str(path)}, *msgs[last_user]["content"]]
    return msgs


def load_prompt_file(
    path: str | Path, limit: int | None = None, categories: Sequence[str] | None = None
) -> list[Prompt]:
    """Prompts of a JSONL file, one per line, in the Spec-Bench / MT-Bench question format.

    Each line is ``{"turns": [first, ...]}`` (the first turn is the prompt) or ``{"prompt": text}``, with optional
    ``"question_id"`` / ``"id"``, ``"category"`` and ``"image"`` (a path, relative to the file's folder, for VLM
    serving).  ``categories`` keeps only those categories; ``limit`` the first N that remain.

    Raises:
        ConfigError: an unreadable file or a line that is not such a record (the message names the line).
    """
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"--prompts {path}: cannot read the file ({exc.strerror or exc})") from None
    out: list[Prompt] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            text = rec["turns"][0] if "turns" in rec else rec["prompt"]
            if not isinstance(text, str) or not text:
                raise TypeError("the prompt is not a non-empty string")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ConfigError(
                f'--prompts {path}:{n}: expected {{"turns": [...]}} or {{"prompt": ...}} ({exc})'
            ) from None
        category = rec.get("category")
        if categories is not None and category not in categories:
            continue
        image = (path.parent / rec["image"]).resolve() if rec.get("image") else None
        rid = str(rec.get("question_id", rec.get("id", f"{path.stem}/{n}")))
        out.append(Prompt(id=rid, dataset=path.stem, messages=_user(text), image=image, category=category))
    if not out:
        raise ConfigError(f"--prompts {path}: no prompt" + (f" in categories {list(categories)}" if categories else ""))
    return out[:limit] if limit else out


def image_data_url(path: str | Path) -> str:
    """A ``data:`` URL with the file's bytes in base64 (the OpenAI API's inline ``image_url`` or ``video_url``).

    >>> image_data_url(data_dir() / "vlm" / "clevr_examples" / "images" / "img5.png")[:22]
    'data:image/png;base64,'
    """
    path = Path(path)
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def openai_messages(
    prompt: Prompt, images: Sequence[str | Path] = (), video_frames: int = 0, tag_multi_images: bool = False
) -> list[dict]:
    """``prompt.messages`` for ``/v1/chat/completions``: the last user turn gets a ``video_url`` part for
    ``prompt.video``, then ``image_url`` parts for ``prompt.image`` and ``images`` (base64 data URLs), before its
    text.

    For LLaVA-OneVision, whose SGLang 0.5.23 processor reads only the first image unless told otherwise:
    ``tag_multi_images`` marks each of several ``image_url`` parts ``"modalities": "multi-images"``, and
    ``video_frames=N`` sends the video as N of its frames (:func:`video_frame_urls`), ``image_url`` parts marked
    ``"modalities": "video"`` (how SGLang takes a LLaVA-OV video)."""
    msgs = [dict(m) for m in prompt.messages]
    parts: list[dict] = []
    if prompt.video is not None and video_frames:
        parts = [{"type": "image_url", "image_url": {"url": u}, "modalities": "video"}
                 for u in video_frame_urls(prompt.video, video_frames)]  # fmt: skip
    elif prompt.video is not None:
        parts = [{"type": "video_url", "video_url": {"url": image_data_url(prompt.video)}}]
    paths = ([prompt.image] if prompt.image is not None else []) + list(images)
    extra = {"modalities": "multi-images"} if tag_multi_images and len(paths) > 1 else {}
    parts += [{"type": "image_url", "image_url": {"url": image_data_url(p)}, **extra} for p in paths]
    if parts:
        last_user = max(i for i, m in enumerate(msgs) if m.get("role") == "user")
        msgs[last_user]["content"] = [*parts, {"type": "text", "text": msgs[last_user]["content"]}]
    return msgs


def video_frame_urls(path: str | Path, num_frames: int) -> list[str]:
    """``num_frames`` frames of the video at ``path``, evenly spaced from the first to the last, as PNG ``data:``
    URLs (decoded with torchcodec, which needs FFmpeg's libraries: ``tools/setup.sh``)."""
    import io

    import numpy as np
    from PIL import Image
    from torchcodec.decoders import VideoDecoder

    decoder = VideoDecoder(str(path), dimension_order="NHWC")
    idx = np.linspace(0, len(decoder) - 1, num_frames).round().astype(int).tolist()
    urls = []
    for frame in decoder.get_frames_at(idx).data.numpy():
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    return urls


def _as_int_list(out: Any) -> list[int]:
    if isinstance(out, Mapping) or hasattr(out, "keys"):  # dict / BatchEncoding (transformers 5.x)
        out = out["input_ids"]
    if hasattr(out, "tolist"):  # torch / numpy
        out = out.tolist()
    if isinstance(out, Sequence) and not isinstance(out, (str, bytes)) and out and not isinstance(out[0], int):
        # batched [[ids]]: a single conversation was rendered
        if len(out) != 1:
            raise ValueError(f"expected one rendered conversation, got {len(out)}")
        out = out[0]
        if hasattr(out, "tolist"):
            out = out.tolist()
    return [int(t) for t in out]


def render_chat(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Token ids of ``prompt`` under the tokenizer's chat template, with the generation prompt.

    Calls ``tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True,
    tokenize=True)`` and accepts every shape it returns (plain list, nested list, tensor, or the
    dict / ``BatchEncoding`` that transformers 5.x returns); the result is a plain ``list[int]``.
    If ``prompt.completion_prefix`` is set, its tokens (no special tokens) are appended.
    """
    out = tokenizer.apply_chat_template([dict(m) for m in prompt.messages], add_generation_prompt=True, tokenize=True)
    ids = _as_int_list(out)
    if prompt.completion_prefix:
        ids += _as_int_list(tokenizer.encode(prompt.completion_prefix, add_special_tokens=False))
    return ids
