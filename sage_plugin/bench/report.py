"""Turn bench results into the JSON document, the Markdown table and the PNG plots."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .run import MethodResult, autocorrelation

__all__ = ["summarize", "markdown_table", "write_plots"]


def _hist(values: list, bins: list[float] | None = None) -> dict[str, int]:
    if bins is None:
        return {str(k): v for k, v in sorted(Counter(values).items())}
    counts = Counter()
    for v in values:
        for lo, hi in zip(bins[:-1], bins[1:]):
            if lo <= v < hi or (hi == bins[-1] and v == hi):
                counts[f"{lo:.1f}-{hi:.1f}"] += 1
                break
    return {key: counts[key] for key in sorted(counts)}


def _per_category(r: MethodResult, categories: dict[str, str]) -> dict[str, dict]:
    """``{category: {"tau", "accepted_per_round", "alpha", "requests", "exact_match"}}`` over each category's
    requests: tau = decode tokens / target forwards, then the mean accepted drafts and root alpha of their rounds
    (None for a method without rounds).  ``categories`` maps request ids to any grouping (a set's categories, or
    the prompts' modalities)."""
    out: dict[str, dict] = {}
    for rid, toks in r.outputs.items():
        c = out.setdefault(categories.get(rid, "?"), {"tokens": 0, "forwards": 0, "requests": 0, "exact": 0})
        c["tokens"] += max(0, len(toks) - 1)
        c["forwards"] += r.forwards.get(rid, 0)
        c["requests"] += 1
        c["exact"] += rid not in {m["request_id"] for m in r.mismatches}
    rounds: dict[str, list] = {}
    for rid, x in r.rounds:
        rounds.setdefault(categories.get(rid, "?"), []).append(x)

    def mean(cat: str, attr: str) -> float | None:
        xs = [getattr(x, attr) for x in rounds.get(cat, [])]
        return round(sum(xs) / len(xs), 4) if xs else None

    return {
        cat: {"tau": round(c["tokens"] / max(1, c["forwards"]), 4), "accepted_per_round": mean(cat, "tau"),
              "alpha": mean(cat, "alpha"), "requests": c["requests"],
              "exact_match": round(c["exact"] / c["requests"], 4) if r.compared else None}
        for cat, c in sorted(out.items())
    }  # fmt: skip


def summarize(
    results: dict[str, MethodResult],
    config: dict,
    categories: dict[str, str] | None = None,
    modalities: dict[str, str] | None = None,
) -> dict:
    """The ``--json`` document: ``{"methods": {NAME: {...}}, "config": {...}}``; with ``categories`` (request id ->
    category) each method also has ``"per_category": {CATEGORY: {"tau", "accepted_per_round", "alpha", "requests",
    "exact_match"}}``, and with ``modalities`` (request id -> ``"text"`` / ``"image"`` / ``"video"``) the same per
    modality as ``"per_modality"``."""
    ar = results.get("ar")
    base = ar.tokens_per_s if ar is not None else float("nan")
    methods = {}
    alpha_bins = [i / 10 for i in range(11)]
    for name, r in results.items():
        rounds = [x for _, x in r.rounds]
        methods[name] = {
            "tau": round(r.tau, 4),
            "accepted_per_round": round(r.mean("tau"), 4) if rounds else 0.0,
            "tokens_per_s": round(r.tokens_per_s, 3),
            "speedup": round(r.tokens_per_s / base, 4) if ar is not None else None,
            "exact_match": (round(r.exact / r.compared, 4) if r.compared else None),
            "mean_nodes": round(r.mean("nodes"), 3) if rounds else 0.0,
            "draft_forwards_per_round": round(r.mean("draft_forwards"), 3) if rounds else 0.0,
            "mean_depth_built": round(r.mean("depth_built"), 3) if rounds else 0.0,
            "decode_tokens": r.decode_tokens,
            "target_forwards": r.target_forwards,
            "decode_s": round(r.decode_s, 3),
            "prefill_s": round(r.prefill_s, 3),
            "profile_s": round(r.profile_s, 3),
            "policy_ms_per_round": round(1e3 * r.policy_s / r.batch_rounds, 4) if r.batch_rounds else 0.0,
            "policy_share": round(r.policy_s / r.decode_s, 5) if r.decode_s > 0 else 0.0,
            "rounds": len(rounds),
            "alpha_hist": _hist([x.alpha for x in rounds], alpha_bins),
            "depth_hist": _hist([x.plan_depth for x in rounds]),
            "width_hist": _hist([x.plan_width for x in rounds]),
            "mismatches": r.mismatches[:20],
        }
        if categories:
            methods[name]["per_category"] = _per_category(r, categories)
        if modalities:
            methods[name]["per_modality"] = _per_category(r, modalities)
    return {"methods": methods, "config": config}


def markdown_table(summary: dict, greedy: bool) -> str:
    head = (
        "| method | tau (tok/target fwd) | accepted/round | tok/s | speed-up vs ar | exact match | mean nodes "
        "| draft fwd/round | policy ms/round (% of decode) |"
    )
    rows = [head, "|" + "---|" * 9]
    for name, m in summary["methods"].items():
        exact = "-" if not greedy or m["exact_match"] is None else f"{m['exact_match']:.2f}"
        speed = "-" if m["speedup"] is None else f"{m['speedup']:.2f}x"
        rows.append(
            f"| {name} | {m['tau']:.2f} | {m['accepted_per_round']:.2f} | {m['tokens_per_s']:.2f} | {speed} | "
            f"{exact} | {m['mean_nodes']:.1f} | {m['draft_forwards_per_round']:.1f} | "
            f"{m['policy_ms_per_round']:.2f} ({100 * m['policy_share']:.1f}%) |"
        )
    return "\n".join(rows)


def category_table(summary: dict, key: str = "per_category") -> str | None:
    """Markdown: tau by category (rows) and method (columns); None without two categories.  ``key="per_modality"``:
    one row per modality, each cell ``tau (alpha)``, alpha the mean root confidence of the method's rounds."""
    methods = {n: m[key] for n, m in summary["methods"].items() if key in m}
    cats = sorted({c for per in methods.values() for c in per})
    if not methods or len(cats) < 2:
        return None
    names = list(methods)
    head = "category" if key == "per_category" else "modality"
    rows = [f"| {head} | requests | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]

    def cell(m: dict) -> str:
        alpha = m.get("alpha") if key != "per_category" else None
        return f"{m['tau']:.2f}" + ("" if alpha is None else f" ({alpha:.2f})")

    for c in cats:
        n = next(per[c]["requests"] for per in methods.values() if c in per)
        rows.append(
            f"| {c} | {n} | " + " | ".join(cell(methods[m][c]) if c in methods[m] else "-" for m in names) + " |"
        )
    return "\n".join(rows)


def write_plots(results: dict[str, MethodResult], summary: dict, out_dir: Path) -> list[Path]:
    """PNGs: alpha-vs-acceptance calibration, entropy autocorrelation by lag, tau by method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    spec = {n: r for n, r in results.items() if r.rounds}
    # 1. calibration: accepted drafts per round vs the confidence of that round's root distribution
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, r in spec.items():
        bins: dict[int, list[int]] = {}
        for _, x in r.rounds:
            bins.setdefault(min(int(x.root_alpha * 10), 9), []).append(x.tau)
        xs = sorted(bins)
        ax.plot([(b + 0.5) / 10 for b in xs], [sum(bins[b]) / len(bins[b]) for b in xs], marker="o", label=name)
    ax.set_xlabel("root confidence alpha (this round)")
    ax.set_ylabel("accepted draft tokens")
    ax.set_title("alpha vs acceptance")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out_dir / "alpha_calibration.png"))
    # 2. entropy autocorrelation (alpha is affine in the top-k entropy, so r is the same)
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, r in spec.items():
        per_req: dict[str, list[float]] = {}
        for rid, x in r.rounds:
            per_req.setdefault(rid, []).append(x.root_alpha)
        ax.plot(range(1, 11), autocorrelation(list(per_req.values())), marker="o", label=name)
    ax.set_xlabel("lag (rounds)")
    ax.set_ylabel("Pearson r of root entropy")
    ax.set_title("entropy autocorrelation")
    ax.axhline(0, color="gray", lw=0.5)
    ax.legend(fontsize=7)
    paths.append(_save(fig, out_dir / "entropy_autocorrelation.png"))
    # 3. tau by method
    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(summary["methods"])
    ax.bar(names, [summary["methods"][n]["tau"] for n in names])
    ax.set_ylabel("tokens per target forward (tau)")
    ax.set_title("tau by method")
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize=7)
    paths.append(_save(fig, out_dir / "tau_by_method.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
