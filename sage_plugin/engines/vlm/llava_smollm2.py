"""LLaVA-OneVision in the format SGLang serves it (``LlavaQwenForCausalLM``, the lmms-lab checkpoints) with the real
SmolLM2-135M-Instruct as its language model: the demo LLaVA-OV target of the CPU serving tests.

SGLang 0.5.23 loads an lmms-lab LLaVA-OV checkpoint as one Qwen2 causal LM (``model.*``, ``lm_head``) plus
``model.mm_projector.{0,2}`` (a two-layer GELU MLP from the vision width to the text width) and ``model.image_newline``,
and loads the vision tower itself from the directory ``mm_vision_tower`` names (a SigLIP tower when the path contains
"siglip").  This builder writes exactly that: SmolLM2's weights under Qwen2's names (Qwen2's q/k/v biases zero, so
the text path is SmolLM2's), the ``<image>`` token appended to the vocabulary (id 49152, the mean embedding), a tiny
random SigLIP tower (32x32 tiles of 8x8 patches: 16 visual tokens a tile) saved beside it, and a random projector
and newline vector (deterministic from ``seed``).  Images take SGLang's anyres path (``anyres_max_9`` over the
pinpoints 32..96 pixels, ``spatial_unpad``: a base tile plus up to 3x3 tiles, unpadded, with a newline token per
row); several images or a video's frames take its ``pad`` path (one tile each; a video's frames pooled 2x2).

Example (what :func:`ensure_llava_ov_smollm2` does, once per cache)::

    target = build_llava_ov_smollm2(ensure_smollm2(), cache / "llava-ov-smollm2-135m")
    draft = build_vlm_text_draft(require_bundled("smollm2-draft"), target, cache / "smollm2-draft-for-llava-ov")
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sage_plugin.models import DEFAULT_CACHE_DIR, ensure_smollm2, require_bundled

from .qwen_smollm2 import _pad_rows, _save, build_vlm_text_draft

__all__ = ["LLAVA_OV_ARCHITECTURE", "IMAGE_TOKEN", "build_llava_ov_smollm2", "ensure_llava_ov_smollm2"]

LLAVA_OV_ARCHITECTURE = "LlavaQwenForCausalLM"
"""The architecture of lmms-lab's LLaVA-OneVision checkpoints (``llava-onevision-qwen2-{0.5,7,72}b-ov``)."""
IMAGE_TOKEN = "<image>"
TILE, PATCH = 32, 8
#: anyres resolutions (pixels): 1x1 to 3x3 tiles of 32
PINPOINTS = [[TILE * h, TILE * w] for h in (1, 2, 3) for w in (1, 2, 3)]
VISION_DIR = "siglip-vision-tower"  # SGLang picks SigLIP over CLIP by this name

_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}"
    "{% if c['type'] in ('image', 'image_url', 'video', 'video_url') %}<image>\n"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _vision_tower(out: Path, seed: int) -> int:
    """Save a tiny random SigLIP vision tower in ``out``; returns its width."""
    from transformers import SiglipVisionConfig, SiglipVisionModel

    cfg = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                             image_size=TILE, patch_size=PATCH)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        SiglipVisionModel(cfg).eval().save_pretrained(out)
    return cfg.hidden_size


def _config(lm_cfg, tok, vision_dir: Path, mm_hidden: int) -> dict:
    head_dim = getattr(lm_cfg, "head_dim", None) or lm_cfg.hidden_size // lm_cfg.num_attention_heads
    return dict(
        architectures=[LLAVA_OV_ARCHITECTURE], model_type="qwen2", hidden_size=lm_cfg.hidden_size,
        intermediate_size=lm_cfg.intermediate_size, num_hidden_layers=lm_cfg.num_hidden_layers,
        num_attention_heads=lm_cfg.num_attention_heads, num_key_value_heads=lm_cfg.num_key_value_heads,
        head_dim=head_dim, hidden_act=lm_cfg.hidden_act, rms_norm_eps=lm_cfg.rms_norm_eps,
        max_position_embeddings=lm_cfg.max_position_embeddings, rope_theta=lm_cfg.rope_parameters["rope_theta"],
        vocab_size=len(tok), tie_word_embeddings=True, torch_dtype="float32", use_sliding_window=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN), mm_vision_tower=str(vision_dir.resolve()),
        mm_hidden_size=mm_hidden, mm_projector_type="mlp2x_gelu", mm_vision_select_layer=-2,
        mm_vision_select_feature="patch", mm_patch_merge_type="spatial_unpad", mm_newline_position="grid",
        mm_spatial_pool_mode="bilinear", image_aspect_ratio="anyres_max_9", image_grid_pinpoints=PINPOINTS,
        mm_use_im_start_end=False, mm_use_im_patch_token=False,
    )  # fmt: skip


