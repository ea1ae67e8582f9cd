"""``sage train-draft --kind eagle3``: generate, extract features, train (resumable), export and evaluate a head.

Stages, each resumable in ``--out``:

1. **Answers** (``gen/gen_K.pt``): the target's greedy answers to the offline chat prompts, 64 per shard
   (:func:`sage_plugin.train.labels.chat_generations`, shared with the standalone draft's label stage).
   ``--gen-shards`` picks how many shards; the instruction-category shards (prompt index >= 3,072) come two in three.
2. **Features** (``feat/feat_K.pt``, :mod:`.data`): captured target layers and top-k labels for each sequence.
3. **Train** (``eagle3_ckpt.pt`` every ``--ckpt-every`` steps; ``--resume`` continues it): AdamW over the
   training-time-test loss (:func:`.loss.ttt_loss`), ``--ttt-steps`` unrolled draft steps.
4. **Export** (``OUT/head``, :mod:`.export`) in SGLang's ``LlamaForCausalLMEagle3`` format and **evaluate** on the
   held-out MT-Bench + HumanEval continuations (top-1 agreement, chain tau).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import torch

from sage_plugin.engines.eagle3 import Eagle3Head, eagle3_shape

from ..common import atomic_save, progress_bar, use_amp
from ..data import chat_prompts, text_documents
from ..labels import (
    GEN_SHARD_PROMPTS,
    _chat_ids,
    _LazyTarget,
    _Throughput,
    _windows_from_tokens,
    chat_generations,
    server_prefetch,
)
from .data import FeatureStore, build_feature_shard
from .loss import target_to_draft, ttt_loss

logger = logging.getLogger(__name__)

__all__ = ["CKPT", "batch_rows", "shard_order", "prepare_features", "make_head", "init_from_target", "train_head"]

CKPT = "eagle3_ckpt.pt"
_INSTRUCTION_SHARD = 3072 // GEN_SHARD_PROMPTS  # first shard of the instruction-category mix
TEXT_WINDOW = 256  # tokens per stdlib-source window


def shard_order(n_total: int) -> list[int]:
    """Generation shards in the order they are produced: two instruction-mix shards, then one early-mix shard.

    >>> shard_order(52)[:6]
    [48, 49, 0, 50, 51, 1]
    """
    late, early = list(range(_INSTRUCTION_SHARD, n_total)), list(range(min(_INSTRUCTION_SHARD, n_total)))
    out: list[int] = []
    while late or early:
        out += late[:2] + early[:1]
        late, early = late[2:], early[1:]
    return out


def prepare_features(args, tokenizer, target: _LazyTarget, out: Path, aux_layers) -> list[Path]:
    """Stages 1-2 for ``args.gen_shards`` shards; returns the feature shard paths (existing ones are kept)."""
    gen_dir, feat_dir = out / "gen", out / "feat"
    gen_dir.mkdir(parents=True, exist_ok=True)
    feat_dir.mkdir(parents=True, exist_ok=True)
    prompts = chat_prompts(args.gen_prompt_pool, seed=args.seed)
    order = shard_order(len(prompts) // GEN_SHARD_PROMPTS)[: args.gen_shards]
    stats = _Throughput()

    def msgs_of(k: int) -> list[str]:
        return prompts[k * GEN_SHARD_PROMPTS : (k + 1) * GEN_SHARD_PROMPTS]

    todo = [k for k in order if not (feat_dir / f"feat_{k:05d}.pt").is_file()]
    server_prefetch(tokenizer, [(msgs_of(k), gen_dir / f"gen_{k:05d}.pt") for k in todo], args, target.target_dir)
    paths = []
    bar = progress_bar(order, desc="answers + features", unit="shard", disable=args.no_progress)
    for k in bar:
        fpath = feat_dir / f"feat_{k:05d}.pt"
        paths.append(fpath)
        if fpath.is_file():
            continue
        msgs = msgs_of(k)
        gen = chat_generations(target, tokenizer, msgs, gen_dir / f"gen_{k:05d}.pt", args, stats)
        plens = [len(ids) for ids in _chat_ids(tokenizer, msgs)]
        build_feature_shard(target.get(), gen, plens, fpath, aux_layers, args.topk)
    return paths + _text_features(args, tokenizer, target, feat_dir, aux_layers)


def _text_features(args, tokenizer, target: _LazyTarget, feat_dir: Path, aux_layers) -> list[Path]:
    """``--text-tokens`` of CPython stdlib sources in 256-token windows (every position trained), 64 per shard."""
    n_windows = (args.text_tokens or 0) // TEXT_WINDOW
    if n_windows <= 0:
        return []
    n_shards = math.ceil(n_windows / GEN_SHARD_PROMPTS)
    paths = [feat_dir / f"text_{k:05d}.pt" for k in range(n_shards)]
    if all(p.is_file() for p in paths):
        return paths
    sep = tokenizer.get_vocab().get("<|endoftext|>", tokenizer.eos_token_id)
    docs = text_documents(args.seed)
    windows = _windows_from_tokens(
        (tokenizer(text, add_special_tokens=False)["input_ids"] + [sep] for _, text in docs), TEXT_WINDOW
    )
    for k, path in enumerate(progress_bar(paths, desc="text features", unit="shard", disable=args.no_progress)):
        chunk = [torch.tensor(w, dtype=torch.int32) for _, w in zip(range(GEN_SHARD_PROMPTS), windows, strict=False)]
        if not path.is_file() and chunk:
            build_feature_shard(target.get(), {"sequences": chunk}, [0] * len(chunk), path, aux_layers, args.topk)
        if len(chunk) < GEN_SHARD_PROMPTS:
            return paths[: k + 1] if chunk else paths[:k]
    return paths


def make_head(target_cfg: dict, embedding: torch.Tensor, hot_ids: torch.Tensor, intermediate: int) -> Eagle3Head:
    """A fresh head for a Llama target config (``hidden_size``, heads, rope theta, eps from the target)."""
    return Eagle3Head(eagle3_shape(target_cfg, intermediate, int(hot_ids.numel())), embedding, hot_ids)


@torch.no_grad()
def init_from_target(head: Eagle3Head, target) -> None:
    """Start the head's output side where the target's is: ``lm_head`` = the target's output rows of the draft
    vocabulary, ``norm`` = the target's final norm (EAGLE-1/2 keep the target's head frozen; here it only starts
    there), so the head's output learns to look like the target's last hidden state from the first step."""
    head.lm_head.weight.copy_(target.get_output_embeddings().weight[head.hot_ids].float())
    head.norm.weight.copy_(target.get_decoder().norm.weight.float())


def hot_vocabulary(
    store: FeatureStore, vocab: int, n: int, always: list[int], prior: torch.Tensor | None = None
) -> torch.Tensor:
    """The ``n`` target ids most often the target's argmax in the features, ascending.

    ``always`` ids are kept whatever their count; ids in ``prior`` (e.g. a draft vocabulary chosen on more data)
    win ties, so a small feature set does not fill the vocabulary's tail arbitrarily.
    """
    counts = torch.zeros(vocab, dtype=torch.float64)
    for sh in store.shards:
        counts += torch.bincount(sh["topk_ids"][:, 0].long(), minlength=vocab).double()
    if prior is not None:
        counts[prior.long()] += 0.5
    counts[torch.tensor(always, dtype=torch.long)] = counts.max() + 1
    return torch.sort(counts.topk(n).indices).values


def batch_rows(rows: list[int], lengths: list[int], step: int, batch: int, seed: int, groups: int = 1) -> list[int]:
    """The training rows of optimizer step ``step`` (stateless: a resumed run draws the same batches).

    ``groups`` = 1: ``batch`` rows drawn uniformly without replacement.  ``groups`` = G > 1 (``--length-groups``):
    ``G * batch`` rows drawn, sorted by window length and cut into G blocks, one block taken at random, so a batch
    holds windows of similar length (little padding, where uniform batches of mixed lengths pad to well above the
    tokens they train) while every row stays equally likely in every step.

    >>> batch_rows(list(range(10)), [5, 1, 9, 3, 7, 2, 8, 4, 6, 0], step=0, batch=2, seed=0, groups=4)
    [8, 4]
    """
    g = torch.Generator().manual_seed(seed + step)
    drawn = [rows[i] for i in torch.randperm(len(rows), generator=g)[: batch * max(1, groups)].tolist()]
    if groups <= 1:
        return drawn
    drawn.sort(key=lambda r: (lengths[r], r))
    blocks = [drawn[i : i + batch] for i in range(0, len(drawn), batch)]
    return blocks[int(torch.randint(len(blocks), (1,), generator=g))]


def _lr(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def train_head(args, head: Eagle3Head, store: FeatureStore, out: Path, val_rows: list[int]) -> dict:
    """AdamW over :func:`ttt_loss`; checkpoint/resume in ``out / CKPT``; logs to ``out / eagle3_log.jsonl``.

    Returns ``{"steps", "train_minutes"}`` (minutes summed over every invocation of the run)."""
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))
    step, spent = 0, 0.0
    ck = out / CKPT
    if args.resume and ck.is_file():
        st = torch.load(ck, map_location="cpu", weights_only=False)
        head.load_state_dict(st["head"])
        opt.load_state_dict(st["opt"])
        step = st["step"]
        spent = st.get("train_seconds", 0.0)
        logger.info("resumed at step %d", step)
    log_path = out / "eagle3_log.jsonl"
    if log_path.is_file():  # steps logged after the checkpoint are run again: drop them
        kept = [ln for ln in log_path.read_text().splitlines() if ln and json.loads(ln)["step"] <= step]
        log_path.write_text("".join(ln + "\n" for ln in kept))
    held = set(val_rows)
    train_rows = [r for r in range(len(store.windows)) if r not in held]
    lengths = [w[2] for w in store.windows]
    t2d = target_to_draft(head)
    amp = use_amp(args.amp, torch.device("cpu"))  # the head trains on the CPU
    log = log_path.open("a")
    t_start = time.time()
    bar = progress_bar(total=args.steps, initial=step, desc="train eagle3", disable=args.no_progress)
    while step < args.steps:
        if args.max_minutes and (time.time() - t_start) / 60 > args.max_minutes:
            break
        rows = batch_rows(train_rows, lengths, step, args.batch_size, args.seed, args.length_groups)
        for g in opt.param_groups:
            g["lr"] = _lr(step, args)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss, accs = ttt_loss(head, store.batch(rows), args.ttt_steps, args.decay, t2d)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", acc0=f"{accs[0]:.3f}")
        rec = {
            "step": step,
            "loss": float(loss.detach()),
            "acc": [round(a, 4) for a in accs],
            "lr": _lr(step - 1, args),
        }
        if args.eval_every and step % args.eval_every == 0:
            rec["val_acc"] = validate(head, store, val_rows, args, t2d)
            logger.info("step %d val per-step acc %s", step, rec["val_acc"])
        log.write(json.dumps(rec) + "\n")
        log.flush()
        if step % args.ckpt_every == 0 or step == args.steps:
            atomic_save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step,
                         "train_seconds": spent + time.time() - t_start}, ck)  # fmt: skip
    bar.close()
    total = spent + time.time() - t_start
    atomic_save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "train_seconds": total}, ck)
    return {"steps": step, "train_minutes": total / 60}


@torch.no_grad()
def validate(head: Eagle3Head, store: FeatureStore, rows: list[int], args, t2d) -> list[float]:
    """Per-step top-1 accuracy on held-back windows of the training distribution."""
    accs: list[list[float]] = []
    amp = use_amp(args.amp, torch.device("cpu"))
    for s in range(0, len(rows), args.batch_size):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            _, a = ttt_loss(head, store.batch(rows[s : s + args.batch_size]), args.ttt_steps, args.decay, t2d)
        accs.append(a)
    n = min(len(a) for a in accs)
    return [round(sum(a[k] for a in accs) / len(accs), 4) for k in range(n)]
