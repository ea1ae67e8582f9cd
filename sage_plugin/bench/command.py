"""``sage bench``: build the engine and the requests, run every method side by side, print and save the report.

:class:`BenchOptions` is everything the command reads from its command line (the parser is in
:mod:`sage_plugin.cli`); :func:`run_bench` does the work in four steps: :func:`build_setup` (models and requests),
:func:`~sage_plugin.bench.run.run_methods`, :func:`bench_config` (the JSON's ``config``) and :func:`print_report`.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError, SageConfig
from ..data.prompts import Prompt, load_prompt_file, load_prompts, mixed_text_prompts, render_chat
from ..engines.eagle3_draft import Eagle3Draft
from ..engines.lm import GenRequest, TextModel, load_causal_lm, store_draft_weights
from ..engines.speculative import SamplingParams, SpecEngine
from ..engines.vlm import (
    TextDraftForVLM,
    VLMModel,
    build_smolvlm,
    ensure_qwen_vl_smollm2,
    load_vlm,
    make_vlm_request,
)
from ..models import (
    DEFAULT_CACHE_DIR,
    bundled_draft_dir,
    draft_head_ids,
    ensure_smollm2,
    is_eagle3_dir,
    load_tokenizer,
    truncated_draft,
)
from .calibrate import calibrate
from .methods import MethodSpec
from .report import category_table, markdown_table, summarize, write_plots
from .run import run_methods
from .sweep import oracle_tau, sweep_summary, sweep_table, write_sweep_plot
from .tune import tune_static

__all__ = ["BenchOptions", "BenchSetup", "bench_config", "build_setup", "print_report", "run_bench"]

#: ``sage-calibrated`` fits on this many bundled prompts, :data:`TUNING_TOKENS` new tokens each; ``static-tuned``
#: times each of its 13 candidates on the first :data:`STATIC_TUNING_PROMPTS` of them and its three fastest on all.
TUNING_PROMPTS, TUNING_TOKENS, STATIC_TUNING_PROMPTS = 8, 32, 4

#: the bundled prompt sets with media: images and video clips (``--datasets vlm,vlm-video`` runs both)
MEDIA_DATASETS = ("vlm", "vlm-video")


@dataclass(frozen=True)
class BenchOptions:
    """What ``sage bench`` was asked to do (see ``sage bench --help`` for each option)."""

    quick: bool = False
    datasets: str = "mixed"
    num_prompts: int | None = None
    max_new_tokens: int | None = None
    batch_size: int = 1
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    warmup: int = 1
    prompts_file: str | None = None
    categories: str | None = None
    target: str | None = None
    draft: str | None = None
    draft_vlm: str | None = None
    standin_layers: int = 4
    device: str = "auto"
    threads: int | None = None
    cache_dir: str | None = None
    json: str | None = None
    plots: str | None = None
    sweep_nodes: str | None = None
    sweep_methods: str | None = None
    progress: bool = True

    @property
    def prompts(self) -> int:
        return self.num_prompts or (6 if self.quick else 20)

    @property
    def new_tokens(self) -> int:
        return self.max_new_tokens or (64 if self.quick else 128)

    @property
    def sweep_sizes(self) -> list[int]:
        """The ``--sweep-nodes`` budgets (empty without a sweep)."""
        try:
            sizes = [int(x) for x in self.sweep_nodes.split(",")] if self.sweep_nodes else []
        except ValueError:
            raise ConfigError(f"--sweep-nodes must be a comma list of node counts, got {self.sweep_nodes!r}") from None
        if any(n < 1 for n in sizes):
            raise ConfigError(f"--sweep-nodes must be positive, got {self.sweep_nodes!r}")
        return sizes

    @property
    def sweep_names(self) -> list[str] | None:
        """The ``--sweep-methods`` kept (None: all of :data:`~.sweep.SWEEP_METHODS`)."""
        return [m.strip() for m in self.sweep_methods.split(",") if m.strip()] if self.sweep_methods else None

    @property
    def cache(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else DEFAULT_CACHE_DIR

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)


@dataclass
class BenchSetup:
    """The engine and requests of a run, with the descriptions printed and stored beside the results."""

    engine: SpecEngine
    requests: list[GenRequest]
    eos_token_id: int
    target_desc: str
    draft_desc: str
    categories: dict[str, str] | None = None  # request id -> category (per-category tau in the report)
    modalities: dict[str, str] | None = None  # request id -> text / image / video (media runs: per-modality rows)
    tuning_requests: list[GenRequest] | None = None  # static-tuned's tuning prompts (text runs only)


def _draft(opts: BenchOptions, target_dir: Path) -> tuple[Path, str]:
    """The draft directory and its description: ``--draft``, the bundled draft, else a truncated stand-in."""
    if opts.draft:
        return Path(opts.draft), f"{opts.draft} (user-supplied)"
    bundled = bundled_draft_dir()
    if bundled is not None:
        return bundled, "shipped trained SmolLM2 draft"
    desc = (
        f"STAND-IN: first {opts.standin_layers} layers of the target (no trained draft ships yet; "
        "tau and speed-ups are not representative of a real draft)"
    )
    return truncated_draft(target_dir, opts.standin_layers, opts.cache), desc


def _prompts(opts: BenchOptions) -> list[Prompt]:
    """The run's prompts: ``--prompts FILE`` (with ``--categories``), else the bundled ``--datasets``."""
    if opts.prompts_file:
        cats = opts.categories.split(",") if opts.categories else None
        return load_prompt_file(opts.prompts_file, limit=opts.prompts, categories=cats)
    if opts.categories:
        raise ConfigError("--categories selects from a --prompts file")
    return _dataset_prompts(opts.datasets, opts.prompts)


