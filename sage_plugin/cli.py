"""The ``sage`` command line.

``sage bench``        compare ar / chain / static / eagle2 / sage (and ablations) on bundled prompts.
``sage train-draft``  distil a draft model for a target (see :mod:`sage_plugin.train.draft`).
``sage bench-serving`` SGLang with SAGE vs plain SGLang, side by side (see :mod:`sage_plugin.bench.serving`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
from pathlib import Path

from .config import ConfigError, SageConfig

logger = logging.getLogger("sage_plugin")


def _bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmark SAGE against its baselines on bundled prompts")
    p.add_argument(
        "--quick", action="store_true", help="small run: 6 text prompts x 64 tokens (2-3 min on 2 CPU cores)"
    )
    p.add_argument(
        "--methods",
        default=None,
        help="comma list of ar, chain, static, eagle2, sage, sage-paper, named ablations (README) and variants "
        "NAME=POLICY:k=v,k=v (default: ar,chain,static,eagle2,sage,sage-paper)",
    )
    p.add_argument(
        "--datasets",
        default="mixed",
        help="mixed (round-robin mt_bench/gsm8k/humaneval), or comma list of mt_bench,gsm8k,humaneval,vlm",
    )
    p.add_argument("--num-prompts", type=int, default=None, help="prompts in total (default 20, quick 6)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 128, quick 64")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples (lossless)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--target", default=None, help="HF target dir (default: bundled SmolLM2-135M-Instruct, converted once)"
    )
    p.add_argument("--draft", default=None, help="HF draft dir (default: the shipped draft, else a stand-in)")
    p.add_argument(
        "--draft-vlm",
        default=None,
        help="with --datasets vlm: a VLM draft dir (SpecVLM pruning at prune_ratio_image) instead of a text draft",
    )
    p.add_argument(
        "--standin-layers", type=int, default=4, help="layers of the target used as stand-in draft when none ships"
    )
    p.add_argument("--config", default=None, help="YAML with SAGE options (top-level or under 'sage:')")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override one SAGE option (repeatable)"
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--cache-dir", default=None, help="where converted models are cached")
    p.add_argument("--json", default=None, metavar="PATH", help="write results as JSON")
    p.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots")
    p.add_argument("--no-progress", action="store_true")


def _base_config(args) -> SageConfig:
    import yaml

    cfg = SageConfig.from_yaml(args.config) if args.config else SageConfig()
    changes = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        changes[key.strip()] = yaml.safe_load(value)
    return cfg.replace(**changes) if changes else cfg


def bench_main(args) -> int:
    import torch

    from .bench.methods import DEFAULT_METHODS, parse_methods
    from .bench.prompts import load_prompts, mixed_text_prompts, render_chat
    from .bench.report import markdown_table, summarize, write_plots
    from .bench.run import run_methods
    from .engines.adapters import GenRequest, TextAdapter
    from .engines.speculative import SamplingParams, SpecEngine
    from .models import (
        DEFAULT_CACHE_DIR,
        bundled_draft_dir,
        draft_head_ids,
        ensure_smollm2,
        load_causal_lm,
        load_tokenizer,
        truncated_draft,
    )

    base = _base_config(args)
    methods = parse_methods(args.methods or ",".join(DEFAULT_METHODS), base)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    cache = Path(args.cache_dir) if args.cache_dir else DEFAULT_CACHE_DIR
    num = args.num_prompts or (6 if args.quick else 20)
    max_new = args.max_new_tokens or (64 if args.quick else 128)

    target_dir = ensure_smollm2(cache)
    if args.draft:
        draft_dir, draft_desc = Path(args.draft), f"{args.draft} (user-supplied)"
    elif bundled_draft_dir() is not None:
        draft_dir, draft_desc = bundled_draft_dir(), "shipped trained SmolLM2 draft"
    else:
        draft_dir = truncated_draft(target_dir, args.standin_layers, cache)
        draft_desc = (
            f"STAND-IN: first {args.standin_layers} layers of the target (no trained draft ships yet; "
            "tau and speed-ups are not representative of a real draft)"
        )
    if args.datasets == "vlm":
        engine, requests, tok, target_desc, draft_desc = _vlm_setup(
            args, base, target_dir, draft_dir, draft_desc, num, device, cache
        )
    else:
        if args.target:
            target_dir = Path(args.target)
        target_desc = str(target_dir)
        tok = load_tokenizer(target_dir)
        engine = SpecEngine(
            TextAdapter(load_causal_lm(target_dir, device)),
            TextAdapter(load_causal_lm(draft_dir, device), draft_head_ids(draft_dir)),
        )
        if args.datasets == "mixed":
            prompts = mixed_text_prompts(num)
        else:
            names = args.datasets.split(",")
            if "vlm" in names:
                raise ConfigError("--datasets vlm cannot be mixed with text datasets in one run")
            per = -(-num // len(names))
            prompts = [p for n in names for p in load_prompts(n, per)][:num]
        requests = [GenRequest(render_chat(tok, p), request_id=p.id) for p in prompts]
    params = SamplingParams(args.temperature, args.top_k, args.top_p, max_new, (tok.eos_token_id,), args.seed)

    print(
        f"target: {target_desc}\ndraft:  {draft_desc}\ndevice: {device} ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads)\nprompts: {len(requests)} x {max_new} new tokens, batch {args.batch_size}, "
        f"{'greedy' if args.temperature <= 0 else f'temperature {args.temperature}'}",
        flush=True,
    )
    results = run_methods(engine, methods, requests, params, args.batch_size, args.warmup, not args.no_progress)
    config = {
        "sage": base.to_dict(),
        "methods": {m.name: (m.config.to_dict() if m.config else None) for m in methods},
        "target": target_desc,
        "draft": draft_desc,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "num_prompts": len(requests),
        "max_new_tokens": max_new,
        "batch_size": args.batch_size,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "datasets": args.datasets,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "round_costs": {
            f"batch {b}, {n} nodes": {"verify_ms": [round(float(x), 2) for x in c.verify_ms], "draft_ms": round(c.draft_ms, 2)}
            for (b, n, _), c in engine.round_costs.items()
        },
    }
    summary = summarize(results, config)
    print()
    print(markdown_table(summary, args.temperature <= 0))
    print("\ntau = decode tokens per target forward (bonus included; ar = 1.00); accepted/round excludes the bonus.")
    for (b, _, _), c in engine.round_costs.items():
        v = c.verify_ms
        shown = ", ".join(f"{q + 1}: {float(v[q]):.1f}" for q in (0, 1, 2, 3, 5, 8, 15, 24) if q < len(v))
        print(
            f"node_budget=auto, batch {b}: target forward ms by verified tokens (measured here) {shown}; "
            f"draft forward {c.draft_ms:.1f} ms"
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2))
        print(f"wrote {args.json}")
    if args.plots:
        for path in write_plots(results, summary, Path(args.plots)):
            print(f"wrote {path}")
    return 0


def _vlm_setup(
    args, base: SageConfig, text_target_dir: Path, draft_dir: Path, draft_desc: str, num: int, device, cache
):
    """Engine and requests for the VLM image prompts.

    Target: ``--target`` (a saved VLM) or SmolVLM whose text model is the real SmolLM2 (built
    once, tiny random vision tower).  Draft: the text draft through ``TextDraftForVLM`` (visual
    tokens removed from its prompt), or ``--draft-vlm`` with SpecVLM pruning at
    ``prune_ratio_image``.
    """
    from .bench.prompts import load_prompts
    from .engines.speculative import SpecEngine
    from .engines.vlm import TextDraftForVLM, VLMAdapter, build_smolvlm, load_vlm, make_vlm_request
    from .models import draft_head_ids, load_causal_lm

    if args.target:
        target_path, target_desc = Path(args.target), args.target
    else:
        target_path = build_smolvlm(text_target_dir, cache / "smolvlm-smollm2-135m")
        target_desc = f"SmolVLM on the real SmolLM2-135M-Instruct text model, tiny random vision tower ({target_path})"
    model, processor = load_vlm(target_path, device)
    target = VLMAdapter(model, processor, role="target")
    if args.draft_vlm:
        dmodel, _ = load_vlm(args.draft_vlm, device)
        draft = VLMAdapter(dmodel, processor, prune_ratio=base.prune_ratio_image, role="draft")
        draft_desc = f"{args.draft_vlm} (VLM draft, {base.prune_ratio_image:.0%} of visual tokens pruned)"
    else:
        draft = TextDraftForVLM(load_causal_lm(draft_dir, device), head_ids=draft_head_ids(draft_dir))
        draft_desc = f"{draft_desc}; text-only draft, visual tokens removed from its prompt"
    requests = [make_vlm_request(processor, p) for p in load_prompts("vlm", num)]
    return SpecEngine(target, draft), requests, processor.tokenizer, target_desc, draft_desc


def _serving_parser(sub) -> None:
    p = sub.add_parser("bench-serving", help="SGLang serving: SAGE vs plain decoding, side by side (needs sglang)")
    p.add_argument("--config", default="engine_configs/sglang/smollm2_cpu_sage.yaml", help="SGLang --config YAML")
    p.add_argument("--target", default=None, help="HF target dir (default: the SmolLM2 target, converted once)")
    p.add_argument("--draft", default=None, help="draft dir or EAGLE head (default: the bundled SmolLM2 draft)")
    p.add_argument("--batch-sizes", default="1,8", help="comma list of concurrent requests per batch")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="batches per batch size (server order alternates)")
    p.add_argument("--num-prompts", type=int, default=16, help="bundled prompts to draw batches from")
    p.add_argument("--libcuda-dir", default=".sglang-libcuda", help="where tools/setup_sglang.sh unpacked libcuda")
    p.add_argument("--log-dir", default="out/bench-serving", help="server logs")
    p.add_argument("--json", default=None, help="write the report as JSON")


def serving_main(args: argparse.Namespace, environ: dict[str, str]) -> int:
    from .bench.prompts import mixed_text_prompts, render_chat
    from .bench.serving import format_table, run_serving_bench
    from .models import bundled_draft_dir, ensure_smollm2, load_tokenizer
    from .runtimes.sglang.cpu_env import cpu_launch_env, unpacked_libcuda

    target = Path(args.target) if args.target else ensure_smollm2()
    draft = Path(args.draft) if args.draft else bundled_draft_dir()
    if draft is None:
        raise ConfigError("--draft: no bundled draft found; pass a draft model or EAGLE head directory")
    lib = unpacked_libcuda(args.libcuda_dir)  # a CPU machine set up by tools/setup_sglang.sh
    env = cpu_launch_env(environ, lib) if lib is not None else dict(environ)
    tok = load_tokenizer(target)
    prompts = [tok.decode(render_chat(tok, p)) for p in mixed_text_prompts(args.num_prompts)]
    report = run_serving_bench(
        config=Path(args.config).resolve(), target=target, draft=draft.resolve(), env=env,
        log_dir=Path(args.log_dir), batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
        max_new_tokens=args.max_new_tokens, repeats=args.repeats, prompts=prompts,
    )  # fmt: skip
    report["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs"
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if all(r["identical_outputs"] for r in report["rows"]) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sage", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)
    _bench_parser(sub)
    from .train.draft import add_train_args

    add_train_args(sub.add_parser("train-draft", help="distil a draft model for a target (resumable; CPU or CUDA)"))
    _serving_parser(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "bench":
            return bench_main(args)
        if args.command == "bench-serving":
            return serving_main(args, dict(os.environ))
        from .train.draft import train_draft

        return train_draft(args) or 0
    except ConfigError as exc:
        print(f"sage: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