def build_llava_ov_smollm2(text_model_dir: Path, out_dir: Path, seed: int = 0) -> Path:
    """LLaVA-OV (lmms-lab format, :data:`LLAVA_OV_ARCHITECTURE`) on the causal LM in ``text_model_dir`` (SmolLM2),
    saved with its tokenizer, chat template and tiny SigLIP tower (in ``out_dir/siglip-vision-tower``, whose absolute
    path the config names).  Deterministic; skips the build when ``out_dir/config.json`` exists."""
    import transformers as tf
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    tok = tf.AutoTokenizer.from_pretrained(str(text_model_dir))
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tok.chat_template = _CHAT_TEMPLATE
    lm = tf.AutoModelForCausalLM.from_pretrained(str(text_model_dir), dtype=torch.float32)
    hidden, n_old = lm.config.hidden_size, lm.config.vocab_size
    state = {k: v.contiguous() for k, v in lm.state_dict().items() if k != "lm_head.weight"}  # tied
    emb = torch.cat([state["model.embed_tokens.weight"], torch.zeros(len(tok) - n_old, hidden)])
    _pad_rows(emb, n_old)
    state["model.embed_tokens.weight"] = emb
    for i in range(lm.config.num_hidden_layers):  # Qwen2's q/k/v biases, zero: SmolLM2's attention
        for proj in ("q_proj", "k_proj", "v_proj"):
            state[f"model.layers.{i}.self_attn.{proj}.bias"] = torch.zeros(
                state[f"model.layers.{i}.self_attn.{proj}.weight"].shape[0]
            )

    def save(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        final_vision = out_dir / VISION_DIR
        mm_hidden = _vision_tower(tmp / VISION_DIR, seed)
        gen = torch.Generator().manual_seed(seed)
        state["model.mm_projector.0.weight"] = torch.randn(hidden, mm_hidden, generator=gen) / mm_hidden**0.5
        state["model.mm_projector.0.bias"] = torch.zeros(hidden)
        state["model.mm_projector.2.weight"] = torch.randn(hidden, hidden, generator=gen) / hidden**0.5
        state["model.mm_projector.2.bias"] = torch.zeros(hidden)
        state["model.image_newline"] = torch.randn(hidden, generator=gen) * 0.02
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(_config(lm.config, tok, final_vision, mm_hidden), indent=1))
        # the processor SGLang loads from the model directory (AutoProcessor): SigLIP's image processor at the
        # tower's tile size and the tokenizer, as a LlavaProcessor
        image_processor = tf.SiglipImageProcessor(size={"height": TILE, "width": TILE})
        tf.LlavaProcessor(image_processor=image_processor, tokenizer=tok, chat_template=_CHAT_TEMPLATE).save_pretrained(
            tmp
        )

    return _save(out_dir, save)


def ensure_llava_ov_smollm2(cache_dir: Path = DEFAULT_CACHE_DIR) -> tuple[Path, Path]:
    """``(target_dir, draft_dir)``: the LLaVA-OV-on-SmolLM2 target and the bundled SmolLM2 draft padded to its
    vocabulary (the draft reads one placeholder id per visual position), built once under ``cache_dir``."""
    target = build_llava_ov_smollm2(ensure_smollm2(cache_dir), Path(cache_dir) / "llava-ov-smollm2-135m")
    draft_src = require_bundled("smollm2-draft")
    return target, build_vlm_text_draft(draft_src, target, Path(cache_dir) / "smollm2-draft-for-llava-ov")
