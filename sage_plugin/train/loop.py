"""Stage 2 of draft distillation: train the draft on the target's labels, with exact checkpoint/resume.

The draft (:class:`sage_plugin.train.model.CompactDraft`) is trained on the shards of
:mod:`sage_plugin.train.labels`: cross-entropy on the target's argmax (+ ``--kl-weight`` x KL to the target's
top-k distribution), AdamW, warmup + cosine/linear schedule, gradient clipping; fp32 on CPU, bf16 autocast on
CUDA.  ``DIR/ckpt.pt`` (model, optimizer, step, data cursor, RNG) is written every ``--ckpt-every`` steps;
``--resume`` continues exactly (model/data flags come from the checkpoint).  Every step appends one JSON record
to ``DIR/train_log.jsonl``.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .common import atomic_save, progress_bar, use_amp
from .label_store import LabelStore
from .model import CompactDraft, llama_config, pca_embeddings, select_head_vocab

logger = logging.getLogger(__name__)

__all__ = ["ARG_DEFAULTS", "CKPT_NAME", "resolve_defaults", "load_checkpoint", "train"]

CKPT_NAME = "ckpt.pt"

ARG_DEFAULTS: dict[str, Any] = {}
"""Parser defaults of the ``train-draft`` flags (filled by ``add_train_args``): on resume, a flag left at its
default takes the checkpoint's value."""

_ARCH_KEYS = ("layers", "hidden", "heads", "kv_heads", "intermediate", "head_vocab", "init_embeddings")
_DATA_KEYS = (
    "seq_len",
    "topk",
    "seed",
    "label_dtype",
    "shard_windows",
    "gen_max_new_tokens",
    "val_windows",
    "chat_repeat",
)


_RUN_ONLY_KEYS = {
    "resume",
    "stop_at",
    "max_minutes",
    "no_progress",
    "threads",
    "device",
    "export_dir",
    "no_export",
    "no_eval",
    "labels_only",
    "out",
    "log_level",
    "command",
    "eval_limit",
    "eval_gen_tokens",
    "max_export_mb",
    "eval_cache",
    "gen_url",
    "gen_concurrency",
}


def resolve_defaults(args, device: torch.device) -> None:
    """Fill the device-dependent defaults (recorded in the checkpoint)."""
    gpu = device.type == "cuda"
    auto = {
        "text_tokens": 12_000_000 if gpu else 500_000,
        "gen_prompts": 6000 if gpu else 64,
        "gen_batch": 256 if gpu else 16,
        "label_batch": 64 if gpu else 4,
        "batch_size": 128 if gpu else 16,
        "steps": 10_000 if gpu else 3000,
        "eval_limit": 0 if gpu else 20,
    }
    for k, v in auto.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)


def merge_saved_args(args, saved: dict) -> None:
    """On resume: model/data flags come from the checkpoint; others too unless given on the command line."""
    for key, val in saved.items():
        if key in _RUN_ONLY_KEYS or not hasattr(args, key):
            continue
        cur = getattr(args, key)
        default = ARG_DEFAULTS.get(key)
        if key in _ARCH_KEYS + _DATA_KEYS:
            if cur != val and cur != default:
                logger.warning("--%s %s ignored on resume (checkpoint has %s)", key.replace("_", "-"), cur, val)
            setattr(args, key, val)
        elif cur is None or cur == default:
            setattr(args, key, val)


def load_checkpoint(out: Path, args) -> dict | None:
    """The checkpoint of the run in ``out`` with its saved flags merged into ``args``, or None for a new run.

    An existing checkpoint is only continued with ``--resume``: a run is never overwritten silently.
    """
    ckpt_path = out / CKPT_NAME
    if not ckpt_path.is_file():
        return None
    if not args.resume:
        raise SystemExit(f"{ckpt_path} exists: pass --resume to continue it, or choose another --out")
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    merge_saved_args(args, state["args"])
    return state


def _lr_at(step: int, args) -> float:
    """Learning rate for the update that produces ``step`` (1-based): warmup then cosine/linear/constant."""
    if args.warmup > 0 and step <= args.warmup:
        return args.lr * step / args.warmup
    if args.schedule == "constant":
        return args.lr
    frac = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    lo = args.lr * args.min_lr_ratio
    if args.schedule == "linear":
        return lo + (args.lr - lo) * (1 - frac)
    return lo + 0.5 * (args.lr - lo) * (1 + math.cos(math.pi * frac))


def _epoch_perm(n: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1_000_003 * (seed + 1) + epoch)
    return torch.randperm(n, generator=g)


