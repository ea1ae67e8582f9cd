"""``sage bench-serving --load sglang``: each method's server alone on the machine, driven by SGLang's load generator.

Per repeat, each method in the rotated order (``plain`` first in the first repeat) is launched alone (or, with
``--url``, is that running server), runs the load generator once per load point (:mod:`.loadgen`) and is stopped;
every generated text is compared with plain's for the same prompt, load point and repeat.  A row per method and load
point sums the repeats: output tokens/s (tokens over the runs' durations) and its ratio to plain's, the medians over
the repeats of the median / p99 TPOT and TTFT, the accept length, SAGE's alpha / D / W over its drafted rounds and
its share of off steps, and how many outputs equal plain's.

Worked example: plain served 2,000 tokens in 100 s at ``c4`` and SAGE 2,000 in 95 s: 20.0 and 21.1 tok/s, 1.05x;
with median TPOTs 180 and 171 ms, ``tpot_vs_plain`` 0.95.
"""

from __future__ import annotations

import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .loadgen import LoadPoint, LoadSpec, compare_texts, loadgen_argv, read_result, run_figures, server_counters
from .servers import HttpServer, RemoteServer, Server
from .serving import _SIZE_KEYS, method_args

__all__ = ["LoadBench", "load_rows", "run_loadgen_bench"]


@dataclass
class LoadBench:
    """What launches the servers (the ``sage bench-serving`` arguments) and what each run sends."""

    config: Path
    target: Path
    draft: Path
    env: dict[str, str]
    log_dir: Path
    spec: LoadSpec
    points: list[LoadPoint]
    methods: list[str]
    repeats: int = 1
    eagle3: Path | None = None
    eagle3_config: Path | None = None
    urls: dict[str, str] = field(default_factory=dict)
    variants: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    launches: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # the SAGE server's steps / topk / draft tokens

    def server(self, name: str) -> HttpServer:
        """``name``'s running server (``--url``) or a fresh launch of its method (with a variant's extra flags)."""
        if name in self.urls:
            return RemoteServer(name, self.urls[name])
        method, extra = self.variants.get(name, (name, []))
        argv = method_args(method, self.config, self.target, self.draft, self.sizes or None, self.eagle3,
                           self.eagle3_config) + list(extra)  # fmt: skip
        n = self.launches[name] = self.launches.get(name, 0) + 1
        server = Server(argv, self.env, self.log_dir / f"{name}.{n}.log")
        if method == "sage" and not self.sizes:
            info = server.get("/server_info")
            self.sizes.update({k: info[k.replace("-", "_")] for k in _SIZE_KEYS})
        return server


def run_loadgen_bench(bench: LoadBench, run: Callable[..., Any] = subprocess.run) -> dict[str, Any]:
    """Every method at every load point, ``bench.repeats`` times, one server at a time; the report dict (``rows``:
    :func:`load_rows`; ``runs``: every run's figures without texts).  ``run`` starts the load generator
    (``subprocess.run``; a stand-in in tests)."""
    bench.log_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[tuple[str, str, int], dict[str, Any]] = {}
    states: dict[str, Any] = {}
    for r in range(bench.repeats):
        k = r % len(bench.methods)
        for name in [*bench.methods[k:], *bench.methods[:k]]:
            server = bench.server(name)
            try:
                for point in bench.points:
                    out = bench.log_dir / f"{name}.r{r}.{point.name}.jsonl"
                    out.unlink(missing_ok=True)  # the load generator appends
                    before = server_counters(server.get("/server_info"))
                    with (bench.log_dir / f"{name}.r{r}.{point.name}.log").open("w") as log:
                        run(loadgen_argv(bench.spec, server.base_url, point, out), env=bench.env, check=True,
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
                    after = server.get("/server_info")
                    runs[name, point.name, r] = run_figures(read_result(out), before, server_counters(after))
                states[name] = after
            finally:
                server.stop()
    bases = {m: bench.variants.get(m, (m,))[0] for m in bench.methods}
    sage_state = {m: (st.get("internal_states") or [{}])[0].get("sage") for m, st in states.items()
                  if bases[m].startswith("sage")}  # fmt: skip
    return {
        "rows": load_rows(runs, bench.methods, bench.points, bench.repeats), "methods": list(bench.methods),
        "loads": [p.name for p in bench.points], "load": "sglang", "dataset": bench.spec.dataset,
        "num_prompts": bench.spec.num_prompts, "max_new_tokens": bench.spec.output_len, "repeats": bench.repeats,
        "servers": "alternate", "config": str(bench.config), "target": str(bench.target), "draft": str(bench.draft),
        "eagle3_head": None if bench.eagle3 is None else str(bench.eagle3), "launches": dict(bench.launches),
        "urls": dict(bench.urls), "sage_state": sage_state,
        "runs": [{"method": m, "load": p, "repeat": r, **{k: v for k, v in f.items() if k != "texts"}}
                 for (m, p, r), f in runs.items()],
    }  # fmt: skip


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def load_rows(
    runs: dict[tuple[str, str, int], dict[str, Any]], methods: list[str], points: list[LoadPoint], repeats: int
) -> list[dict[str, Any]]:
    """One row per load point and method (``plain`` first): the repeats' sums and medians (module docstring)."""
    rows = []
    for point in points:
        plain = [runs["plain", point.name, r] for r in range(repeats)]
        for m in methods:
            rows.append(_row(m, point, [runs[m, point.name, r] for r in range(repeats)], plain))
    return rows


def _row(method: str, point: LoadPoint, fs: list[dict[str, Any]], plain: list[dict[str, Any]]) -> dict[str, Any]:
    """The row of ``method``'s runs ``fs`` at ``point`` against plain's runs of the same repeats."""

    def total(key: str, runs: list[dict[str, Any]] = fs) -> float:
        return sum(f[key] for f in runs)

    def med(key: str, runs: list[dict[str, Any]] = fs) -> float:
        return statistics.median(f[key] for f in runs)

    tok_s = total("output_tokens") / total("duration_s")
    rounds = total("rounds")
    pairs = list(zip(fs, plain, strict=True))
    return {
        "method": method, "load": point.name, "concurrency": point.concurrency,
        "request_rate": None if point.concurrency is not None else point.rate, "tok_s": tok_s,
        "speedup": tok_s / (total("output_tokens", plain) / total("duration_s", plain)),
        "speedup_repeats": [_ratio(f["output_tok_s"], p["output_tok_s"]) for f, p in pairs],
        "median_tpot_ms": med("median_tpot_ms"), "p99_tpot_ms": med("p99_tpot_ms"),
        "median_ttft_ms": med("median_ttft_ms"), "p99_ttft_ms": med("p99_ttft_ms"),
        "tpot_vs_plain": _ratio(med("median_tpot_ms"), med("median_tpot_ms", plain)),
        "accept_length": _ratio(total("accept_tokens"), total("forwards")),
        "mean_alpha": _ratio(total("alpha_sum"), rounds), "mean_depth": _ratio(total("depth_sum"), rounds),
        "mean_width": _ratio(total("width_sum"), rounds), "off_share": _ratio(total("off_steps"), total("steps")),
        "identical": sum(compare_texts(f["texts"], p["texts"]) for f, p in pairs),
        "outputs": sum(len(p["texts"]) for p in plain), "completed": total("completed"),
        "errors": sum(len(f["errors"]) for f in fs),
    }  # fmt: skip
