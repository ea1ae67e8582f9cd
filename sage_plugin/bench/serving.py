"""``sage bench-serving``: SGLang serving with SAGE against plain SGLang and SGLang's own speculative modes, in one run.

One ``python -m sglang.launch_server`` process per ``--methods`` entry (each in its own process group, on
127.0.0.1; all up at once, or with ``--servers alternate`` one at a time, a fresh one per repeat), all on the same
target and draft: ``plain`` (the SAGE config's flags minus the speculative
ones), ``sage`` (the ``--config`` YAML), ``sage-single`` (the same without ``--sage-tiers``: SAGE at its one largest
shape), ``standalone`` (SGLang's STANDALONE chain with the same draft: 3 steps,
top-k 1, 4 tokens) and ``standalone-tree`` (STANDALONE at SAGE's own steps / top-k / verified tokens).  For each
batch size B the same B prompts (bundled MT-Bench / GSM8K / HumanEval, the bundled image prompts, or a prompt file;
chat template applied, images as base64 ``image_data``) are sent concurrently, greedy, ``max_new_tokens`` each, to
every method's server in turn, rotating the order per repeat, so machine noise hits all alike.  Reported per method and
batch size: output tokens/s (completion tokens over the wall time of the batch, prefill included; with ``--load
stream`` B is the number of closed-loop client slots and each repeat serves ``--stream-per-slot`` x B requests,
continuous batching as production serving runs it), the ratio to
plain, SGLang's mean ``spec_accept_length``, p50 / p99 request latency, SAGE's per-request means
(``meta_info["sage"]``), and whether every output equals plain decoding token for token.

``--url NAME=URL`` benches a server that is already running (another machine, a GPU, a configuration this command
does not launch) under ``NAME`` in the same rotation: ``plain=URL`` or ``sage=URL`` replace launching that method,
any other name adds one.  Prompts are rendered with ``--target``'s chat template, so give the remote server's
target there; its outputs are compared with ``plain``'s like every other method's.

Needs SGLang 0.5.23 in the running interpreter (``tools/setup.sh --sglang``); on a machine without an NVIDIA
driver the launch environment gets the user-space libcuda that ``tools/setup_sglang.sh`` unpacked.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from ..config import ConfigError
from ..data.prompts import Prompt, image_data_url, multimodal_messages, render_chat, video_frame_urls
from ..models import load_tokenizer
from .servers import SERVER_START_TIMEOUT_S, HttpServer, RemoteServer, Server, parallel, parse_urls
from .serving_report import format_table, write_serving_plot
from .variants import entry_name, method_entries, serving_variants

__all__ = [
    "SERVER_MODES", "SERVER_START_TIMEOUT_S", "SERVING_METHODS", "RemoteServer", "Server", "format_table", "method_args", "parallel",
    "parse_serving_methods", "parse_urls", "serving_variants", "plain_flags", "run_serving_bench", "serving_requests",
    "write_serving_plot",
]  # fmt: skip

#: SGLang flags (YAML keys) that belong to speculative decoding: dropped from the plain server's flags
SPEC_KEY_PREFIXES = ("speculative-", "sage-")


def _yaml_flags(config: Path, keep: Callable[[str], bool]) -> list[str]:
    """The keys of an SGLang ``--config`` YAML that ``keep`` accepts, as command-line arguments (``true``: a bare
    flag; ``false`` and empty values: left out)."""
    data = yaml.safe_load(config.read_text()) or {}
    argv: list[str] = []
    for key, value in data.items():
        if not keep(key) or value is None or value is False:
            continue
        argv.append(f"--{key}")
        if value is not True:
            argv.append(str(value))
    return argv


def plain_flags(config: Path) -> list[str]:
    """The non-speculative flags of an SGLang ``--config`` YAML, as command-line arguments."""
    return _yaml_flags(config, lambda key: not key.startswith(SPEC_KEY_PREFIXES))


def serving_requests(prompts: list[Prompt], target: Path, video_frames: int = 0) -> list[dict[str, Any]]:
    """``/generate`` payloads (``text`` and, for a prompt with an image or a video, ``image_data`` or ``video_data``)
    of ``prompts``; ``video_frames=N`` sends a video as N frames in ``image_data`` with ``modalities: ["video"]``
    (LLaVA-OneVision in SGLang 0.5.23), one placeholder each.

    The text is the prompt rendered by the target's own chat template: its tokenizer's for text prompts, its
    processor's (with the image or video placeholder where the medium goes) for the others.
    """
    from transformers import AutoProcessor

    tok = load_tokenizer(target)
    media = any(p.modality != "text" for p in prompts)
    processor = AutoProcessor.from_pretrained(str(target)) if media else None
    out = []
    for p in prompts:
        if p.modality == "text":
            out.append({"text": tok.decode(render_chat(tok, p))})
            continue
        msgs = multimodal_messages(p)
        media: dict[str, Any] = {f"{p.modality}_data": [image_data_url(p.video or p.image)]}
        if p.video is not None and video_frames:
            msgs[-1]["content"] = [msgs[-1]["content"][0]] * video_frames + msgs[-1]["content"][1:]
            media = {"image_data": video_frame_urls(p.video, video_frames), "modalities": ["video"]}
        out.append({"text": processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False), **media})
    return out


@dataclass
class _Side:
    tokens: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    accept: list[float] = field(default_factory=list)
    sage: list[dict] = field(default_factory=list)
    repeats: list[float] = field(default_factory=list)  # tok/s of each measured batch


#: ``--methods`` of ``sage bench-serving``: each a server on the same target (``plain`` is the reference).
SERVING_METHODS = (
    "plain", "sage", "sage-single", "standalone", "standalone-tree", "eagle3", "eagle3-adaptive", "sage-eagle3",
)  # fmt: skip
#: SGLang's own chain with the same draft: its STANDALONE defaults for a separate draft model.
STANDALONE_CHAIN = {"speculative-num-steps": 3, "speculative-eagle-topk": 1, "speculative-num-draft-tokens": 4}
#: SGLang's EAGLE-3 static tree on this CPU: 4 steps of a top-4 beam, 8 verified tokens (SAGE's middle tier's size).
EAGLE3_TREE = {"speculative-num-steps": 4, "speculative-eagle-topk": 4, "speculative-num-draft-tokens": 8}
#: SGLang's ``--speculative-adaptive`` EAGLE-3 (top-k 1 only in 0.5.23), starting from a 3-step chain.
EAGLE3_CHAIN = {"speculative-num-steps": 3, "speculative-eagle-topk": 1, "speculative-num-draft-tokens": 4}
_NEEDS_EAGLE3 = ("eagle3", "eagle3-adaptive", "sage-eagle3")
_SIZE_KEYS = ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens")


def parse_serving_methods(text: str, eagle3: Path | None = None, urls: dict[str, str] | None = None) -> list[str]:
    """``--methods``: known names and ``NAME=METHOD:option=value,...`` variants (:func:`serving_variants`), ``plain``
    first (added if missing: every output is compared with it), then the ``--url`` names not listed (each a running
    server benched under its name).

    The EAGLE-3 methods need ``eagle3``, a trained head for the target (``--eagle3-head``), unless ``urls`` gives a
    running server for them.
    """
    urls = urls or {}
    variants = serving_variants(text, SERVING_METHODS)
    names = [entry_name(e) for e in method_entries(text)]
    for name in names:
        if name in urls:
            continue
        m = variants[name][0] if name in variants else name
        if m in _NEEDS_EAGLE3 and eagle3 is None:
            raise ConfigError(f"--methods {m}: needs a trained EAGLE-3 head for the target (--eagle3-head DIR; a "
                              "random head would only prove the plumbing, not speed)")  # fmt: skip
        if m not in SERVING_METHODS:
            raise ConfigError(f"--methods: unknown {m!r}; use {', '.join(SERVING_METHODS)} or a --url NAME")
    if len(set(names)) != len(names):
        raise ConfigError("--methods names must be distinct")
    names += [m for m in urls if m not in names]
    return ["plain", *[m for m in names if m != "plain"]]


def _spec_flags(config: Path, sizes: dict[str, int], algorithm: str = "STANDALONE") -> list[str]:
    """SGLang's own ``algorithm`` with the config's other speculative flags (e.g. the draft attention backend)."""
    own = ("speculative-algorithm", *_SIZE_KEYS)
    argv = ["--speculative-algorithm", algorithm]
    argv += _yaml_flags(config, lambda key: key.startswith("speculative-") and key not in own)
    for key, value in sizes.items():
        argv += [f"--{key}", str(value)]
    return argv


def method_args(
    method: str, config: Path, target: Path, draft: Path, sage_sizes: dict[str, int] | None,
    eagle3: Path | None = None, eagle3_config: Path | None = None,
) -> list[str]:  # fmt: skip
    """``sglang.launch_server`` arguments of one ``--methods`` entry (``sage_sizes``: the SAGE server's
    steps / topk / draft tokens, which ``standalone-tree`` uses so both verify the same tokens per step;
    ``eagle3``: the EAGLE-3 head of ``eagle3``, ``eagle3-adaptive`` and ``sage-eagle3``, whose SGLang config is
    ``eagle3_config``)."""
    model = ["--model-path", str(target)]
    if method == "plain":
        return [*model, *plain_flags(config)]
    if method == "sage-eagle3":
        return ["--config", str(eagle3_config or config), *model, "--speculative-draft-model-path", str(eagle3)]
    if method in ("eagle3", "eagle3-adaptive"):
        tree = method == "eagle3"
        argv = [*model, *plain_flags(config), "--speculative-draft-model-path", str(eagle3)]
        argv += _spec_flags(config, EAGLE3_TREE if tree else EAGLE3_CHAIN, "EAGLE3")
        return argv + ([] if tree else ["--speculative-adaptive"])
    if method in ("sage", "sage-single"):
        argv = ["--config", str(config), *model, "--speculative-draft-model-path", str(draft)]
        return argv + (["--sage-tiers", "[]"] if method == "sage-single" else [])  # one shape: the largest
    if method == "standalone-tree" and sage_sizes is None:
        raise ConfigError("--methods standalone-tree takes SAGE's sizes: list sage before it")
    sizes = STANDALONE_CHAIN if method == "standalone" else sage_sizes
    return [*model, *plain_flags(config), "--speculative-draft-model-path", str(draft), *_spec_flags(config, sizes)]


def _run_batch(
    server: HttpServer, requests: list[dict], max_new_tokens: int, side: _Side, concurrency: int | None = None
) -> list[list[int]]:
    """Serve ``requests`` (all at once, or through ``concurrency`` closed-loop client slots) and add the tokens, the
    wall time of the whole set and each request's latency to ``side``; returns the output ids in request order."""

    def one(r: dict) -> tuple[dict, float]:
        t = time.perf_counter()
        out = server.post("/generate", _payload(r, max_new_tokens))
        return out, time.perf_counter() - t

    t0 = time.perf_counter()
    results = parallel(one, requests, concurrency)
    seconds = time.perf_counter() - t0
    tokens = sum(o["meta_info"]["completion_tokens"] for o, _ in results)
    side.seconds += seconds
    side.tokens += tokens
    side.repeats.append(tokens / seconds)
    for o, latency in results:
        meta = o["meta_info"]
        side.latencies.append(latency)
        if meta.get("spec_accept_length") is not None:
            side.accept.append(meta["spec_accept_length"])
        side.sage.extend(meta.get("sage") or [])
    return [o["output_ids"] for o, _ in results]


