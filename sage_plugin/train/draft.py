"""Distil a small draft LM from a target causal LM (default: SmolLM2-135M-Instruct), offline.

``sage train-draft --out DIR`` (or ``python -m sage_plugin.train.draft --out DIR``) runs four resumable stages:

1. **Labels** (``DIR/labels``, :mod:`sage_plugin.train.labels`): the target's teacher-forced top-k next-token ids
   and log-probabilities over token windows of CPython stdlib sources, Debian ``python3.11-doc`` when installed, and
   the target's own greedy answers to offline chat prompts (:mod:`sage_plugin.train.data`; MT-Bench and HumanEval
   are held out).  Target generations are kept in ``DIR/gen`` so they are never redone.
2. **Train** a small Llama with a restricted-vocabulary tied head (:mod:`sage_plugin.train.model`) on those labels
   (:mod:`sage_plugin.train.loop`); ``DIR/ckpt.pt`` is written every ``--ckpt-every`` steps and ``--resume``
   continues exactly.
3. **Export** a plain full-vocabulary HF Llama (``DIR/draft``, :mod:`sage_plugin.train.export`): tied embeddings,
   fp16 tensors (loaded as fp32 by default), tokenizer files, ``sage_draft.json`` and a model card.
4. **Evaluate** it on MT-Bench + HumanEval prompts (:func:`evaluate_draft`, :mod:`sage_plugin.train.evaluate`):
   teacher-forced top-1 agreement with the target along the target's own greedy continuation, and the chain-of-4
   tokens per step (tau).

This module is the entry point: the command-line flags (:func:`add_train_args`) and the stage driver
(:func:`train_draft`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from sage_plugin.models import ensure_smollm2, load_tokenizer

from .common import AMP_MODES, progress_bar, resolve_device
from .data import HELD_OUT_DATASETS, chat_prompts, python_doc_files, stdlib_files
from .evaluate import chain_tau, evaluate_draft
from .export import export_draft
from .labels import (
    GEN_SHARD_PROMPTS,
    _chat_ids,
    _LazyTarget,
    _Throughput,
    build_labels,
    chat_generations,
    server_prefetch,
)
from .loop import ARG_DEFAULTS, CKPT_NAME, load_checkpoint, resolve_defaults, train
from .model import CompactDraft, target_config

__all__ = [
    "HELD_OUT_DATASETS",
    "add_train_args",
    "train_draft",
    "export_draft",
    "evaluate_draft",
    "chain_tau",
    "chat_prompts",
    "stdlib_files",
    "python_doc_files",
    "CompactDraft",
    "main",
]


def train_draft(args) -> int:
    """Run labels -> train -> export -> evaluate as configured by :func:`add_train_args`; returns 0."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.kind == "eagle3":
        from .eagle3 import train_eagle3

        if args.device not in ("auto", "cpu"):
            raise SystemExit(f"--device {args.device}: --kind eagle3 trains on CPU only so far (use cpu or auto)")

        for key, val in {"batch_size": 4, "steps": 2000, "gen_batch": 16, "eval_limit": 40}.items():
            if getattr(args, key, None) is None:
                setattr(args, key, val)
        target_dir = Path(args.target) if args.target else ensure_smollm2()
        if args.answers_only:
            return _answers_only(args, target_dir, device)
        return train_eagle3(args, target_dir, load_tokenizer(target_dir))
    out = Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    state = load_checkpoint(out, args)
    resolve_defaults(args, device)
    torch.manual_seed(args.seed)
    random.seed(args.seed)

    target_dir = Path(args.target) if args.target else ensure_smollm2()
    if args.answers_only:
        return _answers_only(args, target_dir, device)
    tokenizer = load_tokenizer(target_dir)
    target_cfg = target_config(target_dir)

    label_stats = build_labels(args, tokenizer, target_dir, out, device)
    if state is not None and not label_stats["labelled_tokens"]:
        label_stats = state.get("label_stats", label_stats)  # keep the measured throughput of the label run
    if args.labels_only:
        print(json.dumps({"stage": "labels", **label_stats}, indent=1))
        return 0

    step = train(args, state, out, target_dir, tokenizer, target_cfg, label_stats, device)
    if step < args.steps or args.no_export:
        return 0
    export_dir = Path(args.export_dir) if args.export_dir else out / "draft"
    export_draft(
        out / CKPT_NAME,
        export_dir,
        target_dir=target_dir,
        evaluate=not args.no_eval,
        eval_limit=args.eval_limit or None,
        eval_gen_tokens=args.eval_gen_tokens,
        device=device,
        max_mb=args.max_export_mb,
        progress=not args.no_progress,
        cache_dir=args.eval_cache,
    )
    return 0


