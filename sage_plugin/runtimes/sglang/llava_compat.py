"""LLaVA-OneVision in lmms-lab's format (``LlavaQwenForCausalLM``) on SGLang 0.5.23 with transformers 5: three hooks
(``patches/INDEX.md``) without which no such checkpoint serves an image, or speculates.

* **Sub-configs** (:func:`llava_qwen_init`, AROUND ``LlavaQwenForCausalLM.__init__``).  The constructor fills a missing
  ``config.vision_config`` with ``CLIPVisionConfig(config.mm_vision_tower)`` and a missing ``config.text_config``
  with ``Qwen2Config(config._name_or_path)``, then overwrites both hidden sizes.  transformers 4 took the positional
  string as the first field and carried on; transformers 5 (SGLang 0.5.23 installs 5.19) refuses it
  ("CLIPVisionConfig accepts only keyword arguments"), so no lmms-lab checkpoint (a Qwen2 config plus ``mm_*`` keys,
  no sub-configs: the 72B and 7B of ``llava_ov_72b_7b_draft_sage.yaml`` too) constructs.  The constructor then builds
  transformers 5's ``LlavaMultiModalProjector``, which also reads ``vision_feature_layer`` and
  ``multimodal_projector_bias``, keys an lmms-lab config lacks too.  The hook sets what is missing first, as the
  constructor means it: a default CLIP vision config of width ``mm_hidden_size`` (only its width is read: the tower
  itself loads from ``mm_vision_tower``), a copy of the checkpoint's own config as the text config,
  ``vision_feature_layer = mm_vision_select_layer`` (one layer: the projector's input is one tower width) and
  ``multimodal_projector_bias = True`` (lmms-lab's ``mlp2x_gelu`` has biases).  Keys a config has are left alone.
* **One dtype** (:func:`llava_load_weights`, AROUND ``LlavaBaseForCausalLM.load_weights``).  ``load_weights`` loads the
  vision tower with ``torch_dtype=torch.float16`` whatever ``--dtype`` says, and the ``image_newline`` parameter is
  created in float16, while the projector is in the model's dtype: at ``--dtype bfloat16`` (the 72B config) or
  ``float32`` (the CPU demo) the first image fails in the projector ("expected m1 and m2 to have the same dtype").
  After upstream's load the hook moves the tower and ``image_newline`` to the projector's dtype and casts the
  tower's input (SGLang hands it float16 pixels) to it.  At ``--dtype float16`` nothing changes.
* **Verify forwards** (:func:`llava_forward`, AROUND ``LlavaBaseForCausalLM.forward``).  ``forward`` takes every
  extend-kind batch for a prefill that may need the vision tower and indexes ``positions`` by ``extend_start_loc``
  per request; a speculative TARGET_VERIFY batch (an extend kind in SGLang) has tree positions laid out
  differently, and the forward fails ("operands could not be broadcast together") at the first verify of any
  speculative algorithm (SGLang's own STANDALONE and EAGLE as well as SAGE).  A verify batch's tokens are draft
  tokens after the prompt, never image positions, so the hook runs it as upstream runs a decode batch: the language
  model on ``input_ids`` alone.  Every other batch: upstream's forward.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch

__all__ = [
    "LLAVA_FORWARD",
    "LLAVA_HOOKS",
    "LLAVA_LOAD_WEIGHTS",
    "LLAVA_QWEN_INIT",
    "llava_forward",
    "llava_load_weights",
    "llava_qwen_init",
]

LLAVA_QWEN_INIT = "sglang.srt.models.llava.LlavaQwenForCausalLM.__init__"
LLAVA_LOAD_WEIGHTS = "sglang.srt.models.llava.LlavaBaseForCausalLM.load_weights"
LLAVA_FORWARD = "sglang.srt.models.llava.LlavaBaseForCausalLM.forward"


def llava_qwen_init(original: Callable[..., Any], self: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``LlavaQwenForCausalLM.__init__(self, config, quant_config=None, prefix="")``: give ``config`` the keys it
    lacks (the module docstring), then construct as upstream."""
    if getattr(config, "vision_config", None) is None:
        from transformers import CLIPVisionConfig

        # one head: transformers 5 validates hidden_size % num_attention_heads, and only the width is read
        config.vision_config = CLIPVisionConfig(hidden_size=config.mm_hidden_size, num_attention_heads=1)
    if getattr(config, "text_config", None) is None:
        config.text_config = copy.deepcopy(config)
    for key, value in (("vision_feature_layer", getattr(config, "mm_vision_select_layer", -2)),
                       ("multimodal_projector_bias", True)):  # fmt: skip
        if not hasattr(config, key):
            setattr(config, key, value)
    return original(self, config, *args, **kwargs)


def llava_load_weights(original: Callable[..., Any], self: Any, weights: Any) -> Any:
    """AROUND ``LlavaBaseForCausalLM.load_weights(self, weights)``: upstream's load, then the vision tower, its input and
    ``image_newline`` in the projector's dtype (the module docstring)."""
    out = original(self, weights)
    dtype = next(self.multi_modal_projector.parameters()).dtype
    tower = self.vision_tower
    if next(tower.parameters()).dtype != dtype:
        tower.to(dtype)
        tower.register_forward_pre_hook(lambda _, args, kw: ((args[0].to(dtype), *args[1:]), kw), with_kwargs=True)
    newline = getattr(self.language_model.model, "image_newline", None)
    if isinstance(newline, torch.nn.Parameter) and newline.dtype != dtype:
        newline.data = newline.data.to(dtype)
    return out


def llava_forward(original: Callable[..., Any], self: Any, input_ids: Any, positions: Any, forward_batch: Any,
                  *args: Any, **kwargs: Any) -> Any:  # fmt: skip
    """AROUND ``LlavaBaseForCausalLM.forward(self, input_ids, positions, forward_batch)``: a TARGET_VERIFY batch runs
    the language model alone (the module docstring); every other batch, upstream's forward."""
    if forward_batch.forward_mode.is_target_verify():
        return self.language_model(input_ids, positions, forward_batch)
    return original(self, input_ids, positions, forward_batch, *args, **kwargs)


#: ``(target, hook)`` of this module, in :data:`.hooks.HOOKS`
LLAVA_HOOKS = (
    (LLAVA_QWEN_INIT, llava_qwen_init),
    (LLAVA_LOAD_WEIGHTS, llava_load_weights),
    (LLAVA_FORWARD, llava_forward),
)
