"""Stage 4 of draft distillation: measure a draft against its target on held-out prompts.

:func:`evaluate_draft` runs on the MT-Bench + HumanEval prompts (never used for training, see
:data:`sage_plugin.train.data.HELD_OUT_DATASETS`): teacher-forced top-1 agreement with the target along the
target's own greedy continuation, and the chain-of-4 tokens per step (tau, :func:`chain_tau`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from sage_plugin.data.prompts import load_prompts, render_chat
from sage_plugin.engines.lm import load_causal_lm
from sage_plugin.models import DEFAULT_CACHE_DIR, draft_head_ids, load_tokenizer

from .common import resolve_device
from .data import HELD_OUT_DATASETS
from .labels import greedy_generate, pad_and_eos

__all__ = ["chain_tau", "chain_accept", "eval_cache_key", "heldout_continuations", "evaluate_draft"]

_COUNTERS = ("hit", "n", "tokens", "steps", "prompts", "rare", "selfmatch")


def chain_tau(matches: Sequence[bool], chain: int = 4) -> tuple[int, int]:
    """Simulate chain drafting over a teacher-forced match sequence: (tokens emitted, target steps).

    Each step accepts the consecutive matches from the current position (at most ``chain``) plus one
    target token (correction or bonus), then advances past them.

    >>> chain_tau([True] * 10)
    (10, 2)
    >>> chain_tau([False, True, True, False])
    (4, 2)
    """
    return chain_accept([matches[i : i + chain] for i in range(len(matches))], 0, len(matches), chain)


def chain_accept(match, start: int, end: int, chain: int) -> tuple[int, int]:
    """(tokens emitted, target steps) of chain drafting over rows ``start..end - 1`` of ``match`` [rows, >= chain]
    (a bool tensor or nested sequences).

    ``match[i][a]`` says whether draft step ``a`` of a round at row ``i`` is the token emitted at row ``i + a``
    (rows count emitted tokens).  A round accepts the leading matches of ``match[i][:chain]`` that stay before
    ``end``, plus one target token, then moves to row ``i + accepted + 1``.  An EAGLE head's rows depend on where
    the round started (:func:`sage_plugin.train.eagle3.loss.step_matches`); a standalone draft's do not
    (:func:`chain_tau`).

    >>> chain_accept([[True, True, False], [False] * 3, [False] * 3, [True, False, False], [False] * 3], 0, 5, 3)
    (5, 2)
    """
    rows = match.tolist() if isinstance(match, torch.Tensor) else match
    i, tokens, steps = start, 0, 0
    while i < end:
        a = 0
        while a < chain and i + a < end and rows[i][a]:
            a += 1
        adv = min(a + 1, end - i)
        tokens += adv
        steps += 1
        i += adv
    return tokens, steps


def eval_cache_key(target_dir: Path, gen_tokens: int) -> str:
    w = target_dir / "model.safetensors"
    sig = f"{target_dir.resolve()}|{w.stat().st_size if w.is_file() else 0}|{gen_tokens}"
    return hashlib.sha1(sig.encode()).hexdigest()[:16]


def heldout_continuations(
    target,
    tok,
    dataset: str,
    *,
    limit: int | None,
    gen_tokens: int,
    cache: Path,
    key: str,
    batch_size: int,
    progress: bool = False,
):
    """(prompts, rendered prompt ids, {prompt id: target's greedy continuation}) of one held-out set, cached."""
    prompts = load_prompts(dataset, limit=limit)
    ids = [render_chat(tok, p) for p in prompts]
    cpath = cache / f"{key}_{dataset}.pt"
    conts: dict[str, list[int]] = torch.load(cpath, weights_only=True) if cpath.is_file() else {}
    missing = [i for i, p in enumerate(prompts) if p.id not in conts]
    if missing:
        pad, eos = pad_and_eos(tok)
        new = greedy_generate(
            target,
            [ids[i] for i in missing],
            gen_tokens,
            batch_size=batch_size,
            pad_id=pad,
            eos_id=eos,
            device=next(target.parameters()).device,
            progress=progress,
            desc=f"target continuations {dataset}",
        )
        for i, c in zip(missing, new, strict=False):
            conts[prompts[i].id] = c
        torch.save(conts, cpath)
    return prompts, ids, conts


@torch.inference_mode()
def evaluate_draft(
    target_dir: str | Path,
    draft_dir: str | Path,
    *,
    datasets: Sequence[str] = HELD_OUT_DATASETS,
    limit: int | None = None,
    gen_tokens: int = 64,
    chain: int = 4,
    device: str | torch.device | None = None,
    batch_size: int | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = False,
    verbose: bool = True,
) -> dict:
    """Teacher-forced top-1 agreement and chain-of-``chain`` tau of a draft on held-out prompts.

    For each prompt (``limit`` per dataset, default all) the target greedily generates ``gen_tokens`` tokens
    (cached under ``cache_dir``); both models then run one forward over prompt + continuation.  At each position
    that predicts a continuation token, the draft's argmax is compared with the target's argmax.  tau is computed
    from that match sequence with :func:`chain_tau` (tokens per target step, bonus included).
    """
    target_dir, draft_dir = Path(target_dir), Path(draft_dir)
    dev = resolve_device(str(device) if device is not None else "auto")
    batch_size = batch_size or (64 if dev.type == "cuda" else 8)
    tok = load_tokenizer(target_dir)
    target = load_causal_lm(target_dir, device=dev)
    draft = load_causal_lm(draft_dir, device=dev)
    head_ids = draft_head_ids(draft_dir)
    if head_ids is not None:
        head_ids = head_ids.to(dev)
    cache = Path(cache_dir) if cache_dir else DEFAULT_CACHE_DIR / "eval_continuations"
    cache.mkdir(parents=True, exist_ok=True)
    key = eval_cache_key(target_dir, gen_tokens)
    per: dict[str, dict] = {}
    tot = dict.fromkeys(_COUNTERS, 0)
    for ds in datasets:
        prompts, ids, conts = heldout_continuations(
            target,
            tok,
            ds,
            limit=limit,
            gen_tokens=gen_tokens,
            cache=cache,
            key=key,
            batch_size=batch_size,
            progress=progress,
        )
        d = dict.fromkeys(_COUNTERS, 0)
        for p, pid in zip(prompts, ids, strict=False):
            cont = conts[p.id]
            if not cont:
                continue
            seq = torch.tensor([pid + cont], device=dev)
            lo, hi = len(pid) - 1, len(pid) - 1 + len(cont)
            t_arg = target(input_ids=seq).logits[0, lo:hi].argmax(-1)
            d_arg = draft(input_ids=seq).logits[0, lo:hi].argmax(-1)
            m = (t_arg == d_arg).tolist()
            k, s = chain_tau(m, chain)
            d["hit"] += sum(m)
            d["n"] += len(m)
            d["tokens"] += k
            d["steps"] += s
            d["prompts"] += 1
            d["selfmatch"] += int((t_arg == torch.tensor(cont, device=dev)).sum())
            if head_ids is not None:
                d["rare"] += int((~torch.isin(d_arg, head_ids)).sum())
        for kk in tot:
            tot[kk] += d[kk]
        per[ds] = {
            "prompts": d["prompts"],
            "positions": d["n"],
            "agreement": d["hit"] / max(1, d["n"]),
            "tau": d["tokens"] / max(1, d["steps"]),
        }
    result = {
        "agreement": tot["hit"] / max(1, tot["n"]),
        "tau": tot["tokens"] / max(1, tot["steps"]),
        "chain": chain,
        "gen_tokens": gen_tokens,
        "prompts": tot["prompts"],
        "positions": tot["n"],
        "per_dataset": per,
        "target_greedy_consistency": tot["selfmatch"] / max(1, tot["n"]),
        "rare_argmax_rate": (tot["rare"] / max(1, tot["n"])) if head_ids is not None else None,
        "draft": str(draft_dir),
        "target": str(target_dir),
    }
    if verbose:
        print(json.dumps(result, indent=1))
    return result
