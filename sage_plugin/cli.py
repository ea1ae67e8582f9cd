"""The ``sage`` command line.

``sage bench``        compare ar / chain / static / eagle2 / sage (and ablations) on bundled prompts.
``sage train-draft``  distil a draft model for a target (see :mod:`sage_plugin.train.draft`).
``sage bench-serving`` SGLang with SAGE vs plain SGLang, side by side (see :mod:`sage_plugin.bench.serving`).
``sage setup``        install the demo, convert the target, build the CPU kernels (and the demo VLMs; check SGLang), once.
``sage build-vlm``    build the demo VLM SGLang serves on CPU (Qwen-VL on SmolLM2) and its draft; print both paths.
``sage trtllm-serve`` TensorRT-LLM's OpenAI server with SAGE (see :mod:`sage_plugin.runtimes.trtllm.serve`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path

import yaml

from .bench.serving_cli import serving_parser
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
        help="comma list of ar, chain, static, eagle2, topn, sage, sage-paper, static-tuned (the fastest fixed tree "
        "on this device, timed before the run), named ablations (docs/user-guide/bench.md) and variants "
        "NAME=POLICY:k=v,k=v (default: ar,chain,static,eagle2,sage,sage-paper)",
    )
    p.add_argument(
        "--datasets",
        default="mixed",
        help="mixed (round-robin mt_bench/gsm8k/humaneval), or comma list of mt_bench,gsm8k,humaneval, or of vlm "
        "(images),vlm-video (clips: the target defaults to the Qwen2.5-VL on SmolLM2); media runs report by modality",
    )
    p.add_argument("--prompts", dest="prompts_file", default=None, metavar="FILE.jsonl",
                   help='your prompts: {"turns": [...]} (first turn) or {"prompt": ...} per line, optional "category" '
                   'and "image" (instead of --datasets)')  # fmt: skip
    p.add_argument("--categories", default=None, help="with --prompts: comma list of categories to keep")
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
        help="with --datasets vlm / vlm-video: a VLM draft dir (SpecVLM pruning at prune_ratio_image / "
        "prune_ratio_video) instead of a text draft",
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
    p.add_argument(
        "--sweep-nodes",
        default=None,
        metavar="N,N,...",
        help="tau at equal node budgets: eagle2, topn, static, sage, sage-paper, ... (and the oracle bound) "
        "at each N (with --methods: also those, e.g. ar)",
    )
    p.add_argument("--sweep-methods", default=None, metavar="M,M,...",
                   help="with --sweep-nodes: only these of eagle2, topn, static, sage, sage-paper, sage-paper-calibrated, "
                   "sage-rerank, sage-children, sage-auto, oracle (default: all)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true")


def _base_config(path: str | None, sets: list[str]) -> SageConfig:
    """``--config`` YAML (:meth:`SageConfig.from_yaml`) with each ``--set KEY=VALUE`` applied."""
    cfg = SageConfig.from_yaml(path) if path else SageConfig()
    changes = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        changes[key.strip()] = yaml.safe_load(value)
    return cfg.replace(**changes) if changes else cfg


def bench_main(args: argparse.Namespace) -> int:
    """``sage bench``: validate the methods (before any model loads), then :func:`~.bench.command.run_bench`."""
    from .bench.command import BenchOptions, run_bench
    from .bench.methods import DEFAULT_METHODS, parse_methods
    from .bench.sweep import sweep_methods

    base = _base_config(args.config, args.set)
    fields = {f.name for f in dataclasses.fields(BenchOptions)} - {"progress"}
    opts = BenchOptions(**{name: getattr(args, name) for name in fields}, progress=not args.no_progress)
    if opts.sweep_sizes:  # plain decoding (speed-ups, the oracle) and every tree method at every budget
        methods = parse_methods(args.methods or "ar", base) + sweep_methods(base, opts.sweep_sizes, opts.sweep_names)
    else:
        methods = parse_methods(args.methods or ",".join(DEFAULT_METHODS), base)
    return run_bench(opts, base, methods)


def _build_vlm_parser(sub) -> None:
    p = sub.add_parser("build-vlm", help="build a CPU demo VLM (Qwen-VL or LLaVA-OV on SmolLM2) and its drafts, once")
    p.add_argument("--kind", default="qwen2_vl", choices=("qwen2_vl", "qwen2_5_vl", "llava_ov"))
    p.add_argument("--cache-dir", default=None, help="where converted models are cached")


def build_vlm_main(args: argparse.Namespace) -> int:
    """``sage build-vlm``: the target and draft directories for ``--model-path`` / ``--speculative-draft-model-path``
    (and for a Qwen-VL, the bundled EAGLE-3 head fitted to it)."""
    from .engines.vlm import ensure_vlm_demo
    from .models import DEFAULT_CACHE_DIR

    target, draft, head = ensure_vlm_demo(args.kind, Path(args.cache_dir) if args.cache_dir else DEFAULT_CACHE_DIR)
    print(f"target: {target}\ndraft:  {draft}" + (f"\neagle3: {head}" if head else ""))
    return 0


def _calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="fit SAGE's calibration table for a draft (a YAML for --config)")
    p.add_argument("--out", required=True, help="YAML to write (a 'sage:' section with 'calibration')")
    p.add_argument("--datasets", default="mixed", help="bundled prompt sets to fit on (default: mixed)")
    p.add_argument("--prompts", dest="prompts_file", default=None, metavar="FILE.jsonl", help="fit on these instead")
    p.add_argument("--num-prompts", type=int, default=40)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--alpha-bins", type=int, default=4)
    p.add_argument("--prob-bins", type=int, default=10)
    p.add_argument("--target", default=None, help="HF target dir (default: the bundled SmolLM2)")
    p.add_argument("--draft", default=None, help="HF draft dir (default: the shipped draft)")
    p.add_argument("--config", default=None, help="YAML with SAGE options (k is read)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--device", default="auto")
    p.add_argument("--cache-dir", default=None)


def calibrate_main(args: argparse.Namespace) -> int:
    """``sage calibrate``: plain decoding on the prompts, one teacher-forced draft pass, the fitted table as YAML."""
    from .bench.calibrate import calibrate, write_calibration
    from .bench.command import BenchOptions, build_setup
    from .engines.speculative import SamplingParams

    base = _base_config(args.config, args.set)
    opts = BenchOptions(datasets=args.datasets, prompts_file=args.prompts_file, num_prompts=args.num_prompts,
                        max_new_tokens=args.max_new_tokens, target=args.target, draft=args.draft,
                        device=args.device, cache_dir=args.cache_dir)  # fmt: skip
    setup = build_setup(opts, base)
    params = SamplingParams(max_new_tokens=opts.new_tokens, stop_token_ids=(setup.eos_token_id,))
    table, n = calibrate(setup.engine, setup.requests, params, base.algorithm.k, args.alpha_bins, args.prob_bins)
    header = (f"SAGE calibration (sage calibrate): draft {setup.draft_desc}\ntarget {setup.target_desc}\n"
              f"{n} top-{base.algorithm.k} candidates from {len(setup.requests)} prompts x {opts.new_tokens} tokens; "
              f"rows: alpha bins, columns: draft-probability bins (docs/design/algorithm.md)")  # fmt: skip
    write_calibration(args.out, table, header)
    print("\n".join(" ".join(f"{v:.3f}" for v in row) for row in table))
    print(f"wrote {args.out} ({n} candidates)")
    return 0


def _trtllm_serve_parser(sub) -> None:
    p = sub.add_parser("trtllm-serve", help="TensorRT-LLM's OpenAI server with SAGE (needs tensorrt_llm and a GPU)")
    p.add_argument(
        "--config", required=True, help="SAGE launch YAML (engine_configs/trtllm/, docs/user-guide/trtllm.md)"
    )
    p.add_argument("--model", default=None, help="target model (overrides the file's model)")
    p.add_argument("--host", default=None, help="overrides serve.host")
    p.add_argument("--port", type=int, default=None, help="overrides serve.port")
    p.add_argument("--check", action="store_true", help="check the launch and print it; needs no TensorRT-LLM")
    p.add_argument(
        "--skip-contract-check", action="store_true", help="warn instead of failing when TensorRT-LLM's interfaces "
        "differ from the recorded ones (untested combination)",
    )  # fmt: skip


def trtllm_serve_main(args: argparse.Namespace) -> int:
    """``sage trtllm-serve``: check the launch file (before anything starts), then serve (or print it with --check)."""
    from .runtimes.trtllm.serve import describe_launch, load_cli_launch, serve

    launch = load_cli_launch(args.config, model=args.model, host=args.host, port=args.port)
    if args.check:
        print(describe_launch(launch))
        return 0
    return serve(launch, skip_check=args.skip_contract_check)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sage", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)
    _bench_parser(sub)
    from .train.draft import add_train_args

    add_train_args(sub.add_parser("train-draft", help="distil a draft model for a target (resumable; CPU or CUDA)"))
    serving_parser(sub)
    _build_vlm_parser(sub)
    _trtllm_serve_parser(sub)
    _calibrate_parser(sub)
    from .machine_setup import add_setup_args

    add_setup_args(
        sub.add_parser("setup", help="install the demo, convert the bundled target and build the CPU kernels, once")
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "bench":
            return bench_main(args)
        if args.command == "bench-serving":
            from .bench.serving_cli import serving_main

            return serving_main(args, dict(os.environ))
        if args.command == "build-vlm":
            return build_vlm_main(args)
        if args.command == "trtllm-serve":
            return trtllm_serve_main(args)
        if args.command == "calibrate":
            return calibrate_main(args)
        if args.command == "setup":
            from .machine_setup import setup_main

            return setup_main(args)
        from .train.draft import train_draft

        return train_draft(args) or 0
    except ConfigError as exc:
        print(f"sage: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