def _collect_answers(args, tokenizer, target_dir: Path, out: Path, pool: int, shard_ids: Sequence[int],
                    device: torch.device) -> int:  # fmt: skip
    """The answer stage alone (``sage train-draft --answers-only``): shard ``k`` is prompts ``[64k, 64k + 64)`` of
    ``chat_prompts(pool)``; each is answered as the training run would answer it (the store, ``--gen-url``, else in
    process) into ``out/gen``.  Returns the answer tokens of the shards."""
    gen_dir = out / "gen"
    gen_dir.mkdir(parents=True, exist_ok=True)
    prompts = chat_prompts(pool, seed=args.seed)
    n = GEN_SHARD_PROMPTS
    shards = [(prompts[k * n : (k + 1) * n], gen_dir / f"gen_{k:05d}.pt") for k in shard_ids]
    server_prefetch(tokenizer, shards, args, target_dir)
    target, stats, total = _LazyTarget(target_dir, device), _Throughput(), 0
    for msgs, path in progress_bar(shards, desc="answers", unit="shard", disable=args.no_progress):
        gen = chat_generations(target, tokenizer, msgs, path, args, stats)
        total += sum(len(s) - len(p) for s, p in zip(gen["sequences"], _chat_ids(tokenizer, msgs), strict=True))
    return total


