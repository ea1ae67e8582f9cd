"""``sage bench`` runner: every method on the same prompts, timed side by side.

Protocol (as in EAGLE, Spec-Bench and SpecVLM; ``docs/design/algorithm.md``, "Baselines"):

* Greedy by default; ``temperature > 0`` switches every method (and ``ar``) to sampling.
* Warm-up: one short generation per method before timing.
* Methods are **interleaved per batch of prompts** (ar, chain, ..., sage on batch 1, then on
  batch 2, ...) so machine noise hits all methods alike; speed-up is decode tokens/s of a method
  over that of ``ar`` in the same run.
* Decode time excludes prefill (SpecVLM protocol); the first generated token comes from prefill
  and is not counted as a decode token.
* Tree-policy overhead (the paper's "tree update" time): host time inside the policy's calls, per batched round and as a share of
  decode time (the paper reports 0.39% for its tree update).
* ``tau`` = decode tokens / target forwards (bonus included; ``ar`` scores exactly 1.00);
  ``accepted`` = mean accepted draft tokens per round (bonus excluded, SpecVLM's accept_length).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from ..core.policies import build_policy
from ..engines.lm import GenRequest
from ..engines.profile import alternating
from ..engines.speculative import GenOutput, SamplingParams, SpecEngine
from .methods import MethodSpec

__all__ = ["MethodResult", "run_methods"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class MethodResult:
    name: str
    decode_tokens: int = 0
    target_forwards: int = 0
    decode_s: float = 0.0
    prefill_s: float = 0.0
    profile_s: float = 0.0  # measuring the round cost (node_budget="auto"), outside prefill and decode
    policy_s: float = 0.0  # host time inside the tree policy's calls (part of decode_s; SpecEngine.last_policy_s)
    batch_rounds: int = 0  # batched rounds (target forwards of the whole batch)
    outputs: dict[str, list[int]] = field(default_factory=dict)
    forwards: dict[str, int] = field(default_factory=dict)  # target forwards per request
    rounds: list = field(default_factory=list)  # (request_id, RoundLog) in order
    exact: int = 0
    compared: int = 0
    mismatches: list[dict] = field(default_factory=list)

    @property
    def tau(self) -> float:
        return self.decode_tokens / max(1, self.target_forwards)

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else float("nan")

    def mean(self, attr: str) -> float:
        vals = [getattr(r, attr) for _, r in self.rounds]
        return sum(vals) / len(vals) if vals else float("nan")


def _batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def run_methods(
    engine: SpecEngine,
    methods: list[MethodSpec],
    requests: list[GenRequest],
    params: SamplingParams,
    batch_size: int = 1,
    warmup: int = 1,
    progress: bool = True,
) -> dict[str, MethodResult]:
    """Run every method on every request and collect metrics.

    The methods take turns batch by batch, their order reversed at every batch
    (:func:`~sage_plugin.engines.profile.alternating`): a machine whose speed drifts during the run slows every
    method alike, and no method always runs first (after another method's forwards) or last.
    """
    policies = {m.name: (build_policy(m.config.algorithm) if m.config is not None else None) for m in methods}
    results = {m.name: MethodResult(m.name) for m in methods}
    if warmup:
        warm = SamplingParams(params.temperature, params.top_k, params.top_p, 8, params.stop_token_ids, params.seed)
        for m in methods:
            for _ in range(warmup):
                engine.generate(requests[:1], warm, policies[m.name])
                results[m.name].profile_s += engine.last_profile_s
    batches = _batches(requests, batch_size)
    bar = tqdm(total=len(batches) * len(methods), desc="bench", disable=not progress, unit="run")
    for i, m in alternating(methods, len(batches)):
        outs: list[GenOutput] = engine.generate(batches[i], params, policies[m.name])
        res = results[m.name]
        res.decode_s += engine.last_decode_s
        res.prefill_s += engine.last_prefill_s
        res.profile_s += engine.last_profile_s
        res.policy_s += engine.last_policy_s
        # requests of a batch leave it but never join: the batch ran as many rounds as its longest request
        res.batch_rounds += max(out.target_forwards for out in outs)
        for out in outs:
            res.outputs[out.request_id] = out.tokens
            res.forwards[out.request_id] = out.target_forwards
            res.decode_tokens += max(0, len(out.tokens) - 1)
            res.target_forwards += out.target_forwards
            res.rounds.extend((out.request_id, r) for r in out.rounds)
        bar.set_postfix_str(m.name)
        bar.update()
    bar.close()
    ref = results.get("ar")
    if ref is not None:
        for res in results.values():
            for rid, toks in res.outputs.items():
                res.compared += 1
                if toks == ref.outputs[rid]:
                    res.exact += 1
                else:
                    res.mismatches.append(_first_divergence(rid, ref.outputs[rid], toks))
    return results


def _first_divergence(rid: str, ref: list[int], got: list[int]) -> dict:
    pos = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
    return {
        "request_id": rid,
        "position": pos,
        "ar_token": ref[pos] if pos < len(ref) else None,
        "token": got[pos] if pos < len(got) else None,
    }


def autocorrelation(series: list[list[float]], max_lag: int = 10) -> list[float]:
    """Pooled Pearson correlation of per-request sequences at lags 1..max_lag (NaN if undefined)."""
    out = []
    for lag in range(1, max_lag + 1):
        xs, ys = [], []
        for s in series:
            xs += s[:-lag]
            ys += s[lag:]
        if len(xs) < 3:
            out.append(float("nan"))
            continue
        x, y = torch.tensor(xs, dtype=torch.float64), torch.tensor(ys, dtype=torch.float64)
        x, y = x - x.mean(), y - y.mean()
        den = math.sqrt(float((x * x).sum()) * float((y * y).sum()))
        out.append(float((x * y).sum()) / den if den > 0 else float("nan"))
    return out