def _rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _param_groups(model: nn.Module, weight_decay: float):
    decay, no_decay = [], []
    for _n, p in model.named_parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _loss(logits: torch.Tensor, batch: dict, model: CompactDraft, kl_weight: float):
    """CE on the target argmax (+ kl_weight x KL to the target top-k, renormalised over S)."""
    k = model.keep_ids.numel()
    logq = torch.log_softmax(logits.float(), dim=-1)
    t_ids = model.to_compact[batch["topk_ids"].long()]
    label = t_ids[..., 0]
    valid = label < k
    n_valid = valid.sum().clamp(min=1)
    ce = -(logq.gather(-1, label.clamp(max=k - 1)[..., None])[..., 0] * valid).sum() / n_valid
    pred = logits.argmax(-1)
    correct = ((pred == label) & valid).sum()
    stats = {"ce": ce.detach(), "correct": correct, "valid": valid.sum(), "positions": label.numel()}
    loss = ce
    if kl_weight > 0:
        lp = batch["topk_logprobs"].float().masked_fill(t_ids >= k, float("-inf"))
        pos_ok = torch.isfinite(lp).any(-1)
        p = torch.softmax(lp.masked_fill(~pos_ok[..., None], 0.0), -1) * (t_ids < k)
        logq_t = logq.gather(-1, t_ids.clamp(max=k - 1))
        plogp = torch.where(p > 0, p * torch.log(p.clamp(min=1e-30)), torch.zeros_like(p))
        kl = ((plogp - p * logq_t).sum(-1) * pos_ok).sum() / pos_ok.sum().clamp(min=1)
        loss = loss + kl_weight * kl
        stats["kl"] = kl.detach()
    return loss, stats


@torch.no_grad()
def _validate(model: CompactDraft, store: LabelStore, device, amp: bool, batch_size: int) -> dict:
    model.eval()
    tot: dict[str, list[int]] = {}
    for s in range(0, len(store.val_index), batch_size):
        b = store.batch(store.val_index[s : s + batch_size])
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(b["input_ids"].to(device))
        label = b["topk_ids"][..., 0].to(device).long()
        pred_full = model.keep_ids[logits.argmax(-1)]
        hit = (pred_full == label).sum(-1).tolist()
        for src, h in zip(b["source"], hit, strict=False):
            t = tot.setdefault(src, [0, 0])
            t[0] += h
            t[1] += label.shape[1]
    model.train()
    out = {f"val_agree_{k}": v[0] / max(1, v[1]) for k, v in tot.items()}
    allh = sum(v[0] for v in tot.values())
    alln = sum(v[1] for v in tot.values())
    out["val_agree"] = allh / max(1, alln)
    return out


def _build_model(args, state: dict | None, store: LabelStore, tokenizer, target_cfg: dict, target_dir: Path):
    """(model, kept head ids, LlamaConfig): restored from ``state``, or new with the head vocabulary of ``store``."""
    vocab = int(target_cfg["vocab_size"])
    if state is not None:
        keep = state["keep_ids"]
    else:
        counts = store.label_counts(vocab)
        always = [i for i in tokenizer.all_special_ids if i is not None]
        keep = select_head_vocab(counts, args.head_vocab, always)
        label_counts = store.label_counts(vocab, inputs=False)
        cov = label_counts[keep].sum().item() / max(1, label_counts.sum().item())
        logger.info("head vocabulary: %d tokens cover %.2f%% of the target labels", keep.numel(), 100 * cov)
    config = llama_config(target_cfg, args, vocab)
    model = CompactDraft(config, keep, vocab)
    if state is not None:
        model.load_state_dict(state["model"])
    elif args.init_embeddings == "pca":
        pca = pca_embeddings(target_dir, args.hidden)
        if pca is not None:
            with torch.no_grad():
                model.head_weight.copy_(pca[keep])
        else:
            logger.warning("PCA init unavailable (hidden > target hidden or no safetensors): random init")
    return model, keep, config


