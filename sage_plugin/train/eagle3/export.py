"""Write a trained EAGLE-3 head as an SGLang checkpoint, load it back, and measure it on held-out prompts.

Checkpoint (``OUT/head``): ``config.json`` = the target's config with ``architectures: [LlamaForCausalLMEagle3]``,
``num_hidden_layers: 1``, the head's ``intermediate_size``, ``draft_vocab_size``, untied embeddings (SGLang hands the
target's embedding to the head) and ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang captures the states
entering layers ``l + 1``); ``model.safetensors`` (fp16: ``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``,
``t2d``); the target's tokenizer files; ``sage_eagle3.json`` (training record) and a model card.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from sage_plugin.engines.eagle3 import Eagle3Head, head_from_files, read_head_files
from sage_plugin.engines.lm import load_causal_lm

from ..evaluate import chain_accept, eval_cache_key, heldout_continuations
from .data import target_features
from .loss import step_matches

__all__ = ["EAGLE3_ARCH", "head_config", "export_head", "load_head", "evaluate_head"]

EAGLE3_ARCH = "LlamaForCausalLMEagle3"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def head_config(target_cfg: dict, head: Eagle3Head, aux_layers) -> dict:
    """The head's ``config.json`` (see module doc)."""
    cfg = {k: v for k, v in target_cfg.items() if not k.startswith("_")}
    cfg.update(
        architectures=[EAGLE3_ARCH],
        num_hidden_layers=1,
        intermediate_size=head.shape.intermediate,
        tie_word_embeddings=False,
        draft_vocab_size=head.shape.draft_vocab,
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(aux_layers), "use_aux_hidden_state": True},
    )
    return cfg


def export_head(head: Eagle3Head, target_dir: Path, out: Path, aux_layers, record: dict, card: str) -> Path:
    """Write the checkpoint directory ``out``; returns it."""
    out.mkdir(parents=True, exist_ok=True)
    target_cfg = json.loads((target_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(head_config(target_cfg, head, aux_layers), indent=1) + "\n")
    tensors = {
        k: (v.to(torch.float16) if v.is_floating_point() else v).contiguous()
        for k, v in head.sglang_state_dict().items()
    }
    save_file(tensors, str(out / "model.safetensors"))
    for name in _TOKENIZER_FILES:
        if (target_dir / name).is_file():
            (out / name).write_bytes((target_dir / name).read_bytes())
    (out / "sage_eagle3.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "README.md").write_text(card)
    return out


def load_head(head_dir: Path, embedding: torch.Tensor) -> tuple[Eagle3Head, list[int]]:
    """(head in fp32, aux layer ids) from an exported checkpoint, over the target's ``embedding``."""
    cfg, tensors = read_head_files(head_dir)
    return head_from_files(cfg, tensors, embedding), list(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])


@torch.inference_mode()
def evaluate_head(
    target_dir: Path,
    head_dir: Path,
    *,
    datasets=("mt_bench", "humaneval"),
    limit: int | None = 40,
    gen_tokens: int = 64,
    chains=(4, 5),
    cache: Path,
) -> dict:
    """Held-out figures: step-0 top-1 agreement, per-step accuracy and exact chain tau (:func:`sage_plugin.train.evaluate.chain_accept`).

    Along the target's greedy continuation of each prompt (cached like the standalone draft's evaluation), every row
    of the continuation starts a chain of draft steps fed the head's own outputs.
    """
    from sage_plugin.models import load_tokenizer

    target = load_causal_lm(target_dir)
    tok = load_tokenizer(target_dir)
    head, aux = load_head(head_dir, target.get_input_embeddings().weight)
    steps = max(chains)
    cache.mkdir(parents=True, exist_ok=True)
    key = eval_cache_key(target_dir, gen_tokens)
    res: dict = {"per_dataset": {}}
    tot = {"hit": 0, "n": 0, "step_hit": [0] * steps, "step_n": [0] * steps, **{f"tau{c}": [0, 0] for c in chains}}
    for ds in datasets:
        prompts, ids, conts = heldout_continuations(
            target, tok, ds, limit=limit, gen_tokens=gen_tokens, cache=cache, key=key, batch_size=8
        )
        d = {"hit": 0, "n": 0, **{f"tau{c}": [0, 0] for c in chains}}
        for p, pid in zip(prompts, ids, strict=True):
            cont = conts[p.id]
            if len(cont) < 3:
                continue
            seq = torch.tensor(pid + cont)
            feats, top, _ = target_features(target, seq[None], aux, 1)
            t_arg = top[0, :, 0].long()
            match = step_matches(head, feats[0], seq, t_arg, steps)
            lo, end = len(pid) - 1, len(seq) - 2
            first = match[lo:end, 0]
            d["hit"] += int(first.sum())
            d["n"] += int(first.numel())
            for k in range(steps):
                col = match[lo : end - k, k]
                tot["step_hit"][k] += int(col.sum())
                tot["step_n"][k] += int(col.numel())
            for c in chains:
                t, s = chain_accept(match, lo, end, c)
                d[f"tau{c}"][0] += t
                d[f"tau{c}"][1] += s
        res["per_dataset"][ds] = {"positions": d["n"], "agreement": d["hit"] / max(1, d["n"])} | {
            f"tau{c}": d[f"tau{c}"][0] / max(1, d[f"tau{c}"][1]) for c in chains
        }
        tot["hit"] += d["hit"]
        tot["n"] += d["n"]
        for c in chains:
            tot[f"tau{c}"][0] += d[f"tau{c}"][0]
            tot[f"tau{c}"][1] += d[f"tau{c}"][1]
    res["agreement"] = tot["hit"] / max(1, tot["n"])
    res["positions"] = tot["n"]
    res["step_accuracy"] = [round(h / max(1, n), 4) for h, n in zip(tot["step_hit"], tot["step_n"], strict=True)]
    for c in chains:
        res[f"tau{c}"] = tot[f"tau{c}"][0] / max(1, tot[f"tau{c}"][1])
    res["limit"], res["gen_tokens"] = limit, gen_tokens
    return res
