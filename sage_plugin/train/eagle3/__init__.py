"""EAGLE-3 heads for a Llama target: ``sage train-draft --kind eagle3`` (stages in :mod:`.loop`)."""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

__all__ = ["add_eagle3_args", "train_eagle3"]

logger = logging.getLogger(__name__)


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 (got {text})")
    return value


def add_eagle3_args(parser: argparse.ArgumentParser) -> None:
    """Flags used by ``--kind eagle3`` only (the shared ones: --out, --steps, --lr, --batch-size, --seq-len...)."""
    g = parser.add_argument_group("eagle3 head (--kind eagle3)")
    g.add_argument("--gen-shards", type=int, default=24, help="shards of 64 chat prompts the target answers")
    g.add_argument("--gen-prompt-pool", type=int, default=9088, help="size of the chat prompt list shards cut")
    g.add_argument("--ttt-steps", type=int, default=5, help="draft steps unrolled in training (training-time test)")
    g.add_argument("--decay", type=float, default=0.8, help="loss weight of unrolled step k is decay**k")
    g.add_argument(
        "--length-groups",
        type=_at_least_one,
        default=1,
        help="G > 1: each batch is one of G length-sorted blocks of G x batch-size random windows (less padding);"
        " 1 (default): uniform batches",
    )
    g.add_argument("--aux-layers", default=None, help="comma-separated target layer ids (default SGLang's)")
    g.add_argument("--eval-chains", default="4,5", help="chain lengths of the held-out tau")
    g.add_argument(
        "--init-head",
        default="random",
        choices=["random", "target"],
        help="random (default); target: lm_head and final norm start from the target's (on SmolLM2 no better over"
        " the first 120 steps: step-0 accuracy 0.20 vs 0.21)",
    )


def _hot_ids(args, store, ckpt: Path, vocab: int, tokenizer) -> torch.Tensor:
    from sage_plugin.models import bundled_draft_dir, draft_head_ids

    from .loop import hot_vocabulary

    if args.resume and ckpt.is_file():
        d2t = torch.load(ckpt, map_location="cpu", weights_only=False)["head"]["d2t"]
        return d2t + torch.arange(d2t.numel())
    always = sorted(
        {i for i in (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id) if i is not None}
    )
    bundled = bundled_draft_dir()
    prior = draft_head_ids(bundled) if bundled is not None else None
    return hot_vocabulary(store, vocab, args.head_vocab, always, prior=prior)


def train_eagle3(args, target_dir: Path, tokenizer) -> int:
    """Answers -> features -> train -> export -> evaluate (see :mod:`.loop`); returns 0."""
    from sage_plugin.engines.eagle3 import default_aux_layers
    from sage_plugin.engines.lm import load_causal_lm
    from sage_plugin.models import DEFAULT_CACHE_DIR

    from ..labels import _LazyTarget
    from .data import FeatureStore
    from .export import evaluate_head, export_head
    from .loop import CKPT, init_from_target, make_head, prepare_features, train_head

    out = Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    if (out / CKPT).is_file() and not args.resume:
        raise SystemExit(f"{out / CKPT} exists: pass --resume to continue it, or choose another --out")
    target_cfg = json.loads((target_dir / "config.json").read_text())
    aux = (
        [int(x) for x in args.aux_layers.split(",")]
        if args.aux_layers
        else list(default_aux_layers(target_cfg["num_hidden_layers"]))
    )
    target = _LazyTarget(target_dir, torch.device("cpu"))
    t0 = time.time()
    paths = prepare_features(args, tokenizer, target, out, aux)
    data_min = (time.time() - t0) / 60
    store = FeatureStore(paths, args.seq_len, progress=not args.no_progress)
    vocab = target_cfg["vocab_size"]
    tmodel = load_causal_lm(target_dir)
    embedding = tmodel.get_input_embeddings().weight.detach()
    head = make_head(target_cfg, embedding, _hot_ids(args, store, out / CKPT, vocab, tokenizer), args.intermediate)
    if args.init_head == "target":
        init_from_target(head, tmodel)
    del tmodel
    g = torch.Generator().manual_seed(args.seed)
    val_rows = torch.randperm(len(store.windows), generator=g)[: args.val_windows].tolist()
    stats = train_head(args, head, store, out, val_rows)
    if stats["steps"] < args.steps or args.no_export:
        return 0
    record = {
        "target": target_cfg.get("_model_name_or_path", str(target_dir)),
        "aux_layers": aux,
        "data": {
            "shards": sum(p.name.startswith("feat_") for p in paths),
            "text_shards": sum(p.name.startswith("text_") for p in paths),
            "windows": len(store.windows),
            "tokens": store.num_tokens(),
        },
        "train_args": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, type(None)))},
        "minutes": {"data (this invocation)": round(data_min, 1), "train": round(stats["train_minutes"], 1)},
    }
    head_dir = Path(args.export_dir) if args.export_dir else out / "head"
    export_head(head, target_dir, head_dir, aux, record, card="(evaluation pending)\n")
    if not args.no_eval:
        chains = tuple(int(c) for c in args.eval_chains.split(","))
        cache = Path(args.eval_cache) if args.eval_cache else DEFAULT_CACHE_DIR / "eval_continuations"
        record["heldout"] = evaluate_head(
            target_dir,
            head_dir,
            limit=args.eval_limit or None,
            gen_tokens=args.eval_gen_tokens,
            chains=chains,
            cache=cache,
        )
        print(json.dumps(record["heldout"], indent=1))
    from .card import model_card

    export_head(head, target_dir, head_dir, aux, record, card=model_card(record))
    return 0
