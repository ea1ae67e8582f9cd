"""Fit SAGE's calibration table for a draft (``sage calibrate``, and the ``sage-calibrated`` bench method).

Plain decoding produces the target's own continuations of some prompts; one teacher-forced draft pass over each
prompt + continuation gives, at every generated position, the draft's top-k candidates, their probabilities and the
confidence alpha of the distribution they came from; a candidate counts as accepted where it equals the target's
token.  :func:`~sage_plugin.core.calibration.fit_calibration` turns those into the table
(``docs/design/algorithm.md``, "Calibrated path values").
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from ..core.calibration import fit_calibration
from ..core.entropy import topk_confidence
from ..engines.lm import GenRequest, TextModel
from ..engines.speculative import SamplingParams, SpecEngine

__all__ = ["collect_candidates", "calibrate", "write_calibration"]


def collect_candidates(
    engine: SpecEngine, requests: list[GenRequest], params: SamplingParams, k: int
) -> tuple[list[float], list[float], list[bool]]:
    """``(alpha, prob, accepted)`` of every top-``k`` draft candidate at every position plain decoding generated."""
    if not isinstance(engine.draft, TextModel):
        raise ValueError("calibration needs a text draft (TextModel): it reads the target's output teacher-forced")
    alpha: list[float] = []
    prob: list[float] = []
    accepted: list[bool] = []
    for req, out in zip(requests, engine.generate(requests, params, None), strict=True):
        if not out.tokens:
            continue
        n0 = len(req.prompt_ids)
        logits = engine.draft.sequence_logits(req.prompt_ids + out.tokens)[n0 - 1 : n0 - 1 + len(out.tokens)]
        top = torch.topk(torch.log_softmax(logits.float(), -1), k, dim=-1)
        conf = topk_confidence(top.values, k)
        hit = top.indices == torch.tensor(out.tokens, device=top.indices.device)[:, None]
        alpha += conf[:, None].expand_as(top.values).flatten().tolist()
        prob += top.values.exp().flatten().tolist()
        accepted += hit.flatten().tolist()
    return alpha, prob, accepted


def calibrate(
    engine: SpecEngine, requests: list[GenRequest], params: SamplingParams, k: int, alpha_bins: int = 4,
    prob_bins: int = 10,
) -> tuple[tuple[tuple[float, ...], ...], int]:  # fmt: skip
    """The fitted table and the number of candidates it was fitted on."""
    alpha, prob, accepted = collect_candidates(engine, requests, params, k)
    return fit_calibration(alpha, prob, accepted, alpha_bins, prob_bins), len(prob)


def write_calibration(path: str | Path, table, header: str) -> None:
    """A ``sage:`` YAML section holding ``calibration`` (usable as ``--config`` / ``--sage-config``)."""
    lines = "".join(f"# {h}\n" for h in header.splitlines())
    body = yaml.safe_dump({"sage": {"calibration": [list(r) for r in table]}}, default_flow_style=None, width=120)
    Path(path).write_text(lines + body)
