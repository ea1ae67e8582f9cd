"""Offline demo VLMs: tiny random Qwen2-VL / Qwen2.5-VL / LLaVA-OneVision and SmolVLM-on-SmolLM2.

Everything is built from configs (no model hub).

* :func:`build_tiny_vlm` builds a random-init ``qwen2_vl`` / ``qwen2_5_vl`` / ``llava_onevision``
  model of about 6.5M parameters (text: hidden 64, 4 heads / 2 KV heads, ``text_layers`` layers,
  untied LM head so greedy text is not a copy of the last input token; vision: 2 tiny layers).
  Its tokenizer is the SmolLM2 tokenizer plus the image special tokens the processor needs, added
  in a fixed order, so every seed / layer count of one kind has the same token ids and one can be
  the draft of another.  ``seed`` drives the layers and the vision tower; the token embedding and
  LM head are drawn from the fixed :data:`VOCAB_SEED` (``share_vocab_init=True``), so a seed-1
  draft accepts a few tokens of a seed-0 target instead of none.  Qwen processors use
  ``min_pixels=56*56, max_pixels=112*112`` (at most 16 visual tokens); LLaVA-OV uses 32x32
  SigLIP tiles (patch 8) with anyres pinpoints up to 64x64 (about 50 visual tokens incl. the
  newline tokens).
* :func:`build_smolvlm` builds ``SmolVLMForConditionalGeneration`` whose text model *is* the real
  SmolLM2-135M-Instruct (embeddings resized for the image tokens, the new rows set to the mean
  embedding so they never win the tied LM head's argmax; LM head tied as in SmolLM2)
  with a tiny random SigLIP tower (64x64 tiles, patch 8, pixel-shuffle 2: 16 tokens per tile,
  up to 2x2 tiles + the global image = 80 visual tokens).  Its chat template is SmolLM2's own
  ChatML template with ``<image>`` where the image goes, so the text part of the prompt is what
  SmolLM2 (and a SmolLM2 draft) expects.
* :func:`load_vlm` reloads either (fp32, eval, ``attn_implementation="sdpa"``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from sage_plugin.models import ensure_smollm2

__all__ = ["TINY_KINDS", "VOCAB_SEED", "build_tiny_vlm", "build_smolvlm", "load_vlm"]

TINY_KINDS: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl", "llava_onevision")

VOCAB_SEED = 1234
"""Seed of the token embedding and LM head of every tiny VLM (see :func:`build_tiny_vlm`)."""

_TINY_SYSTEM = "You are a helpful assistant."

_CHATML_HEAD = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n{SYSTEM}<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}"
    "{% if c['type'] == 'image' %}{IMAGE}{% elif c['type'] == 'video' %}{VIDEO}"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _chat_template(image: str, system: str, video: str = "") -> str:
    """ChatML with ``image`` / ``video`` where a message's image / video part goes (a model without video: none)."""
    return _CHATML_HEAD.replace("{SYSTEM}", system).replace("{IMAGE}", image).replace("{VIDEO}", video)


def _smollm2_tokenizer(extra: list[str]):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ensure_smollm2()))
    tok.add_special_tokens({"additional_special_tokens": extra})
    return tok


def _tiny_text_config(tok, text_layers: int, **extra) -> dict:
    cfg = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=text_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    cfg.update(extra)
    return cfg


def _tiny_parts(kind: str, text_layers: int):
    """(processor, model class, config) of a tiny random VLM of ``kind``."""
    import transformers as tf

    if kind in ("qwen2_vl", "qwen2_5_vl"):
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

        tok = _smollm2_tokenizer(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])
        small = dict(min_pixels=56 * 56, max_pixels=112 * 112)
        proc_cls = tf.Qwen2VLProcessor if kind == "qwen2_vl" else tf.Qwen2_5_VLProcessor
        proc = proc_cls(
            image_processor=Qwen2VLImageProcessor(**small),
            video_processor=Qwen2VLVideoProcessor(**small),
            tokenizer=tok,
            chat_template=_chat_template(
                "<|vision_start|><|image_pad|><|vision_end|>",
                _TINY_SYSTEM,
                "<|vision_start|><|video_pad|><|vision_end|>",
            ),
        )
        rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
        text = _tiny_text_config(tok, text_layers, rope_parameters=rope)
        ids = dict(
            image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
            video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
            vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
            vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"),
        )
        if kind == "qwen2_vl":
            vision = dict(
                depth=2,
                embed_dim=32,
                hidden_size=64,
                num_heads=2,
                patch_size=14,
                spatial_merge_size=2,
                temporal_patch_size=2,
            )
            return (
                proc,
                tf.Qwen2VLForConditionalGeneration,
                tf.Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids),
            )
        vision = dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[1],
        )
        return (
            proc,
            tf.Qwen2_5_VLForConditionalGeneration,
            tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **ids),
        )
    if kind == "llava_onevision":
        from transformers.models.llava_onevision.image_processing_llava_onevision import LlavaOnevisionImageProcessor
        from transformers.models.llava_onevision.video_processing_llava_onevision import LlavaOnevisionVideoProcessor

        tok = _smollm2_tokenizer(["<image>", "<video>"])
        pins = [[32, 32], [32, 64], [64, 32], [64, 64]]
        proc = tf.LlavaOnevisionProcessor(
            image_processor=LlavaOnevisionImageProcessor(size={"height": 32, "width": 32}, image_grid_pinpoints=pins),
            video_processor=LlavaOnevisionVideoProcessor(size={"height": 32, "width": 32}),
            tokenizer=tok,
            num_image_tokens=16,
            vision_feature_select_strategy="full",
            chat_template=_chat_template("<image>\n", _TINY_SYSTEM, "<video>\n"),
        )
        cfg = tf.LlavaOnevisionConfig(
            text_config=_tiny_text_config(
                tok, text_layers, model_type="qwen2", rope_parameters={"rope_type": "default", "rope_theta": 10000.0}
            ),
            vision_config=dict(
                model_type="siglip_vision_model",
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                image_size=32,
                patch_size=8,
            ),
            image_token_index=proc.image_token_id,
            video_token_index=proc.video_token_id,
            image_grid_pinpoints=pins,
            vision_feature_select_strategy="full",
            vision_feature_layer=-1,
            tie_word_embeddings=False,
        )
        return proc, tf.LlavaOnevisionForConditionalGeneration, cfg
    raise ValueError(f"unknown tiny VLM kind {kind!r}; expected one of {TINY_KINDS}")


def _save_atomic(out_dir: Path, model, processor) -> Path:
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    processor.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def build_tiny_vlm(
    kind: str, out_dir: Path, seed: int = 0, text_layers: int = 2, share_vocab_init: bool = True
) -> Path:
    """Random-init tiny VLM of ``kind`` (one of :data:`TINY_KINDS`) saved with its processor.

    Skips the build when ``out_dir/config.json`` exists.  Same kind => same tokenizer and
    processor, whatever ``seed`` / ``text_layers``.  ``seed`` drives the transformer layers and
    the vision tower; with ``share_vocab_init`` the token embedding and the (untied) LM head come
    from :data:`VOCAB_SEED` instead, so two seeds of one kind share an embedding space and a
    seed-1 draft agrees with a seed-0 target now and then (a stand-in for a same-family draft;
    with fully independent weights every draft token would be rejected).
    """
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    proc, model_cls, cfg = _tiny_parts(kind, text_layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(cfg).eval()
    if share_vocab_init:
        gen = torch.Generator().manual_seed(VOCAB_SEED)
        std = cfg.get_text_config().initializer_range
        with torch.no_grad():
            for w in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
                w.normal_(0.0, std, generator=gen)
    return _save_atomic(out_dir, model, proc)


def build_smolvlm(text_model_dir: Path, out_dir: Path, seed: int = 0) -> Path:
    """SmolVLM whose text model is the causal LM in ``text_model_dir`` (SmolLM2-135M) plus a tiny
    random SigLIP tower; saved with an offline processor.  Skips when ``out_dir`` has a config."""
    import transformers as tf
    from transformers.models.smolvlm.image_processing_smolvlm import SmolVLMImageProcessor
    from transformers.models.smolvlm.video_processing_smolvlm import SmolVLMVideoProcessor

    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    tok = tf.AutoTokenizer.from_pretrained(str(text_model_dir))
    tok.add_special_tokens(
        {
            "additional_special_tokens": [
                "<fake_token_around_image>",
                "<image>",
                "<global-img>",
                *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)],
            ]
        }
    )
    system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    proc = tf.SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(size={"longest_edge": 128}, max_image_size={"longest_edge": 64}),
        video_processor=SmolVLMVideoProcessor(size={"longest_edge": 64}, max_image_size={"longest_edge": 64}),
        tokenizer=tok,
        image_seq_len=16,
        chat_template=_chat_template("<image>", system),
    )
    lm = tf.AutoModelForCausalLM.from_pretrained(str(text_model_dir), dtype=torch.float32)
    text_cfg = lm.config.to_dict()
    cfg = tf.SmolVLMConfig(
        text_config=text_cfg,
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=64,
            patch_size=8,
        ),
        scale_factor=2,
        image_token_id=proc.image_token_id,
        tie_word_embeddings=bool(lm.config.tie_word_embeddings),
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.SmolVLMForConditionalGeneration(cfg).eval()
        state = {k[len("model.") :]: v for k, v in lm.state_dict().items() if k.startswith("model.")}
        model.model.text_model.load_state_dict(state, strict=True)
        if not cfg.tie_word_embeddings:
            model.lm_head.weight.data.copy_(lm.lm_head.weight.data)
        n_old = model.get_input_embeddings().weight.shape[0]
        model.resize_token_embeddings(len(tok), mean_resizing=False)
        # new rows = the mean old embedding (also the tied LM head rows): a neutral input for the
        # row/column/marker tokens and logits that never beat real text tokens
        emb = model.get_input_embeddings().weight
        with torch.no_grad():
            emb[n_old:] = emb[:n_old].mean(0, keepdim=True)
            out_w = model.get_output_embeddings().weight
            if out_w.data_ptr() != emb.data_ptr():
                out_w[n_old:] = out_w[:n_old].mean(0, keepdim=True)
    return _save_atomic(out_dir, model, proc)


def load_vlm(path: str | Path, device: str | torch.device = "cpu"):
    """``(model, processor)`` of a saved VLM: fp32, eval mode, SDPA attention, no grad, the linear layers of
    :func:`~sage_plugin.engines.lm.use_fast_linears`."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from ..lm import use_fast_linears

    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32, attn_implementation="sdpa")
    return use_fast_linears(model.to(device).eval().requires_grad_(False)), AutoProcessor.from_pretrained(str(path))
