"""The demo VLMs SGLang serves on CPU, by name: what ``sage build-vlm --kind`` and ``sage bench-serving --vlm`` take.

>>> DEMO_KINDS
('qwen2_vl', 'qwen2_5_vl', 'llava_ov')
"""

from __future__ import annotations

from pathlib import Path

from sage_plugin.models import DEFAULT_CACHE_DIR

from .llava_smollm2 import ensure_llava_ov_smollm2
from .qwen_smollm2 import QWEN_VL_KINDS, ensure_qwen_vl_eagle3, ensure_qwen_vl_smollm2

__all__ = ["DEMO_KINDS", "ensure_vlm_demo"]

DEMO_KINDS: tuple[str, ...] = (*QWEN_VL_KINDS, "llava_ov")


def ensure_vlm_demo(kind: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> tuple[Path, Path, Path | None]:
    """``(target_dir, draft_dir, eagle3_head_dir)`` of the demo ``kind`` (one of :data:`DEMO_KINDS`), built once under
    ``cache_dir``: the VLM on the real SmolLM2, the bundled draft padded to its vocabulary, and for a Qwen-VL the
    bundled EAGLE-3 head fitted to it (None for LLaVA-OV: SGLang's llava.py captures no EAGLE-3 layers)."""
    if kind == "llava_ov":
        return (*ensure_llava_ov_smollm2(cache_dir), None)
    if kind not in QWEN_VL_KINDS:
        raise ValueError(f"unknown demo VLM {kind!r}; expected one of {DEMO_KINDS}")
    target, draft = ensure_qwen_vl_smollm2(kind, cache_dir)
    return target, draft, ensure_qwen_vl_eagle3(kind, cache_dir)
