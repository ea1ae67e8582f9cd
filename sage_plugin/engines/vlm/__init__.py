"""VLM engine models for the reference engine: tiny offline VLMs, SmolVLM-on-SmolLM2, SpecVLM pruning.

* :mod:`.build`: offline demo VLMs built from configs (no model hub): tiny random Qwen2-VL /
  Qwen2.5-VL / LLaVA-OneVision (:func:`build_tiny_vlm`), SmolVLM whose text model is the real
  SmolLM2-135M-Instruct (:func:`build_smolvlm`), and :func:`load_vlm`.
* :mod:`.qwen_smollm2`: Qwen2-VL / Qwen2.5-VL whose language model is the real SmolLM2-135M-Instruct (what SGLang
  serves on CPU: it has no SmolVLM), the bundled draft padded to its vocabulary (:func:`ensure_qwen_vl_smollm2`) and
  the bundled EAGLE-3 head fitted to it (:func:`ensure_qwen_vl_eagle3`).
* :mod:`.llava_smollm2`: LLaVA-OneVision in lmms-lab's format (what SGLang serves as ``LlavaQwenForCausalLM``) on the
  real SmolLM2, with the bundled draft padded to its vocabulary (:func:`ensure_llava_ov_smollm2`).
* :mod:`.demo`: the three demo VLMs by name (:func:`ensure_vlm_demo`).
* :mod:`.scores`: visual-attention score collection during a prefill (:data:`SCORE_ATTN`) and
  SpecVLM's two-stage visual-token selection (:func:`select_visual_keep`).
* :mod:`.model`: multimodal requests (:func:`make_vlm_request`, :class:`VLMInput`), the VLM
  engine model with draft-side visual-token pruning (:class:`VLMModel`) and the text-only
  draft of a VLM target (:class:`TextDraftForVLM`).
"""

from __future__ import annotations

from .build import TINY_KINDS, VOCAB_SEED, build_smolvlm, build_tiny_vlm, load_vlm
from .demo import DEMO_KINDS, ensure_vlm_demo
from .llava_smollm2 import build_llava_ov_smollm2, ensure_llava_ov_smollm2
from .model import TextDraftForVLM, VLMInput, VLMModel, make_vlm_request
from .qwen_smollm2 import (
    QWEN_VL_KINDS,
    build_qwen_vl_smollm2,
    build_vlm_eagle3_head,
    build_vlm_text_draft,
    ensure_qwen_vl_draft,
    ensure_qwen_vl_eagle3,
    ensure_qwen_vl_smollm2,
)
from .scores import SCORE_ATTN, select_visual_keep

__all__ = [
    "DEMO_KINDS",
    "QWEN_VL_KINDS",
    "TINY_KINDS",
    "VOCAB_SEED",
    "SCORE_ATTN",
    "VLMInput",
    "VLMModel",
    "TextDraftForVLM",
    "build_tiny_vlm",
    "build_llava_ov_smollm2",
    "build_qwen_vl_smollm2",
    "build_smolvlm",
    "build_vlm_eagle3_head",
    "build_vlm_text_draft",
    "ensure_llava_ov_smollm2",
    "ensure_vlm_demo",
    "ensure_qwen_vl_draft",
    "ensure_qwen_vl_eagle3",
    "ensure_qwen_vl_smollm2",
    "load_vlm",
    "make_vlm_request",
    "select_visual_keep",
]
