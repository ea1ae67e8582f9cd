"""Stage 1 of draft distillation: the target's teacher-forced top-k labels, stored as resumable shards.

Token windows of ``--seq-len`` tokens come from the corpora and chat prompts of :mod:`sage_plugin.train.data`;
the target answers each chat prompt greedily first (its generations are kept in ``DIR/gen/gen_K.pt`` so they are
never redone).  One target forward per window gives, for every position, the target's top-k next-token ids and
log-probabilities (teacher forcing).  Shards (``DIR/labels/chat_K.pt``, ``DIR/labels/text_K.pt``, saved with
``torch.save``: ``input_ids`` int32, ``topk_ids`` int32, ``topk_logprobs`` fp16, ``meta``) are written atomically;
an interrupted run skips finished shards.  ``DIR/labels/manifest.json`` records the label settings, and a run with
other settings is refused.  :class:`~.label_store.LabelStore` reads them back for training.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

from sage_plugin.data.prompts import Prompt, render_chat
from sage_plugin.engines.lm import load_causal_lm

from .answers import GEN_CACHE, IN_PROCESS, answer_store_for
from .common import atomic_save, cut_after_eos, progress_bar
from .data import chat_prompts, text_documents
from .label_store import load_shard
from .server_gen import check_server, server_generations, server_generator

logger = logging.getLogger(__name__)

__all__ = [
    "GEN_SHARD_PROMPTS",
    "LABEL_FORMAT",
    "pad_and_eos",
    "greedy_generate",
    "label_windows",
    "chat_generations",
    "server_prefetch",
    "build_labels",
]

GEN_SHARD_PROMPTS = 64  # prompts per generation shard (fixed: changing it would re-key the shards)
LABEL_FORMAT = 1


def pad_and_eos(tokenizer) -> tuple[int | None, int | None]:
    """(pad id, EOS id) for batched generation: the tokenizer's pad token, or its EOS when it has none."""
    eos = tokenizer.eos_token_id
    return (tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos), eos


@torch.inference_mode()
def greedy_generate(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    batch_size: int,
    pad_id: int,
    eos_id: int | Sequence[int] | None,
    device,
    progress: bool = False,
    desc: str = "generate",
):
    """Greedy continuations (token lists, cut after the first EOS) of ``prompts``; left-padded batches."""
    from transformers import GenerationConfig

    eos = [eos_id] if isinstance(eos_id, int) else list(eos_id or [])
    gcfg = GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=eos or None, num_beams=1
    )
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int]] = [[] for _ in prompts]
    bar = progress_bar(total=len(prompts), desc=desc, disable=not progress)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):
            p = list(prompts[i])
            ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[r, width - len(p) :] = 1
        gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=gcfg)
        new = gen[:, width:].tolist()
        for r, i in enumerate(idx):
            out[i] = cut_after_eos(new[r], eos)
        bar.update(len(idx))
    bar.close()
    return out


@torch.inference_mode()
def label_windows(target, windows: torch.Tensor, topk: int, *, device, dtype: torch.dtype = torch.float32):
    """Teacher-forced top-k next-token ids (int32) and log-probs (fp16) of ``target`` for each window position."""
    decoder, head = target.get_decoder(), target.get_output_embeddings()
    ids = windows.to(device=device, dtype=torch.long)
    use_amp = dtype != torch.float32 and ids.device.type == "cuda"
    with torch.autocast(ids.device.type, dtype=dtype, enabled=use_amp):
        hidden = decoder(input_ids=ids).last_hidden_state
    top_ids = torch.empty(*ids.shape, topk, dtype=torch.int32)
    top_lp = torch.empty(*ids.shape, topk, dtype=torch.float16)
    for b in range(ids.shape[0]):
        with torch.autocast(ids.device.type, dtype=dtype, enabled=use_amp):
            logits = head(hidden[b])
        logits = logits.float()
        vals, idx = logits.topk(topk, dim=-1)
        lp = vals - torch.logsumexp(logits, dim=-1, keepdim=True)
        top_ids[b] = idx.to("cpu", torch.int32)
        top_lp[b] = lp.to("cpu", torch.float16)
    return top_ids, top_lp


