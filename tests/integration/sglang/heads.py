"""Random EAGLE / EAGLE3 draft heads for a Llama target, in the checkpoint formats SGLang 0.5.23 loads.

No trained EAGLE head exists for SmolLM2 (MODELS.md).  These heads are random, so they accept little, but they
exercise every piece of plumbing a real head uses: the target's hidden states (EAGLE: last layer; EAGLE3: three
captured layers through ``fc``), the shared embedding / lm_head, EAGLE3's reduced draft vocabulary with its
``d2t`` hot-token map.  Greedy output must still equal plain decoding.

* EAGLE (``LlamaForCausalLMEagle``, SGLang ``models/llama_eagle.py``): ``fc`` [H, 2H] (+ bias) over
  ``[embed(token), hidden]``, one decoder layer without its input norm, no final norm; embedding and head are
  the target's (the head's config is untied so SGLang can share both).
* EAGLE3 (``LlamaForCausalLMEagle3``, ``models/llama_eagle3.py``): ``fc`` [H, 3H] over three target layers,
  ``midlayer`` whose attention reads ``[norm(embed), hidden_norm(h)]`` (2H wide), final ``norm``, its own
  ``lm_head`` over ``draft_vocab`` tokens, and ``d2t`` (draft id -> target id offsets).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

__all__ = ["make_eagle_head", "make_eagle3_head"]


def _layer(
    prefix: str,
    hidden: int,
    inter: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    attn_in: int,
    gen: torch.Generator,
    std: float,
) -> dict[str, torch.Tensor]:
    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    return {
        f"{prefix}.self_attn.q_proj.weight": w(heads * head_dim, attn_in),
        f"{prefix}.self_attn.k_proj.weight": w(kv_heads * head_dim, attn_in),
        f"{prefix}.self_attn.v_proj.weight": w(kv_heads * head_dim, attn_in),
        f"{prefix}.self_attn.o_proj.weight": w(hidden, heads * head_dim),
        f"{prefix}.mlp.gate_proj.weight": w(inter, hidden),
        f"{prefix}.mlp.up_proj.weight": w(inter, hidden),
        f"{prefix}.mlp.down_proj.weight": w(hidden, inter),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(hidden),
    }


def _target_config(target: Path) -> dict:
    cfg = json.loads((target / "config.json").read_text())
    cfg.pop("_model_name_or_path", None)
    return cfg


def _write(out: Path, cfg: dict, tensors: dict[str, torch.Tensor], target: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (target / name).is_file():
            (out / name).write_bytes((target / name).read_bytes())
    return out


def make_eagle_head(target: Path, out: Path, seed: int = 0, std: float = 0.02) -> Path:
    """Write a random one-layer ``LlamaForCausalLMEagle`` head for ``target`` into ``out``; returns ``out``."""
    cfg = _target_config(target)
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim", h // nh)
    gen = torch.Generator().manual_seed(seed)
    t = _layer("layers.0", h, inter, nh, nkv, hd, h, gen, std)
    t["fc.weight"] = torch.randn(h, 2 * h, generator=gen) * std
    t["fc.bias"] = torch.zeros(h)
    # untied: SGLang's set_embed_and_head deletes the head's weight after the embedding's (same module if tied)
    cfg.update(architectures=["LlamaForCausalLMEagle"], num_hidden_layers=1, tie_word_embeddings=False)
    return _write(out, cfg, t, target)


def make_eagle3_head(target: Path, out: Path, draft_vocab: int = 8192, seed: int = 0, std: float = 0.02) -> Path:
    """Write a random one-layer ``LlamaForCausalLMEagle3`` head (own ``draft_vocab`` lm_head + ``d2t``)."""
    cfg = _target_config(target)
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim", h // nh)
    gen = torch.Generator().manual_seed(seed)
    t = _layer("midlayer", h, inter, nh, nkv, hd, 2 * h, gen, std)
    t["midlayer.input_layernorm.weight"] = torch.ones(h)
    t["midlayer.hidden_norm.weight"] = torch.ones(h)
    t["fc.weight"] = torch.randn(h, 3 * h, generator=gen) * std
    t["norm.weight"] = torch.ones(h)
    t["lm_head.weight"] = torch.randn(draft_vocab, h, generator=gen) * std
    hot = torch.sort(torch.randperm(vocab, generator=gen)[:draft_vocab]).values
    t["d2t"] = hot - torch.arange(draft_vocab)  # SGLang: hot_token_id = d2t + arange
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[hot] = True
    t["t2d"] = t2d
    cfg.update(
        architectures=["LlamaForCausalLMEagle3"],
        num_hidden_layers=1,
        tie_word_embeddings=False,
        draft_vocab_size=draft_vocab,
    )
    return _write(out, cfg, t, target)
