"""What the tier chooser reports (``GET /server_info``'s ``sage.tiers`` on SGLang): per tier its estimates, costs and
steps, and the overhead row.

Worked example: a chooser that ran ``[3, 4]`` 40 times at batch 1 (96.4 ms a step, 1.82 tokens) reports
``{"3:4": {"tokens": 1.82, "steps": 40, "mean_tokens": 1.8, "ms@1": 96.4, "steps@1": 40}, ..., "overhead": {"ms": 2.1}}``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["tier_summary"]


def tier_summary(chooser: Any) -> dict[str, dict[str, float | None]]:
    """Per tier of ``chooser`` (a :class:`~.tiers.TierChooser`, which calls this from its ``summary``; not imported:
    the chooser imports this module): expected tokens per request (its current estimates: overall, and per alpha bin
    ``tokens@aB``), ``mean_tokens`` (tokens per request averaged over every request the tier ever served, None before
    any; the off tier: 1.0), the measured cost (ms) at each size class seen (the batch size itself without captured
    sizes) and the steps run there; then ``overhead``: the per-step overhead, the admission price per token of each
    regime and the acceptance changes detected (when the chooser keeps them), and the measured catch-up of a lagging
    draft at each size class (``catch_up_ms@B``, once one ran)."""
    out: dict[str, dict[str, float | None]] = {}
    levels = chooser.acceptance != "per_tier"
    for t in chooser.tiers:
        steps_at = {bs: n for (tt, bs), n in sorted(chooser._steps_at.items(), key=lambda kv: kv[0][1]) if tt == t}
        row: dict[str, float | None] = {"tokens": chooser.expected_tokens(t), "steps": sum(steps_at.values())}
        total, n = chooser._lifetime[t]
        row["mean_tokens"] = 1.0 if t.off else (round(1.0 + total / n, 3) if n else None)
        for b in range(chooser.alpha_bins):
            if not t.off and (chooser.levels.has(chooser._group(t), b) if levels else (t, b) in chooser._accepted_bin):
                row[f"tokens@a{b}"] = round(chooser.expected_tokens(t, (b + 0.5) / chooser.alpha_bins), 3)
        for tt, bs in sorted(chooser._cost, key=lambda k: k[1]):
            if tt == t:
                row[f"ms@{bs}"] = round(1000.0 * chooser.cost(tt, bs), 2)
        row.update({f"steps@{bs}": n for bs, n in steps_at.items()})
        out[f"{t.steps}:{t.draft_tokens}"] = row
    overhead = chooser.overhead_seconds()
    out["overhead"] = {"ms": None if overhead is None else round(1000.0 * overhead, 2)}
    for bs in chooser.catch_up_classes():  # a lagging draft's catch-up price per size class (tier_off_lag)
        out["overhead"][f"catch_up_ms@{bs}"] = round(1000.0 * chooser.catch_up(bs), 2)
    if chooser.admission is not None:
        out["overhead"].update(chooser.admission.summary())
    if chooser.levels.change_z:
        out["overhead"]["acceptance_changes"] = chooser.levels.changes
    return out