class _LazyTarget:
    """Loads the target on first use (a fully cached label stage never loads it)."""

    def __init__(self, target_dir: Path, device: torch.device):
        self.target_dir, self.device, self._model = target_dir, device, None

    def get(self):
        if self._model is None:
            t0 = time.time()
            self._model = load_causal_lm(self.target_dir, device=self.device)
            logger.info("loaded target %s in %.1fs", self.target_dir, time.time() - t0)
        return self._model


def _windows_from_tokens(token_lists: Iterable[Sequence[int]], seq_len: int) -> Iterator[list[int]]:
    buf: list[int] = []
    for toks in token_lists:
        buf.extend(toks)
        while len(buf) >= seq_len:
            yield buf[:seq_len]
            del buf[:seq_len]


def _cyclic_windows(sequences: Sequence[Sequence[int]], seq_len: int) -> list[list[int]]:
    """Pack sequences into windows; the last window is completed with tokens from the start (no padding)."""
    flat = [t for s in sequences for t in s]
    if not flat:
        return []
    n = math.ceil(len(flat) / seq_len)
    while len(flat) < n * seq_len:
        flat.extend(flat[: n * seq_len - len(flat)])
    return [flat[i * seq_len : (i + 1) * seq_len] for i in range(n)]


def _shard_rows(path: Path) -> int:
    try:
        return int(load_shard(path)["input_ids"].shape[0])
    except Exception:  # corrupt / partial file: redo it
        return -1


class _Throughput:
    def __init__(self):
        self.tokens, self.seconds = 0, 0.0

    def add(self, tokens: int, seconds: float):
        self.tokens += tokens
        self.seconds += seconds

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")


def _label_and_save(
    target: _LazyTarget, windows: list[list[int]], path: Path, args, meta: dict, stats: _Throughput, bar
) -> None:
    model = target.get()
    ids = torch.tensor(windows, dtype=torch.int32)
    tops, lps = [], []
    dtype = getattr(torch, args.label_dtype)
    for s in range(0, len(windows), args.label_batch):
        t0 = time.time()
        ti, tl = label_windows(model, ids[s : s + args.label_batch], args.topk, device=target.device, dtype=dtype)
        stats.add(ti.shape[0] * ti.shape[1], time.time() - t0)
        tops.append(ti)
        lps.append(tl)
        bar.update(ti.shape[0] * ti.shape[1])
        bar.set_postfix(tok_s=f"{stats.rate:.0f}")
    atomic_save({"input_ids": ids, "topk_ids": torch.cat(tops), "topk_logprobs": torch.cat(lps), "meta": meta}, path)


def _chat_ids(tokenizer, msgs: list[str]) -> list[list[int]]:
    return [
        render_chat(tokenizer, Prompt(id=str(i), dataset="train", messages=({"role": "user", "content": m},)))
        for i, m in enumerate(msgs)
    ]


def _cached_generations(path: Path, msgs: list[str]) -> dict | None:
    gen = torch.load(path, weights_only=True) if path.is_file() else None
    return gen if gen is not None and gen.get("prompts") == msgs else None


def _save_generations(path: Path, msgs: list[str], ids: list[list[int]], conts: list[list[int]]) -> dict:
    gen = {
        "prompts": msgs,
        "sequences": [torch.tensor(p + c, dtype=torch.int32) for p, c in zip(ids, conts, strict=True)],
    }
    atomic_save(gen, path)
    return gen