#: a request's own output cap (:func:`output_caps`), kept beside its ``/generate`` payload and never sent as a field
CAP_KEY = "_max_new_tokens"


def _payload(r: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
    """``r``'s ``/generate`` body, greedy: its own cap where it has one (``CAP_KEY``), else ``max_new_tokens``."""
    cap = r.get(CAP_KEY, max_new_tokens)
    body = {k: v for k, v in r.items() if k != CAP_KEY}
    return {**body, "sampling_params": {"max_new_tokens": min(cap, max_new_tokens), "temperature": 0.0}}


def output_caps(n: int, max_new_tokens: int, ratio: float, seed: int = 0) -> list[int]:
    """Per-prompt output caps drawn uniformly from ``[ratio * max_new_tokens, max_new_tokens]`` (deterministic).

    Requests that all stop at one length finish in lockstep under plain decoding, so their successors arrive (and
    prefill) together; speculative requests finish at different steps and their successors prefill one by one.
    Production requests have different lengths; ``ratio < 1`` gives the prompts different ones (each prompt the
    same cap on every server and repeat), as SGLang's ``bench_serving --random-range-ratio`` does for output
    lengths.  ``ratio == 1``: every cap is ``max_new_tokens``.

    >>> output_caps(5, 64, 1.0)
    [64, 64, 64, 64, 64]
    >>> caps = output_caps(1000, 64, 0.5)
    >>> min(caps) >= 32 and max(caps) <= 64 and len(set(caps)) == 33
    True
    """
    if not 0.0 < ratio <= 1.0:
        raise ConfigError(f"--length-range-ratio must be in (0, 1], got {ratio}")
    lo = max(1, round(ratio * max_new_tokens))
    rng = random.Random(seed)
    return [rng.randint(lo, max_new_tokens) for _ in range(n)]


def _batch(requests: list[dict[str, Any]], bs: int, r: int) -> list[dict[str, Any]]:
    """Repeat ``r``'s batch of ``bs`` requests: the next ``bs`` of ``requests``, wrapping around."""
    return [requests[(r * bs + i) % len(requests)] for i in range(bs)]


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def _round_mean(summaries: list[dict[str, float]], key: str) -> float | None:
    """Mean of a per-request SAGE summary field over the drafted rounds of all requests (a request served at the
    speculation-off tier only has no drafted round and no such field); None without any round."""
    drafted = [s for s in summaries if s.get("rounds", 0) > 0]
    rounds = sum(s["rounds"] for s in drafted)
    return sum(s[key] * s["rounds"] for s in drafted) / rounds if rounds else None


def _row(method: str, bs: int, side: _Side, plain: _Side, same: bool, requests: int, load: str) -> dict[str, Any]:
    mean = lambda key: _round_mean(side.sage, key)  # noqa: E731
    tok_s = side.tokens / side.seconds
    return {
        "method": method, "batch_size": bs, "tok_s": tok_s, "speedup": tok_s / (plain.tokens / plain.seconds),
        "identical": same, "accept_length": statistics.fmean(side.accept) if side.accept else None,
        "p50_latency_s": _percentile(side.latencies, 0.5), "p99_latency_s": _percentile(side.latencies, 0.99),
        "mean_alpha": mean("mean_alpha"), "mean_depth": mean("mean_depth"), "mean_width": mean("mean_width"),
        "requests": requests, "load": load, "tok_s_repeats": list(side.repeats),
    }  # fmt: skip


def _rotated(methods: list[str], r: int) -> list[str]:
    """Repeat ``r``'s server order: ``methods`` rotated by ``r`` (each method first once every ``len`` repeats)."""
    k = r % len(methods)
    return [*methods[k:], *methods[:k]]


#: ``--servers``: all methods' servers up at once (``together``), or one at a time, each repeat a fresh process
SERVER_MODES = ("together", "alternate")


def run_serving_bench(*, config: Path, target: Path, draft: Path, env: dict[str, str], log_dir: Path,
                      batch_sizes: list[int], max_new_tokens: int, repeats: int, requests: list[dict[str, Any]],
                      methods: list[str] = ("plain", "sage"), eagle3: Path | None = None,
                      eagle3_config: Path | None = None, urls: dict[str, str] | None = None,
                      warmup: int = 1, load: str = "batch", stream_per_slot: int = 4,
                      length_ratio: float = 1.0, servers: str = "together",
                      variants: dict[str, tuple[str, list[str]]] | None = None) -> dict[str, Any]:  # fmt: skip
    """Measure every method at every batch size ``repeats`` times on its own server (a method in ``urls`` is that
    running server; a name in ``variants`` is its method's server with the extra flags, :func:`serving_variants`)
    and stop the servers it launched.

    ``servers``: ``"together"`` launches one server per method, all up at once, and serves each batch size's
    repeats on every server in turn, the order rotating per repeat so machine noise hits all alike;
    ``"alternate"`` runs one server at a time: per repeat, each method in the rotated order is launched, serves its
    batch of every batch size and is stopped.  Each repeat is then a fresh process per method with the machine
    to itself: no idle neighbour in memory, and a process that happens to run slow for its whole life (seen on
    shared 2-core VMs, ~20%) moves one repeat, not every figure of its method.

    On every server the first requests pay one-off costs unmeasured (two short requests), and before the measured
    batch of each batch size it serves ``warmup`` unmeasured batches of that size (the first measured batch's
    requests): first kernels of a shape, SAGE's start-up tier measurements there (which a graph-capturing runtime
    makes at launch) stay out of the figures of a run that is short next to a server's life.

    ``load``: ``"batch"`` sends a repeat's B requests at once and times the batch until its last request returns
    (speculative requests finish at different steps, so the batch ends at a small batch size); ``"stream"`` sends a
    repeat's ``stream_per_slot * B`` requests through B closed-loop client slots (a slot sends its next request when
    its last one returns: continuous batching at concurrency B, as production serving runs; the batch shrinks only
    at the end of the stream).
    ``length_ratio`` < 1: each prompt's output cap is drawn from ``[length_ratio, 1] x max_new_tokens``
    (:func:`output_caps`; 1: every request runs to ``max_new_tokens`` unless it stops).
    ``requests`` are ``/generate`` payloads without sampling parameters (:func:`serving_requests`); ``methods``
    start with ``plain`` (:func:`parse_serving_methods`).  Returns the report dict (``rows``: one per method and
    batch size, with each repeat's tok/s in ``tok_s_repeats``).
    """
    if load not in ("batch", "stream") or stream_per_slot < 1:
        raise ConfigError(f"--load batch|stream and --stream-per-slot >= 1, got {load!r} and {stream_per_slot}")
    if servers not in SERVER_MODES:
        raise ConfigError(f"--servers must be one of {', '.join(SERVER_MODES)}, got {servers!r}")
    caps = output_caps(len(requests), max_new_tokens, length_ratio)
    if length_ratio < 1.0:
        requests = [{**r, CAP_KEY: c} for r, c in zip(requests, caps, strict=True)]
    log_dir.mkdir(parents=True, exist_ok=True)
    urls, variants = urls or {}, variants or {}
    per_repeat = stream_per_slot if load == "stream" else 1  # requests per client slot in a repeat
    up: dict[str, HttpServer] = {}  # servers running now
    sage_sizes: dict[str, int] = {}  # the SAGE server's steps / topk / draft tokens, for standalone-tree
    sides = {(bs, m): _Side() for bs in batch_sizes for m in methods}
    outs: dict[tuple[int, int, str], list[list[int]]] = {}
    states: dict[str, dict] = {}
    launches = dict.fromkeys(methods, 0)
    bases = {m: variants.get(m, (m,))[0] for m in methods}  # each name's method (a variant's base)

    def start(m: str) -> HttpServer:
        if m in urls:
            up[m] = RemoteServer(m, urls[m])
        else:
            extra = variants.get(m, (m, []))[1]
            argv = method_args(bases[m], config, target, draft, sage_sizes or None, eagle3, eagle3_config) + extra
            up[m] = Server(argv, env, log_dir / f"{m}{'' if not launches[m] else f'.{launches[m]}'}.log")
            launches[m] += 1
        if m == "sage" and not sage_sizes and "standalone-tree" in bases.values():
            info = up[m].get("/server_info")
            sage_sizes.update({k: info[k.replace("-", "_")] for k in _SIZE_KEYS})
        parallel(lambda r: up[m].post("/generate", _payload(r, 8)), requests[:2])  # one-off costs, unmeasured
        return up[m]

    def warm(server: HttpServer, bs: int) -> None:
        for _ in range(warmup):
            _run_batch(server, _batch(requests, bs, 0), max_new_tokens, _Side())

    def measure(m: str, bs: int, r: int) -> None:
        slots = bs if load == "stream" else None
        outs[bs, r, m] = _run_batch(up[m], _batch(requests, bs * per_repeat, r), max_new_tokens, sides[bs, m], slots)

    try:
        if servers == "together":
            for m in methods:
                start(m)
            for bs in batch_sizes:
                for m in methods:
                    warm(up[m], bs)
                for r in range(repeats):
                    for m in _rotated(methods, r):
                        measure(m, bs, r)
            states = {m: up[m].get("/server_info") for m in methods}
        else:
            for r in range(repeats):
                for m in _rotated(methods, r):
                    start(m)
                    for bs in batch_sizes:
                        warm(up[m], bs)
                        measure(m, bs, r)
                    states[m] = up[m].get("/server_info")  # the last repeat's server
                    up.pop(m).stop()
    finally:
        for server in up.values():
            server.stop()
    rows = []
    for bs in batch_sizes:
        for m in methods:
            same = all(outs[bs, r, m] == outs[bs, r, "plain"] for r in range(repeats))
            rows.append(_row(m, bs, sides[bs, m], sides[bs, "plain"], same, repeats * bs * per_repeat, load))
    info = {m: st.get("speculative_algorithm") for m, st in states.items()}
    # SAGE servers' own state at the end (per tier: steps run, expected tokens, measured cost per batch size)
    sage_state = {m: (st.get("internal_states") or [{}])[0].get("sage") for m, st in states.items()
                  if bases[m].startswith("sage")}  # fmt: skip
    return {"rows": rows, "algorithms": info, "methods": list(methods), "config": str(config), "target": str(target),
            "draft": str(draft), "eagle3_head": None if eagle3 is None else str(eagle3),
            "max_new_tokens": max_new_tokens, "warmup": warmup, "load": load, "stream_per_slot": stream_per_slot,
            "length_range_ratio": length_ratio, "servers": servers, "launches": launches,
            "sage_state": sage_state, "urls": dict(urls)}  # fmt: skip
