"""The report of ``sage bench-serving`` (:func:`~.serving.run_serving_bench`): a Markdown table and a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["format_table", "write_serving_plot"]


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
