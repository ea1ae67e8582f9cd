"""The report of ``sage bench-serving`` (:func:`~.serving.run_serving_bench`): a Markdown table and a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["format_load_table", "format_table", "write_load_plots", "write_serving_plot"]


def _load_line(report: dict[str, Any]) -> str:
    ratio = report.get("length_range_ratio", 1.0)
    caps = "" if ratio >= 1.0 else f"; output caps drawn per prompt from [{ratio:g}, 1] x {report['max_new_tokens']}"
    if report.get("load", "batch") == "stream":
        return (f"load: stream, {report['stream_per_slot']} requests per client slot, `batch` = concurrent slots "
                f"(continuous batching){caps}")  # fmt: skip
    return f"load: batch, `batch` requests sent together, timed until the last returns{caps}"


def _servers_line(report: dict[str, Any]) -> str:
    if report.get("servers", "together") == "alternate":
        return "servers: alternate (one at a time; each repeat a fresh process per method, the order rotating)"
    return "servers: together (all up at once; each repeat serves every server in turn, the order rotating)"


def _repeat_speedups(row: dict[str, Any], plain: dict[str, Any]) -> str:
    """min-max over the repeats of the method's tok/s over plain's in the same repeat (the same requests)."""
    pairs = list(zip(row.get("tok_s_repeats", []), plain.get("tok_s_repeats", []), strict=False))
    if not pairs:
        return "-"
    ratios = [a / b for a, b in pairs]
    return f"{min(ratios):.2f}-{max(ratios):.2f}x"


def format_table(report: dict[str, Any]) -> str:
    """Markdown table of :func:`run_serving_bench`'s report (speed-up: over ``plain`` at the same batch size)."""
    lines = [
        f"SGLang serving, greedy, {report['max_new_tokens']} new tokens per request (prompts: "
        f"{report.get('prompts', '-')}; draft: {report['draft']})",
        _load_line(report),
        _servers_line(report),
        "",
        "| batch | method | tok/s | speed-up | per repeat | accept length | p50 / p99 latency s | mean alpha | mean D "
        "| mean W | identical |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    plain = {r["batch_size"]: r for r in report["rows"] if r["method"] == "plain"}

    def f(x: float | None, fmt: str = ".2f") -> str:
        return "-" if x is None else format(x, fmt)

    for r in report["rows"]:
        lines.append(
            f"| {r['batch_size']} | {r['method']} | {r['tok_s']:.1f} | {r['speedup']:.2f}x "
            f"| {_repeat_speedups(r, plain[r['batch_size']])} | {f(r['accept_length'])} "
            f"| {r['p50_latency_s']:.2f} / {r['p99_latency_s']:.2f} | {f(r['mean_alpha'])} | {f(r['mean_depth'])} "
            f"| {f(r['mean_width'])} | {'yes' if r['identical'] else 'NO'} |"
        )
    return "\n".join(lines)


def write_serving_plot(report: dict[str, Any], out_dir: Path) -> Path:
    """``serving_tok_s.png``: tokens/s by batch size, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in report["methods"]:
        rows = [r for r in report["rows"] if r["method"] == m]
        ax.plot([r["batch_size"] for r in rows], [r["tok_s"] for r in rows], marker="o", label=m)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens/s")
    ax.set_title("SGLang serving, same target and draft")
    ax.legend()
    path = out_dir / "serving_tok_s.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _load_label(row: dict[str, Any]) -> str:
    """``c4`` as "concurrency 4", ``r0.5`` as "Poisson 0.5/s"."""
    return (
        f"concurrency {row['concurrency']}" if row["concurrency"] is not None else f"Poisson {row['request_rate']:g}/s"
    )


def format_load_table(report: dict[str, Any]) -> str:
    """Markdown table of :func:`~.loadgen_run.run_loadgen_bench`'s report (ratios: over ``plain`` at the same load)."""
    lines = [
        f"SGLang serving through SGLang's load generator (sglang.benchmark.serving), greedy, dataset "
        f"{report['dataset']} ({report.get('prompts') or '-'}), {report['num_prompts']} prompts per load, output cap {report['max_new_tokens']} tokens "
        f"(stops at EOS), {report['repeats']} repeat(s), one server at a time (draft: {report['draft']})",
        "",
        "| load | method | tok/s | vs plain | per repeat | TPOT ms median / p99 | TPOT vs plain | TTFT ms median / p99 "
        "| accept length | alpha | D | W | off share | identical |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]

    def f(x: float | None, fmt: str = ".2f") -> str:
        return "-" if x is None else format(x, fmt)

    for r in report["rows"]:
        reps = [x for x in r["speedup_repeats"] if x is not None]
        per = f"{min(reps):.2f}-{max(reps):.2f}x" if reps else "-"
        same = f"{r['identical']}/{r['outputs']}" + ("" if r["identical"] == r["outputs"] else " NO")
        lines.append(
            f"| {_load_label(r)} | {r['method']} | {r['tok_s']:.1f} | {r['speedup']:.2f}x | {per} "
            f"| {r['median_tpot_ms']:.1f} / {r['p99_tpot_ms']:.1f} | {f(r['tpot_vs_plain'])} "
            f"| {r['median_ttft_ms']:.0f} / {r['p99_ttft_ms']:.0f} | {f(r['accept_length'])} | {f(r['mean_alpha'])} "
            f"| {f(r['mean_depth'])} | {f(r['mean_width'])} | {f(r['off_share'])} | {same} |"
        )
    return "\n".join(lines)


def write_load_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """``serving_tok_s.png`` (output tokens/s) and ``serving_tpot.png`` (median TPOT) against the max concurrency, one
    line per method; a Poisson load is a marker past the largest concurrency, labelled with its rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    closed = sorted({r["concurrency"] for r in report["rows"] if r["concurrency"] is not None}) or [1]
    rates = sorted({r["request_rate"] for r in report["rows"] if r["concurrency"] is None})
    x_of = {("c", c): c for c in closed} | {("r", q): closed[-1] * 2 ** (i + 1) for i, q in enumerate(rates)}
    paths = []
    for key, label, name in (("tok_s", "output tokens/s", "serving_tok_s.png"),
                             ("median_tpot_ms", "median TPOT (ms)", "serving_tpot.png")):  # fmt: skip
        fig, ax = plt.subplots(figsize=(6, 4))
        for m in report["methods"]:
            rows = [r for r in report["rows"] if r["method"] == m]
            loop = [r for r in rows if r["concurrency"] is not None]
            line = ax.plot([r["concurrency"] for r in loop], [r[key] for r in loop], marker="o", label=m)
            color = line[0].get_color() if line else None
            poisson = [r for r in rows if r["concurrency"] is None]  # open loads: markers, not joined to the rest
            ax.scatter(
                [x_of["r", r["request_rate"]] for r in poisson], [r[key] for r in poisson], marker="s", color=color
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(x_of.values()), [str(c) for c in closed] + [f"{q:g}/s" for q in rates])
        ax.set_xlabel("max concurrency, then Poisson request rates (SGLang load generator)")
        ax.set_ylabel(label)
        ax.set_title(f"SGLang serving, {report.get('prompts') or report['dataset']} prompts, one server at a time")
        ax.legend(fontsize=8)
        path = out_dir / name
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths
