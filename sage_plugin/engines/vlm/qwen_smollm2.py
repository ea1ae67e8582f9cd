"""Qwen2-VL / Qwen2.5-VL whose language model is the real SmolLM2-135M-Instruct: a VLM SGLang can serve on CPU.

SGLang 0.5.23 has Qwen2-VL and Qwen2.5-VL models but no SmolVLM (Idefics3).  Qwen2's language model is Llama's plus
biases on q/k/v, and M-RoPE reduces to ordinary 1-D RoPE for text tokens (the three position axes are equal), so a
Qwen-VL checkpoint carrying SmolLM2's weights (zero q/k/v biases, SmolLM2's rope theta 1e5, the head's 32 rotary
frequencies split 8 / 12 / 12 over the temporal / height / width axes) continues text exactly as SmolLM2 does,
and gives real text after image tokens.  The vision tower is tiny and random (built offline, deterministic from
``seed``), so answers about an image are not about its content; what matters here is serving the multimodal path.

Vocabulary: the four Qwen-VL special tokens are appended to SmolLM2's 49,152 (ids 49152-49155) with the mean
embedding, so they never win the tied LM head's argmax.  SGLang fills the image positions of a prompt with hash
values and clamps them to ``vocab_size - 1`` in place before the draft runs its prefill, so a standalone text draft
must embed ids up to 49155: :func:`build_vlm_text_draft` pads a SmolLM2 draft's vocabulary the same way.

The bundled SmolLM2 EAGLE-3 head drafts for these targets too (SGLang's ``SAGE_EAGLE3``: the target captures three
of SmolLM2's layers, which the head was trained on): :func:`build_vlm_eagle3_head` gives it the target's vocabulary
size (it shares the target's embedding; its own reduced head and ``d2t`` map stay) and the target's M-RoPE section,
so SGLang's ``LlamaForCausalLMEagle3`` reads the multimodal M-RoPE positions as a Qwen2.5-VL EAGLE-3 head does.

Example (what :func:`ensure_qwen_vl_smollm2` and :func:`ensure_qwen_vl_eagle3` do, once per cache)::

    target = build_qwen_vl_smollm2(ensure_smollm2(), cache / "qwen2-vl-smollm2-135m", kind="qwen2_vl")
    draft = build_vlm_text_draft(require_bundled("smollm2-draft"), target, cache / "smollm2-draft-for-qwen-vl")
    head = build_vlm_eagle3_head(require_bundled("smollm2-eagle3"), target, cache / "smollm2-eagle3-for-qwen2-vl")
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from sage_plugin.models import (
    DEFAULT_CACHE_DIR,
    ensure_smollm2,
    require_bundled,
    truncated_draft,
)

__all__ = [
    "mrope_section",
    "QWEN_VL_KINDS",
    "QWEN_VL_TOKENS",
    "build_qwen_vl_smollm2",
    "build_vlm_eagle3_head",
    "build_vlm_text_draft",
    "ensure_qwen_vl_eagle3",
    "ensure_qwen_vl_smollm2",
    "ensure_qwen_vl_draft",
]

QWEN_VL_KINDS: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl")

#: the special tokens Qwen-VL processors need, appended in this order (ids 49152.. on SmolLM2's vocabulary)
QWEN_VL_TOKENS: tuple[str, ...] = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def mrope_section(head_dim: int) -> list[int]:
    """The head's ``head_dim / 2`` rotary frequencies split over M-RoPE's temporal / height / width axes, in Qwen2-VL's
    proportions (1/4, then the rest halved).  Any split gives 1-D RoPE for text tokens (the three axes are equal).

    >>> mrope_section(64)
    [8, 12, 12]
    """
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n" + _SYSTEM + "<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}"
    "{% if c['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] in ('video', 'video_url') %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _vision_config(kind: str, text_hidden: int) -> dict:
    """A tiny vision tower whose merger outputs ``text_hidden``; ``in_chans`` is written besides ``in_channels``
    (SGLang's qwen2_vl.py reads it)."""
    common = dict(patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3, in_chans=3)
    if kind == "qwen2_vl":
        return dict(depth=2, embed_dim=32, hidden_size=text_hidden, num_heads=2, mlp_ratio=2, **common)
    return dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text_hidden, window_size=56,
        fullatt_block_indexes=[1], **common,
    )  # fmt: skip


def _processor(kind: str, tok):
    import transformers as tf
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    small = dict(min_pixels=56 * 56, max_pixels=112 * 112)  # at most 16 visual tokens per image
    cls = tf.Qwen2VLProcessor if kind == "qwen2_vl" else tf.Qwen2_5_VLProcessor
    return cls(
        image_processor=Qwen2VLImageProcessor(**small),
        video_processor=Qwen2VLVideoProcessor(**small),
        tokenizer=tok,
        chat_template=_CHAT_TEMPLATE,
    )