def chat_generations(target: _LazyTarget, tokenizer, msgs: list[str], path: Path, args, stats: _Throughput) -> dict:
    """The target's greedy answers to one shard of chat prompts, cached at ``path`` (``gen/gen_K.pt``).

    Returns ``{"prompts": msgs, "sequences": [int32 prompt+answer ids]}``; a cached shard is reused only if it holds
    exactly ``msgs``.  With ``args.answers_dir``, answers already in that :class:`~.answers.AnswerStore` are read from it
    and generated ones (or a cached shard's) are added to it.  Uses ``args.gen_max_new_tokens`` and
    ``args.gen_batch`` (``args.gen_url``: the shards were answered by :func:`server_prefetch` first, so only a shard
    it could not write is generated here).
    """
    store = answer_store_for(args, target.target_dir)
    gen = _cached_generations(path, msgs)
    if gen is not None:
        ids = _chat_ids(tokenizer, msgs) if store is not None and store.usable else None
        if ids is not None and store.lookup(ids) is None:
            conts = [s[len(p) :].tolist() for p, s in zip(ids, gen["sequences"], strict=True)]
            store.add(ids, conts, GEN_CACHE)
        return gen
    ids = _chat_ids(tokenizer, msgs)
    conts = store.lookup(ids) if store is not None else None
    if conts is not None:
        return _save_generations(path, msgs, ids, conts)
    pad, eos = pad_and_eos(tokenizer)
    t0 = time.time()
    conts = greedy_generate(
        target.get(),
        ids,
        args.gen_max_new_tokens,
        batch_size=args.gen_batch,
        pad_id=pad,
        eos_id=eos,
        device=target.device,
    )
    stats.add(sum(len(c) for c in conts), time.time() - t0)
    if store is not None:
        store.add(ids, conts, IN_PROCESS)
    return _save_generations(path, msgs, ids, conts)


def server_prefetch(tokenizer, shards: list[tuple[list[str], Path]], args, target_dir: Path) -> None:
    """With ``args.gen_url``: every shard ``(msgs, path)`` not yet cached is answered by that SGLang server
    (:mod:`.server_gen`, ``args.gen_concurrency`` requests in flight) and saved as :func:`chat_generations` would."""
    if not getattr(args, "gen_url", None):
        return
    store = answer_store_for(args, target_dir)
    todo = []
    for msgs, path in shards:
        if _cached_generations(path, msgs) is not None:
            continue
        ids = _chat_ids(tokenizer, msgs)
        stored = store.lookup(ids) if store is not None else None
        if stored is not None:
            _save_generations(path, msgs, ids, stored)
        else:
            todo.append((msgs, path, ids))
    if not todo:
        return
    check_server(args.gen_url, target_dir)
    _, eos = pad_and_eos(tokenizer)
    generator = server_generator(args.gen_url)

    def save(conts, m, p, i):
        if store is not None:
            store.add(i, conts, generator)
        _save_generations(p, m, i, conts)

    jobs = [(ids, lambda conts, m=msgs, p=path, i=ids: save(conts, m, p, i)) for msgs, path, ids in todo]
    bar = progress_bar(total=sum(len(m) for m, _, _ in todo), desc=f"answers from {args.gen_url}", unit="prompt",
                       disable=args.no_progress)  # fmt: skip
    t0 = time.time()
    n = server_generations(args.gen_url, jobs, args.gen_max_new_tokens, [eos] if eos is not None else [],
                           args.gen_concurrency, bar)  # fmt: skip
    bar.close()
    dt = time.time() - t0
    logger.info("%d answer tokens from %s in %.0f s (%.0f tok/s)", n, args.gen_url, dt, n / max(dt, 1e-9))