def train(
    args,
    state: dict | None,
    out: Path,
    target_dir: Path,
    tokenizer,
    target_cfg: dict,
    label_stats: dict,
    device: torch.device,
) -> int:
    """Train (or continue ``state``) up to ``--steps``/``--stop-at``/``--max-minutes``; returns the step reached.

    Writes ``out/ckpt.pt`` and ``out/train_log.jsonl`` and prints the training summary as JSON.
    """
    store = LabelStore(out / "labels", args.val_windows, args.chat_repeat)
    if len(store.train_index) == 0:
        raise SystemExit("no training windows: raise --text-tokens / --gen-prompts")
    logger.info(
        "labels: %d chat + %d text tokens; %d training windows (chat x%d), %d validation windows",
        store.num_tokens("chat"),
        store.num_tokens("text"),
        len(store.train_index),
        args.chat_repeat,
        len(store.val_index),
    )

    model, keep, config = _build_model(args, state, store, tokenizer, target_cfg, target_dir)
    model.to(device).train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(
        _param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda"
    )
    step, epoch, pos, tokens_seen = 0, 0, 0, 0
    if state is not None:
        opt.load_state_dict(state["optim"])
        step, tokens_seen = state["step"], state["tokens_seen"]
        epoch, pos = state["cursor"]["epoch"], state["cursor"]["pos"]
        if state["cursor"].get("n_train") != len(store.train_index):
            logger.warning(
                "the training data changed since the checkpoint (%s -> %d windows)",
                state["cursor"].get("n_train"),
                len(store.train_index),
            )
        _set_rng_state(state["rng"])
    amp = use_amp(args.amp, device)
    log_path = out / "train_log.jsonl"
    ckpt_path = out / CKPT_NAME

    def save_ckpt():
        atomic_save(
            {
                "step": step,
                "tokens_seen": tokens_seen,
                "model": model.state_dict(),
                "optim": opt.state_dict(),
                "cursor": {"epoch": epoch, "pos": pos, "n_train": len(store.train_index)},
                "rng": _rng_state(),
                "args": {k: v for k, v in vars(args).items() if k != "func"},
                "keep_ids": keep,
                "config": config.to_dict(),
                "target_dir": str(target_dir),
                "label_stats": label_stats,
                "data": {
                    "chat_tokens": store.num_tokens("chat"),
                    "text_tokens": store.num_tokens("text"),
                    "chat_prompts": args.gen_prompts,
                },
            },
            ckpt_path,
        )

    perm = _epoch_perm(len(store.train_index), args.seed, epoch)
    stop_at = min(args.steps, args.stop_at) if args.stop_at else args.steps
    bar = progress_bar(total=stop_at, initial=step, desc="train draft", disable=args.no_progress)
    t_start = time.time()
    train_time, train_tokens = 0.0, 0
    logger.info("draft: %.2fM parameters (%d kept head rows) on %s", n_params / 1e6, keep.numel(), device)
    while step < stop_at:
        if args.max_minutes and time.time() - t_start > 60 * args.max_minutes:
            logger.info("--max-minutes reached at step %d", step)
            break
        t0 = time.time()
        idx, need = [], args.batch_size
        while need > 0:
            take = perm[pos : pos + need]
            idx.append(take)
            pos += take.numel()
            need -= take.numel()
            if pos >= perm.numel():
                epoch, pos = epoch + 1, 0
                perm = _epoch_perm(len(store.train_index), args.seed, epoch)
        idx = torch.cat(idx)
        batch = store.batch(store.train_index[idx])
        batch = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}
        step += 1
        lr = _lr_at(step, args)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(batch["input_ids"])
        loss, st = _loss(logits, batch, model, args.kl_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip) if args.grad_clip > 0 else None
        opt.step()
        n_tok = batch["input_ids"].numel()
        tokens_seen += n_tok
        loss_v = loss.detach().item()
        if not math.isfinite(loss_v):
            raise FloatingPointError(f"non-finite loss {loss_v} at step {step}")
        dt = time.time() - t0
        train_time += dt
        train_tokens += n_tok
        rec = {
            "step": step,
            "loss": round(loss_v, 5),
            "ce": round(float(st["ce"]), 5),
            "lr": lr,
            "acc": round(int(st["correct"]) / max(1, int(st["positions"])), 4),
            "tok_s": round(train_tokens / max(train_time, 1e-9), 1),
            "tokens_seen": tokens_seen,
        }
        if "kl" in st:
            rec["kl"] = round(float(st["kl"]), 5)
        if gnorm is not None:
            rec["grad_norm"] = round(float(gnorm), 4)
        if args.eval_every and (step % args.eval_every == 0 or step == stop_at) and len(store.val_index):
            rec.update({k: round(v, 4) for k, v in _validate(model, store, device, amp, args.batch_size).items()})
            bar.write(json.dumps(rec))
        with log_path.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")
        bar.update(1)
        bar.set_postfix(loss=f"{loss_v:.3f}", acc=rec["acc"], tok_s=f"{rec['tok_s']:.0f}")
        if args.ckpt_every and step % args.ckpt_every == 0:
            save_ckpt()
    bar.close()
    save_ckpt()
    summary = {
        "step": step,
        "tokens_seen": tokens_seen,
        "train_tok_s": train_tokens / max(train_time, 1e-9),
        **label_stats,
    }
    if len(store.val_index):
        summary.update(_validate(model, store, device, amp, args.batch_size))
    print(json.dumps({"stage": "train", **summary}, indent=1))
    return step