def _dataset_prompts(datasets: str, num: int):
    """``num`` prompts of the comma list ``datasets``, split evenly; ``vlm`` (images) and ``vlm-video`` go together
    but not with text sets."""
    if datasets == "mixed":
        return mixed_text_prompts(num)
    names = datasets.split(",")
    media = [n for n in names if n in MEDIA_DATASETS]
    if media and len(media) < len(names):
        raise ConfigError("--datasets vlm / vlm-video cannot be mixed with text datasets in one run")
    per = -(-num // len(names))
    return [p for n in names for p in load_prompts(n, per)][:num]


def _text_setup(opts: BenchOptions, prompts, target_dir: Path, draft_dir: Path, draft_desc: str, device) -> BenchSetup:
    if opts.target:
        target_dir = Path(opts.target)
    tok = load_tokenizer(target_dir)
    target = load_causal_lm(target_dir, device)
    if is_eagle3_dir(draft_dir):  # an EAGLE-3 head reads the target's hidden states
        emb = target.get_input_embeddings().weight.detach()
        draft = Eagle3Draft.load(draft_dir, target.config.to_dict(), emb)
    else:
        draft = TextModel(load_causal_lm(draft_dir, device), draft_head_ids(draft_dir))
    engine = SpecEngine(TextModel(target), draft)
    requests = [GenRequest(render_chat(tok, p), request_id=p.id) for p in prompts]
    tuning = [GenRequest(render_chat(tok, p), request_id=p.id) for p in mixed_text_prompts(TUNING_PROMPTS)]
    return BenchSetup(engine, requests, tok.eos_token_id, str(target_dir), draft_desc, tuning_requests=tuning)


def _vlm_setup(
    opts: BenchOptions, base: SageConfig, prompts, text_target: Path, draft_dir: Path, draft_desc: str, device
):
    """The VLM image and video prompts.

    Target: ``--target`` (a saved VLM), else SmolVLM whose text model is the real SmolLM2 (built once, tiny random
    vision tower), or for a run with video prompts the Qwen2.5-VL on SmolLM2 that SGLang serves (its processor reads
    videos).  Draft: the text draft through ``TextDraftForVLM`` (visual tokens removed from its prompt), or
    ``--draft-vlm`` with SpecVLM pruning at ``prune_ratio_image`` (``prune_ratio_video`` for a video prompt).
    """
    if opts.target:
        target_path, target_desc = Path(opts.target), opts.target
    elif any(p.video is not None for p in prompts):
        target_path, _ = ensure_qwen_vl_smollm2("qwen2_5_vl", opts.cache)
        target_desc = f"Qwen2.5-VL on the real SmolLM2-135M-Instruct, tiny random vision tower ({target_path})"
    else:
        target_path = build_smolvlm(text_target, opts.cache / "smolvlm-smollm2-135m")
        target_desc = f"SmolVLM on the real SmolLM2-135M-Instruct text model, tiny random vision tower ({target_path})"
    model, processor = load_vlm(target_path, device)
    target = VLMModel(model, processor, role="target")
    if opts.draft_vlm:
        dmodel, _ = load_vlm(opts.draft_vlm, device)
        draft = VLMModel(dmodel, processor, prune_ratio=base.vlm.prune_ratio_image, role="draft",
                         prune_ratio_video=base.vlm.prune_ratio_video)  # fmt: skip
        draft_desc = (f"{opts.draft_vlm} (VLM draft, {base.vlm.prune_ratio_image:.0%} of image and "
                      f"{base.vlm.prune_ratio_video:.0%} of video tokens pruned)")  # fmt: skip
    else:
        draft = TextDraftForVLM(load_causal_lm(draft_dir, device), head_ids=draft_head_ids(draft_dir))
        draft_desc = f"{draft_desc}; text-only draft, visual tokens removed from its prompt"
    requests = [make_vlm_request(processor, p) for p in prompts]
    return BenchSetup(SpecEngine(target, draft), requests, processor.tokenizer.eos_token_id, target_desc, draft_desc)


def build_setup(opts: BenchOptions, base: SageConfig) -> BenchSetup:
    """Load the target and draft (converting the bundled target once) and render the requests."""
    device = opts.torch_device()
    prompts = _prompts(opts)
    target_dir = ensure_smollm2(opts.cache)
    draft_dir, draft_desc = _draft(opts, target_dir)
    if any(p.modality != "text" for p in prompts):
        if is_eagle3_dir(draft_dir):
            raise ConfigError(f"--draft {draft_dir}: an EAGLE-3 head drafts for text targets only in this engine")
        setup = _vlm_setup(opts, base, prompts, target_dir, draft_dir, draft_desc, device)
    else:
        setup = _text_setup(opts, prompts, target_dir, draft_dir, draft_desc, device)
    setup.categories = {p.id: p.category or p.dataset for p in prompts}
    if any(p.modality != "text" for p in prompts):
        setup.modalities = {p.id: p.modality for p in prompts}
    if store_draft_weights(setup.engine.draft, base.cpu.cpu_draft_dtype) == "bfloat16":
        setup.draft_desc += "; linear weights stored in bfloat16 (cpu_draft_dtype)"
    if not setup.engine.use_lean_draft(base.cpu.cpu_lean_draft) and setup.engine.draft is not None:
        setup.draft_desc += "; transformers' forward (cpu_lean_draft false or not a Llama-family decoder)"
    return setup


def bench_config(opts: BenchOptions, base: SageConfig, methods: list[MethodSpec], setup: BenchSetup) -> dict[str, Any]:
    """The ``config`` section of the JSON report: what ran, where, and the measured round costs."""
    return {
        "sage": base.to_dict(),
        "methods": {m.name: (m.config.to_dict() if m.config else None) for m in methods},
        "target": setup.target_desc,
        "draft": setup.draft_desc,
        "device": str(opts.torch_device()),
        "threads": torch.get_num_threads(),
        "num_prompts": len(setup.requests),
        "max_new_tokens": opts.new_tokens,
        "batch_size": opts.batch_size,
        "temperature": opts.temperature,
        "top_k": opts.top_k,
        "top_p": opts.top_p,
        "seed": opts.seed,
        "datasets": opts.prompts_file or opts.datasets,
        "categories": opts.categories,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "round_costs": {
            f"batch {b}, {n} nodes{', padded' if pad else ''}{f', re-priced every {r} rounds' if r else ''}": {
                "verify_ms": [round(float(x), 2) for x in c.verify_ms], "draft_ms": round(c.draft_ms, 2),
                "verify_run": list(c.verify_run), "draft_run": list(c.draft_run),
            }
            for (b, n, _, pad, r), c in setup.engine.round_costs.items()
        },
    }  # fmt: skip


def print_report(summary: dict, opts: BenchOptions, engine: SpecEngine) -> None:
    """The Markdown table, the tau convention and each measured cost curve."""
    print()
    print(markdown_table(summary, opts.temperature <= 0))
    by_category = category_table(summary)
    if by_category is not None:
        print("\ntau by category:\n" + by_category)
    by_modality = category_table(summary, key="per_modality")
    if by_modality is not None:
        print("\ntau (mean root alpha of the rounds) by modality:\n" + by_modality)
    print("\ntau = decode tokens per target forward (bonus included; ar = 1.00); accepted/round excludes the bonus.")
    for (b, _, _, pad, r), c in engine.round_costs.items():
        v = c.verify_ms
        how = f"start-up and in-loop medians, every {r} rounds" if r else "measured here"
        shown = ", ".join(
            f"{q + 1}: {float(v[q]):.1f}" + (f" (runs {c.verify_nodes(q) + 1})" if c.verify_nodes(q) != q else "")
            for q in (0, 1, 2, 3, 5, 8, 15, 24)
            if q < len(v)
        )
        print(
            f"node_budget=auto{', padded' if pad else ''}, batch {b}: target forward ms by verified tokens ({how}) "
            f"{shown}; draft forward {c.draft_ms:.1f} ms"
        )


def _sweep(results: dict, setup: BenchSetup, base: SageConfig, sizes: list[int], names: list[str] | None) -> dict:
    """The sweep's summary, with the oracle bound (where asked for) where plain decoding ran and the draft is a text
    model."""
    oracle = None
    ar, draft = results.get("ar"), setup.engine.draft
    wanted = names is None or "oracle" in names
    if wanted and ar is not None and type(draft) is TextModel:  # a text draft that reads the prompt as the target does
        prompts = [r.prompt_ids for r in setup.requests]
        outs = [ar.outputs[r.request_id] for r in setup.requests]
        oracle = {n: oracle_tau(draft.sequence_logits, prompts, outs, base.algorithm.k, n) for n in sizes}
    return sweep_summary(results, sizes, oracle)


def _tune(methods: list[MethodSpec], setup: BenchSetup, base: SageConfig, params: SamplingParams):
    """Replace the fitted methods' placeholders (:data:`~.methods.TUNED`) by what was fitted on the bundled tuning
    prompts: ``static-tuned`` the fastest fixed tree on this device (:mod:`.tune`), ``sage-calibrated`` SAGE with
    a calibration table for this draft (:mod:`.calibrate`).  Returns the methods and what was measured."""
    if not any(m.tuned for m in methods):
        return methods, {}
    if setup.tuning_requests is None:
        raise ConfigError("static-tuned and sage-calibrated fit on the bundled text prompts: text runs only")
    tune_params = dataclasses.replace(params, max_new_tokens=TUNING_TOKENS)
    fitted: dict[str, Any] = {}
    out = []
    table: Any = None  # one calibration table for every calibrated method of the run
    for m in methods:
        t0 = time.perf_counter()
        if m.tuned and m.config.algorithm.policy == "static":
            reqs = setup.tuning_requests
            fit = tune_static(setup.engine, base, reqs, tune_params, screen=STATIC_TUNING_PROMPTS)
            cfg = fit.config
            fitted[m.name] = {
                "chosen": fit.label,
                "tok_s": {k: round(v, 2) for k, v in fit.tok_s.items()},
                "finalists": list(fit.finalists),
            }
            print(f"{m.name}: {fit.label} (decode tok/s on {STATIC_TUNING_PROMPTS} bundled prompts: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in fit.tok_s.items() if k not in fit.finalists)
                  + f"; finalists on {len(reqs)}: "
                  + ", ".join(f"{k} {fit.tok_s[k]:.1f}" for k in fit.finalists) + ")", flush=True)  # fmt: skip
        elif m.tuned:
            if table is None:
                table, n = calibrate(setup.engine, setup.tuning_requests, tune_params, base.algorithm.k)
                print(f"calibration: table fitted on {n} candidates of {TUNING_PROMPTS} bundled prompts", flush=True)
                fitted["calibration"] = {"table": [list(r) for r in table], "candidates": n}
            cfg = m.config.replace(calibration=[list(r) for r in table])
            fitted[m.name] = {"calibration": "the run's table (fitted.calibration)"}
        else:
            out.append(m)
            continue
        fitted[m.name]["fit_s"] = round(time.perf_counter() - t0, 1)
        out.append(MethodSpec(m.name, cfg))
    return out, fitted


def run_bench(opts: BenchOptions, base: SageConfig, methods: list[MethodSpec]) -> int:
    """Run ``sage bench``; returns the exit code."""
    if opts.threads:
        torch.set_num_threads(opts.threads)
    setup = build_setup(opts, base)
    params = SamplingParams(opts.temperature, opts.top_k, opts.top_p, opts.new_tokens, (setup.eos_token_id,), opts.seed)
    device = opts.torch_device()
    sampling = "greedy" if opts.temperature <= 0 else f"temperature {opts.temperature}"
    print(
        f"target: {setup.target_desc}\ndraft:  {setup.draft_desc}\n"
        f"device: {device} ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)\n"
        f"prompts: {len(setup.requests)} x {opts.new_tokens} new tokens, batch {opts.batch_size}, {sampling}",
        flush=True,
    )
    methods, fitted = _tune(methods, setup, base, params)
    results = run_methods(setup.engine, methods, setup.requests, params, opts.batch_size, opts.warmup, opts.progress)
    config = bench_config(opts, base, methods, setup)
    if fitted:
        config["fitted"] = fitted
    summary = summarize(results, config, setup.categories, setup.modalities)
    print_report(summary, opts, setup.engine)
    if opts.sweep_sizes:
        summary["sweep"] = _sweep(results, setup, base, opts.sweep_sizes, opts.sweep_names)
        print(
            "\ntau (mean verified nodes) at an equal node budget N:\n" + sweep_table(summary["sweep"], opts.sweep_sizes)
        )
    if opts.json:
        Path(opts.json).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.json).write_text(json.dumps(summary, indent=2))
        print(f"wrote {opts.json}")
    if opts.plots:
        for path in write_plots(results, summary, Path(opts.plots)):
            print(f"wrote {path}")
        if "sweep" in summary:
            print(f"wrote {write_sweep_plot(summary['sweep'], opts.sweep_sizes, Path(opts.plots))}")
    return 0
