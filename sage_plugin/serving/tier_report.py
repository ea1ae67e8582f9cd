"""What the tier chooser reports (``GET /server_info``'s ``sage.tiers`` on SGLang): per tier its estimates, costs and
steps, and the overhead row.

Worked example: a chooser that ran ``[3, 4]`` 40 times at batch 1 (96.4 ms a step, 1.82 tokens) reports
``{"3:4": {"tokens": 1.82, "steps": 40, "mean_tokens": 1.8, "ms@1": 96.4, "steps@1": 40}, ..., "overhead": {"ms": 2.1}}``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

__all__ = ["TierTally", "tier_summary"]


class TierTally:
    """Per tier: the steps run at each size class, the accepted drafts summed over every request credited to it
    (the report's ``steps@B`` and ``mean_tokens``; the per_tier estimates' variance bound counts the requests), and,
    per size class, the tokens a request was expected to get when its step was chosen beside the tokens it got (the
    report's ``expected@B`` and ``served@B``: where they part, the chooser's acceptance estimate is biased there).

    >>> tally = TierTally(["a"])
    >>> tally.count_step("a", 4); tally.count_step("a", 1); tally.credit("a", [2, 0, 1], 4, 2.5)
    >>> tally.steps_at("a"), tally.requests("a"), tally.mean_tokens("a"), tally.expected_served("a")
    ({1: 1, 4: 1}, 3, 2.0, {4: (2.5, 2.0)})
    """

    def __init__(self, tiers: Iterable[Hashable]) -> None:
        self._steps_at: dict[tuple[Hashable, int], int] = {}
        self._lifetime: dict[Hashable, list[int]] = {t: [0, 0] for t in tiers}
        # (tier, size class) -> [expected tokens summed over requests, tokens served summed, requests]
        self._calibration: dict[tuple[Hashable, int], list[float]] = {}

    def count_step(self, tier: Hashable, size_class: int) -> None:
        key = (tier, size_class)
        self._steps_at[key] = self._steps_at.get(key, 0) + 1

    def credit(
        self,
        tier: Hashable,
        accepted_drafts: Sequence[int],
        size_class: int | None = None,
        expected: float | None = None,
    ) -> None:
        """One step's accepted draft counts (bonus token excluded), one per request; with the step's size class and
        the tokens per request the chooser expected of it when it chose the step, that pair too."""
        self._lifetime[tier][0] += sum(accepted_drafts)
        self._lifetime[tier][1] += len(accepted_drafts)
        if size_class is not None and expected is not None and accepted_drafts:
            c = self._calibration.setdefault((tier, size_class), [0.0, 0.0, 0])
            c[0] += expected * len(accepted_drafts)
            c[1] += sum(accepted_drafts) + len(accepted_drafts)
            c[2] += len(accepted_drafts)

    def expected_served(self, tier: Hashable) -> dict[int, tuple[float, float]]:
        """``{size class: (expected, served)}`` of ``tier``, ascending: the mean tokens per request the chooser
        expected of the steps it chose, and the mean tokens those requests got."""
        return {
            bs: (round(e / n, 3), round(s / n, 3))
            for (t, bs), (e, s, n) in sorted(self._calibration.items(), key=lambda kv: kv[0][1])
            if t == tier and n
        }

    def steps_at(self, tier: Hashable) -> dict[int, int]:
        """``{size class: steps}`` of ``tier``, ascending."""
        return {bs: n for (t, bs), n in sorted(self._steps_at.items(), key=lambda kv: kv[0][1]) if t == tier}

    def requests(self, tier: Hashable) -> int:
        return self._lifetime[tier][1]

    def mean_tokens(self, tier: Hashable) -> float | None:
        """Tokens per request over every request credited (accepted drafts + the bonus token; None before any)."""
        total, n = self._lifetime[tier]
        return round(1.0 + total / n, 3) if n else None


def tier_summary(chooser: Any) -> dict[str, dict[str, float | None]]:
    """Per tier of ``chooser`` (a :class:`~.tiers.TierChooser`, which calls this from its ``summary``; not imported:
    the chooser imports this module): expected tokens per request (its current estimates: overall, and per alpha bin
    ``tokens@aB``), ``mean_tokens`` (tokens per request averaged over every request the tier ever served, None before
    any; the off tier: 1.0), the measured cost (ms) at each size class seen (the batch size itself without captured
    sizes) and the steps run there, the tokens per request expected when those steps were chosen and served by them
    (``expected@B``, ``served@B``: drafted tiers); then ``overhead``: the per-step overhead, the admission price per
    token of each regime at each load (``admission_ms_per_token_drafted@L``) and the acceptance changes detected
    (when the chooser keeps them), and the measured catch-up of a lagging draft at each size class (``catch_up_ms@B``,
    once one ran)."""
    out: dict[str, dict[str, float | None]] = {}
    for t in chooser.tiers:
        steps_at = chooser.tally.steps_at(t)
        row: dict[str, float | None] = {"tokens": chooser.expected_tokens(t), "steps": sum(steps_at.values())}
        row["mean_tokens"] = 1.0 if t.off else chooser.tally.mean_tokens(t)
        for b in range(chooser.alpha_bins):
            if not t.off and chooser.has_bin_estimate(t, b):
                row[f"tokens@a{b}"] = round(chooser.expected_tokens(t, (b + 0.5) / chooser.alpha_bins), 3)
        for bs in chooser.cost_classes(t):
            row[f"ms@{bs}"] = round(1000.0 * chooser.cost(t, bs), 2)
        row.update({f"steps@{bs}": n for bs, n in steps_at.items()})
        for bs, (expected, served) in chooser.tally.expected_served(t).items():
            row[f"expected@{bs}"], row[f"served@{bs}"] = expected, served
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