def _answers_only(args, target_dir: Path, device: torch.device) -> int:
    """``--answers-only``: the target's answers to the shards this run would train on, nothing else (to fill
    ``--answers-dir`` on a machine that has time for the answers but not for a training run)."""
    if args.kind == "eagle3":
        from .eagle3.loop import shard_order

        pool = args.gen_prompt_pool
        shard_ids = shard_order(pool // GEN_SHARD_PROMPTS)[: args.gen_shards]
    else:
        pool = args.gen_prompts
        shard_ids = list(range(math.ceil(pool / GEN_SHARD_PROMPTS)))
    out = Path(args.out).expanduser()
    n = _collect_answers(args, load_tokenizer(target_dir), target_dir, out, pool, shard_ids, device)
    print(json.dumps({"stage": "answers", "shards": len(shard_ids), "answer_tokens": n}))
    return 0


def add_train_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``train-draft`` options to ``parser``.  "auto" defaults depend on the device (CPU: small)."""
    g = parser.add_argument_group("run")
    g.add_argument(
        "--kind",
        default="draft",
        choices=["draft", "eagle3"],
        help="draft: a small standalone Llama (default); eagle3: an EAGLE-3 head on the target's hidden states"
        " (CPU; flags of the 'eagle3 head' group)",
    )
    g.add_argument(
        "--out",
        default=str(Path.home() / ".cache" / "sage_plugin" / "draft-train"),
        help="run directory: labels/, gen/, ckpt.pt, train_log.jsonl, draft/ (default %(default)s)",
    )
    g.add_argument("--resume", action="store_true", help="continue DIR/ckpt.pt exactly (model/data flags come from it)")
    g.add_argument("--target", default=None, help="HF target dir (default: SmolLM2-135M-Instruct, converted once)")
    g.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--amp",
        default="auto",
        choices=AMP_MODES,
        help="bf16 autocast for training (weights and optimizer stay float32): auto = on CUDA only; bf16 = on CPU"
        " too (about 1.9x faster per step on a CPU with AMX-BF16); off",
    )
    g.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    g = parser.add_argument_group("data and labels")
    g.add_argument("--seq-len", type=int, default=256, help="tokens per training window (default %(default)s)")
    g.add_argument(
        "--text-tokens",
        type=int,
        default=None,
        help="stdlib/doc tokens to label (auto: 12M on CUDA = whole corpus, 500k on CPU)",
    )
    g.add_argument(
        "--gen-prompts",
        type=int,
        default=None,
        help="chat prompts the target answers greedily (auto: 6000 on CUDA, 64 on CPU)",
    )
    g.add_argument("--gen-max-new-tokens", type=int, default=256, help="answer length cap (default %(default)s)")
    g.add_argument("--gen-batch", type=int, default=None, help="generation batch (auto: 256 CUDA, 16 CPU)")
    g.add_argument(
        "--gen-url",
        default=None,
        help="answers from an SGLang server already serving the target (http://HOST:PORT; continuous batching:"
        " 155 against 85 tok/s in process on a 2-core CPU)",
    )
    g.add_argument("--gen-concurrency", type=int, default=64, help="--gen-url requests in flight (default %(default)s)")
    g.add_argument(
        "--answers-dir",
        default=None,
        help="keep the target's answers across runs in DIR/<target name>/ (read before generating, added to after;"
        " the repository's store is train-data/answers, docs/design/training-data.md); default: none",
    )
    g.add_argument("--topk", type=int, default=8, help="target top-k ids/log-probs stored per position")
    g.add_argument("--label-batch", type=int, default=None, help="windows per target forward (auto: 64 / 4)")
    g.add_argument(
        "--label-dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="target precision for labels (bfloat16 only used on CUDA)",
    )
    g.add_argument("--shard-windows", type=int, default=128, help="windows per text label shard")
    g.add_argument("--val-windows", type=int, default=32, help="held-out windows per source for periodic validation")
    g.add_argument("--chat-repeat", type=int, default=2, help="weight of target-answer windows in the training mix")
    g.add_argument("--labels-only", action="store_true", help="stop after the label stage")
    g.add_argument("--answers-only", action="store_true", help="only the target's answers to the prompts this run "
                   "would train on (into --out/gen and --answers-dir), then stop: fills the store without a "
                   "training run")  # fmt: skip
    g = parser.add_argument_group("draft model")
    g.add_argument("--layers", type=int, default=2)
    g.add_argument("--hidden", type=int, default=256)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    g.add_argument("--intermediate", type=int, default=1024)
    g.add_argument(
        "--head-vocab",
        type=int,
        default=8192,
        help="train the output head over the N most frequent target labels (0 = full vocabulary)",
    )
    g.add_argument(
        "--init-embeddings",
        default="random",
        choices=["random", "pca"],
        help="random (HF init, default) or pca: the target's embeddings projected on their top principal"
        " directions (slower start in a short CPU test)",
    )
    g = parser.add_argument_group("training")
    g.add_argument("--steps", type=int, default=None, help="total optimizer steps (auto: 10000 CUDA, 3000 CPU)")
    g.add_argument("--stop-at", type=int, default=None, help="stop this invocation at STEP (schedule keeps --steps)")
    g.add_argument("--max-minutes", type=float, default=None, help="stop (with a checkpoint) after this many minutes")
    g.add_argument("--batch-size", type=int, default=None, help="windows per step (auto: 128 CUDA, 16 CPU)")
    g.add_argument("--lr", type=float, default=2e-3)
    g.add_argument("--min-lr-ratio", type=float, default=0.1)
    g.add_argument("--warmup", type=int, default=200)
    g.add_argument("--schedule", default="cosine", choices=["cosine", "linear", "constant"])
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--grad-clip", type=float, default=1.0)
    g.add_argument("--kl-weight", type=float, default=0.5, help="weight of KL to the target top-k (0 = CE only)")
    g.add_argument("--ckpt-every", type=int, default=500)
    g.add_argument("--eval-every", type=int, default=250, help="validation agreement every N steps (0 = never)")
    g = parser.add_argument_group("export and evaluation")
    g.add_argument("--export-dir", default=None, help="HF draft output (default OUT/draft)")
    g.add_argument("--no-export", action="store_true")
    g.add_argument("--no-eval", action="store_true", help="export without measuring on MT-Bench/HumanEval")
    g.add_argument(
        "--eval-limit", type=int, default=None, help="prompts per held-out set, 0 = all (auto: 20 on CPU, all on CUDA)"
    )
    g.add_argument("--eval-gen-tokens", type=int, default=64)
    g.add_argument("--max-export-mb", type=float, default=32.0)
    g.add_argument(
        "--eval-cache",
        default=None,
        help="where the target's held-out continuations are cached (default ~/.cache/sage_plugin/eval_continuations)",
    )
    from .eagle3 import add_eagle3_args

    add_eagle3_args(parser)
    for a in parser._actions:
        if a.dest not in ("help",):
            ARG_DEFAULTS.setdefault(a.dest, a.default)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sage_plugin.train.draft", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="INFO")
    add_train_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    return train_draft(args)


if __name__ == "__main__":
    sys.exit(main())
