"""The three LLaVA-OV hooks (``runtimes/sglang/llava_compat.py``) on stand-ins of SGLang's model: what each changes
and what it leaves to upstream.  Served end to end by ``tests/integration/sglang/test_e2e_llava_ov.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sage_plugin.runtimes.sglang.llava_compat import llava_forward, llava_load_weights, llava_qwen_init


def _lmms_lab_config(**extra):
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=64, num_attention_heads=4, mm_hidden_size=32, mm_vision_select_layer=-2, **extra)


def test_init_fills_what_an_lmms_lab_config_lacks_and_keeps_the_rest():
    seen = []
    config = _lmms_lab_config()
    llava_qwen_init(lambda self, cfg, *a, **k: seen.append((cfg, a, k)), "model", config, None, prefix="p")
    [(cfg, args, kwargs)] = seen
    assert cfg is config and args == (None,) and kwargs == {"prefix": "p"}
    assert config.vision_config.hidden_size == 32 and config.text_config.hidden_size == 64
    assert config.text_config is not config  # a copy: no config nested in itself
    assert config.vision_feature_layer == -2 and config.multimodal_projector_bias is True
    kept = _lmms_lab_config(vision_feature_layer=[-1, -2], multimodal_projector_bias=False)
    llava_qwen_init(lambda *a, **k: None, "model", kept)
    assert kept.vision_feature_layer == [-1, -2] and kept.multimodal_projector_bias is False


def test_load_weights_puts_the_tower_its_input_and_the_newline_in_the_projector_dtype():
    tower = torch.nn.Linear(4, 3).half()
    model = SimpleNamespace(
        vision_tower=tower,
        multi_modal_projector=torch.nn.Linear(3, 2),
        language_model=SimpleNamespace(model=SimpleNamespace(image_newline=torch.nn.Parameter(torch.ones(2).half()))),
    )
    assert llava_load_weights(lambda self, w: ("loaded", w), model, "weights") == ("loaded", "weights")
    assert tower.weight.dtype == torch.float32 and model.language_model.model.image_newline.dtype == torch.float32
    assert tower(torch.ones(1, 4, dtype=torch.float16)).dtype == torch.float32  # float16 pixels cast on the way in


@pytest.mark.parametrize("verify", [True, False])
def test_forward_runs_a_verify_batch_on_the_language_model_alone(verify):
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: verify))
    model = SimpleNamespace(language_model=lambda ids, pos, fb: ("language model", ids))
    out = llava_forward(lambda self, ids, pos, fb: ("upstream", ids), model, "ids", "pos", batch)
    assert out == (("language model", "ids") if verify else ("upstream", "ids"))