def _config(kind: str, lm_cfg, tok):
    import transformers as tf

    ids = {name: tok.convert_tokens_to_ids(t) for name, t in zip(
        ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"), QWEN_VL_TOKENS
    )}  # fmt: skip
    head_dim = getattr(lm_cfg, "head_dim", None) or lm_cfg.hidden_size // lm_cfg.num_attention_heads
    rope = {"rope_type": "default", "mrope_section": mrope_section(head_dim),
            "rope_theta": lm_cfg.rope_parameters["rope_theta"]}  # fmt: skip
    text = dict(
        vocab_size=len(tok),
        hidden_size=lm_cfg.hidden_size,
        intermediate_size=lm_cfg.intermediate_size,
        num_hidden_layers=lm_cfg.num_hidden_layers,
        num_attention_heads=lm_cfg.num_attention_heads,
        num_key_value_heads=lm_cfg.num_key_value_heads,
        rms_norm_eps=lm_cfg.rms_norm_eps,
        max_position_embeddings=lm_cfg.max_position_embeddings,
        hidden_act=lm_cfg.hidden_act,
        tie_word_embeddings=True,
        rope_parameters=rope,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    cls = tf.Qwen2VLConfig if kind == "qwen2_vl" else tf.Qwen2_5_VLConfig
    cfg = cls(text_config=text, vision_config=_vision_config(kind, lm_cfg.hidden_size), tie_word_embeddings=True, **ids)
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    return cls, cfg


def _model_class(kind: str):
    import transformers as tf

    return tf.Qwen2VLForConditionalGeneration if kind == "qwen2_vl" else tf.Qwen2_5_VLForConditionalGeneration


def _pad_rows(weight: torch.Tensor, n_old: int) -> None:
    """New rows (``n_old:``) = the mean old row: a neutral input and a logit that never wins."""
    with torch.no_grad():
        weight[n_old:] = weight[:n_old].mean(0, keepdim=True)


def _save(out_dir: Path, save) -> Path:
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def _patch_vision_config(out_dir: Path) -> None:
    """transformers 5 drops unknown vision-config keys on save: write ``in_chans`` back for SGLang."""
    path = out_dir / "config.json"
    cfg = json.loads(path.read_text())
    cfg["vision_config"]["in_chans"] = cfg["vision_config"].get("in_channels", 3)
    path.write_text(json.dumps(cfg, indent=2))


def build_qwen_vl_smollm2(text_model_dir: Path, out_dir: Path, kind: str = "qwen2_vl", seed: int = 0) -> Path:
    """Qwen2-VL (``kind="qwen2_vl"``) or Qwen2.5-VL (``"qwen2_5_vl"``) with SmolLM2's language model, saved with an
    offline processor.  Deterministic; skips the build when ``out_dir/config.json`` exists."""
    import transformers as tf

    if kind not in QWEN_VL_KINDS:
        raise ValueError(f"unknown Qwen-VL kind {kind!r}; expected one of {QWEN_VL_KINDS}")
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    tok = tf.AutoTokenizer.from_pretrained(str(text_model_dir))
    tok.add_special_tokens({"additional_special_tokens": list(QWEN_VL_TOKENS)})
    lm = tf.AutoModelForCausalLM.from_pretrained(str(text_model_dir), dtype=torch.float32)
    cls, cfg = _config(kind, lm.config, tok)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model_class(kind)(cfg).eval()
    n_old = lm.config.vocab_size
    state = {f"language_model.{k[len('model.') :]}": v for k, v in lm.state_dict().items() if k.startswith("model.")}
    state["language_model.embed_tokens.weight"] = torch.cat(
        [state["language_model.embed_tokens.weight"], torch.zeros(len(tok) - n_old, cfg.text_config.hidden_size)]
    )
    missing, unexpected = model.model.load_state_dict(state, strict=False)
    biases = {k for k in missing if k.startswith("language_model.") and k.endswith(("q_proj.bias", "k_proj.bias",
                                                                                   "v_proj.bias"))}  # fmt: skip
    vision = {k for k in missing if k.startswith("visual.")}
    if unexpected or set(missing) - biases - vision:
        raise RuntimeError(f"SmolLM2 -> {kind}: unexpected {unexpected}, missing {sorted(set(missing) - biases)}")
    with torch.no_grad():
        for name, param in model.model.language_model.named_parameters():
            if name in {b[len("language_model.") :] for b in biases}:
                param.zero_()
    _pad_rows(model.get_input_embeddings().weight, n_old)
    processor = _processor(kind, tok)

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        _patch_vision_config(tmp)

    return _save(out_dir, save)


def build_vlm_text_draft(draft_dir: Path, target_dir: Path, out_dir: Path) -> Path:
    """A copy of the text draft in ``draft_dir`` whose vocabulary matches the VLM target's (new rows = the mean row),
    with the target's tokenizer; skips when ``out_dir/config.json`` exists."""
    import transformers as tf

    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    tok = tf.AutoTokenizer.from_pretrained(str(target_dir))
    draft = tf.AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32)
    n_old = draft.config.vocab_size
    draft.resize_token_embeddings(len(tok), mean_resizing=False)
    _pad_rows(draft.get_input_embeddings().weight, n_old)
    if draft.get_output_embeddings().weight.data_ptr() != draft.get_input_embeddings().weight.data_ptr():
        _pad_rows(draft.get_output_embeddings().weight, n_old)

    def save(tmp: Path) -> None:
        draft.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    return _save(out_dir, save)