def build_labels(args, tokenizer, target_dir: Path, out: Path, device: torch.device) -> dict:
    """Stage 1: generate chat data and label all windows (resumable, idempotent).  Returns statistics."""
    label_dir, gen_dir = out / "labels", out / "gen"
    label_dir.mkdir(parents=True, exist_ok=True)
    gen_dir.mkdir(parents=True, exist_ok=True)
    manifest = {
        "format": LABEL_FORMAT,
        "target": str(target_dir),
        "vocab_size": len(tokenizer),
        "seq_len": args.seq_len,
        "topk": args.topk,
        "seed": args.seed,
        "label_dtype": args.label_dtype,
        "shard_windows": args.shard_windows,
        "gen_max_new_tokens": args.gen_max_new_tokens,
    }
    mpath = label_dir / "manifest.json"
    if mpath.is_file():
        old = json.loads(mpath.read_text())
        diff = {k: (old.get(k), v) for k, v in manifest.items() if k != "target" and old.get(k) != v}
        if diff:
            raise SystemExit(f"{label_dir} was built with other settings {diff}; use another --out")
    else:
        mpath.write_text(json.dumps(manifest, indent=1))
    target = _LazyTarget(target_dir, device)
    stats = {"label": _Throughput(), "gen": _Throughput()}
    progress = not args.no_progress
    pad, eos = pad_and_eos(tokenizer)

    # (c) the target's own answers to chat prompts -> gen/gen_K.pt -> labels/chat_K.pt
    n_prompts = args.gen_prompts
    if n_prompts > 0:
        n_shards = math.ceil(n_prompts / GEN_SHARD_PROMPTS)
        todo = []
        for k in range(n_shards):
            want = min(GEN_SHARD_PROMPTS, n_prompts - k * GEN_SHARD_PROMPTS)
            lpath = label_dir / f"chat_{k:05d}.pt"
            if lpath.is_file():
                meta = load_shard(lpath).get("meta", {})
                if meta.get("n_prompts") == want:
                    continue
            todo.append((k, want))
        if todo:
            prompts = chat_prompts(n_prompts, seed=args.seed)
            bar = progress_bar(
                total=sum(w for _, w in todo), desc="chat data (generate+label)", unit="prompt", disable=not progress
            )
            lbar = progress_bar(total=0, disable=True)
            shard_msgs = {k: prompts[k * GEN_SHARD_PROMPTS : k * GEN_SHARD_PROMPTS + want] for k, want in todo}
            server_prefetch(tokenizer, [(m, gen_dir / f"gen_{k:05d}.pt") for k, m in shard_msgs.items()], args,
                            target_dir)  # fmt: skip
            for k, want in todo:
                gen = chat_generations(
                    target, tokenizer, shard_msgs[k], gen_dir / f"gen_{k:05d}.pt", args, stats["gen"]
                )
                windows = _cyclic_windows([s.tolist() for s in gen["sequences"]], args.seq_len)
                _label_and_save(
                    target,
                    windows,
                    label_dir / f"chat_{k:05d}.pt",
                    args,
                    {"source": "chat", "n_prompts": want},
                    stats["label"],
                    lbar,
                )
                bar.update(want)
                bar.set_postfix(gen_tok_s=f"{stats['gen'].rate:.1f}", label_tok_s=f"{stats['label'].rate:.0f}")
            bar.close()

    # (a)+(b) stdlib sources and python docs -> labels/text_K.pt
    n_windows = args.text_tokens // args.seq_len
    if n_windows > 0:
        sw = args.shard_windows
        n_shards = math.ceil(n_windows / sw)
        have = {
            k: _shard_rows(label_dir / f"text_{k:05d}.pt")
            for k in range(n_shards)
            if (label_dir / f"text_{k:05d}.pt").is_file()
        }
        need = {k for k in range(n_shards) if have.get(k, -1) != min(sw, n_windows - k * sw)}
        if need:
            sep = tokenizer.get_vocab().get("<|endoftext|>", eos)  # document separator
            docs = text_documents(args.seed)
            toks = (tokenizer(text, add_special_tokens=False)["input_ids"] + [sep] for _, text in docs)
            windows_it = _windows_from_tokens(toks, args.seq_len)
            bar = progress_bar(
                total=len(need) * sw * args.seq_len, desc="text labels", unit="tok", disable=not progress
            )
            for k in range(n_shards):
                want = min(sw, n_windows - k * sw)
                chunk = [w for _, w in zip(range(want), windows_it, strict=False)]
                if chunk and k in need:
                    _label_and_save(
                        target, chunk, label_dir / f"text_{k:05d}.pt", args, {"source": "text"}, stats["label"], bar
                    )
                if len(chunk) < want:
                    logger.warning("text corpus exhausted after %d windows", k * sw + len(chunk))
                    break
            bar.close()
    result = {
        "label_tok_s": stats["label"].rate,
        "labelled_tokens": stats["label"].tokens,
        "gen_tok_s": stats["gen"].rate,
        "generated_tokens": stats["gen"].tokens,
    }
    if stats["label"].tokens:
        logger.info(
            "label pass: %d tokens at %.0f tok/s; generation: %d tokens at %.1f tok/s",
            stats["label"].tokens,
            stats["label"].rate,
            stats["gen"].tokens,
            stats["gen"].rate,
        )
    return result