def build_vlm_eagle3_head(head_dir: Path, target_dir: Path, out_dir: Path) -> Path:
    """A copy of the EAGLE-3 head in ``head_dir`` fitted to the VLM target in ``target_dir``; skips when
    ``out_dir/config.json`` exists.

    The head has no embedding of its own (SGLang hands it the target's), so only its config changes: ``vocab_size``
    becomes the target language model's and ``rope_parameters`` takes the target's ``mrope_section`` (SGLang's
    ``LlamaForCausalLMEagle3`` then rotates by the batch's M-RoPE positions, which equal the 1-D ones on text).
    ``t2d`` (target -> draft membership) is padded with False for the new ids; weights, ``d2t`` and the reduced
    head are unchanged.  The target's tokenizer files come along.
    """
    from safetensors.torch import load_file, save_file

    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    text = json.loads((Path(target_dir) / "config.json").read_text())
    text = text.get("text_config", text)
    cfg = json.loads((Path(head_dir) / "config.json").read_text())
    cfg["vocab_size"] = text["vocab_size"]
    mrope = (text.get("rope_parameters") or text.get("rope_scaling") or {}).get("mrope_section")
    if mrope is not None:
        cfg["rope_parameters"] = {**cfg.get("rope_parameters", {}), "mrope_section": list(mrope)}
    weights = load_file(str(Path(head_dir) / "model.safetensors"))
    if "t2d" in weights:
        t2d = weights["t2d"]
        weights["t2d"] = torch.cat([t2d, t2d.new_zeros(text["vocab_size"] - t2d.numel())])

    def save(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        save_file(weights, str(tmp / "model.safetensors"))
        for f in Path(target_dir).iterdir():
            if f.name.startswith("tokenizer") or f.name == "chat_template.jinja":
                shutil.copy(f, tmp / f.name)

    return _save(out_dir, save)


def ensure_qwen_vl_eagle3(kind: str = "qwen2_5_vl", cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """The bundled SmolLM2 EAGLE-3 head fitted to the Qwen-VL-on-SmolLM2 target of ``kind``
    (:func:`build_vlm_eagle3_head`), built once under ``cache_dir``."""
    head = require_bundled("smollm2-eagle3")
    target, _ = ensure_qwen_vl_smollm2(kind, cache_dir)
    return build_vlm_eagle3_head(head, target, Path(cache_dir) / f"smollm2-eagle3-for-{target.name}")


def ensure_qwen_vl_smollm2(kind: str = "qwen2_vl", cache_dir: Path = DEFAULT_CACHE_DIR) -> tuple[Path, Path]:
    """``(target_dir, draft_dir)``: the Qwen-VL-on-SmolLM2 target of ``kind`` and the bundled SmolLM2 draft padded to
    its vocabulary, built once under ``cache_dir`` (about a minute each on a 2-core CPU, then reused)."""
    name = {"qwen2_vl": "qwen2-vl-smollm2-135m", "qwen2_5_vl": "qwen2-5-vl-smollm2-135m"}[kind]
    target = build_qwen_vl_smollm2(ensure_smollm2(cache_dir), Path(cache_dir) / name, kind=kind)
    template = target / "chat_template.jinja"  # a target built before the template placed videos gets it now
    if template.is_file() and template.read_text() != _CHAT_TEMPLATE:
        template.write_text(_CHAT_TEMPLATE)
    draft_src = require_bundled("smollm2-draft")
    # the two kinds add the same four tokens in the same order: one padded draft serves both
    return target, build_vlm_text_draft(draft_src, target, Path(cache_dir) / "smollm2-draft-for-qwen-vl")


def ensure_qwen_vl_draft(kind: str = "qwen2_vl", cache_dir: Path = DEFAULT_CACHE_DIR, layers: int = 4) -> Path:
    """A VLM draft for the Qwen-VL-on-SmolLM2 target: the same architecture on SmolLM2's first ``layers`` layers.

    The reference engine can run it (untrained as a draft: few tokens accepted); SGLang 0.5.23 cannot run a
    multimodal draft, and a SAGE launch with one is refused (``docs/design/sglang-internals.md``, "VLMs"), which the e2e tests check
    with this model.  Built once under ``cache_dir``.
    """
    name = {"qwen2_vl": "qwen2-vl", "qwen2_5_vl": "qwen2-5-vl"}[kind] + f"-smollm2-first{layers}-draft"
    text = truncated_draft(ensure_smollm2(cache_dir), layers, Path(cache_dir))
    return build_qwen_vl_smollm2(text, Path(cache_dir) / name, kind=kind, seed=1)
