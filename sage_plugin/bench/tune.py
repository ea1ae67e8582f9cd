"""``static-tuned``: the best fixed tree for this device, found by a timed sweep before the run (Sequoia-style).

A fixed tree tuned to the hardware is the baseline a device-aware SAGE has to beat: Sequoia picks its tree's size
and depth from measured timings, EAGLE its ``total_token`` by profiling.  Candidates are the static tree family cut
to N rank paths (N in :data:`STATIC_SIZES`, level order, ancestor-closed) and chains of depth
:data:`CHAIN_DEPTHS`; each decodes the tuning prompts (the bundled mixed set, not the run's own prompts unless the
run uses the bundled set) and the one with the highest decode tokens per second is run as ``static-tuned``.

The fit runs in two stages, as a sweep with a noisy clock should: every candidate is timed on the first ``screen``
prompts, and the ``finalists`` fastest of them on the rest as well; the pick is the finalist with the most decode
tokens per second over all the prompts.  Timed on four short prompts alone, the pick moved between runs of one
machine (chain@2, static@2, static@6 within a few per cent of each other), and a baseline that picks by noise is a
weaker baseline than the device allows.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import SageConfig
from ..core.policies import build_policy
from ..engines.lm import GenRequest
from ..engines.profile import alternating
from ..engines.speculative import SamplingParams, SpecEngine

__all__ = ["CHAIN_DEPTHS", "STATIC_SIZES", "StaticFit", "static_cut", "tune_static", "tuning_candidates"]

STATIC_SIZES = (2, 4, 6, 8, 12, 16, 25)
CHAIN_DEPTHS = (1, 2, 3, 4, 5, 6)


def static_cut(base: SageConfig, n: int) -> tuple[tuple[int, ...], ...]:
    """The first ``n`` rank paths of the static tree in level order: every parent comes before its children."""
    return tuple(sorted(base.algorithm.static_tree, key=lambda p: (len(p), p))[:n])


def tuning_candidates(base: SageConfig) -> dict[str, SageConfig]:
    """``{label: config}`` of the fixed trees tried: ``static@N`` and ``chain@D``."""
    out = {
        f"static@{n}": base.replace(policy="static", static_tree=[list(p) for p in static_cut(base, n)])
        for n in STATIC_SIZES
    }
    out.update({f"chain@{d}": base.replace(policy="chain", chain_depth=d) for d in CHAIN_DEPTHS})
    return out


@dataclass(frozen=True)
class StaticFit:
    """What :func:`tune_static` measured: the pick, its config, and every candidate's decode tokens per second (the
    finalists' over all the prompts, the others' over the screening prompts)."""

    label: str
    config: SageConfig
    tok_s: dict[str, float]
    finalists: tuple[str, ...]


def _timed(engine, policies, labels, requests, params, tokens, seconds) -> None:
    """Decode ``requests`` with every policy of ``labels``, in turns request by request, into the running totals."""
    for i, label in alternating(labels, len(requests)):
        (out,) = engine.generate([requests[i]], params, policies[label])
        tokens[label] += max(0, len(out.tokens) - 1)
        seconds[label] += engine.last_decode_s


def tune_static(
    engine: SpecEngine,
    base: SageConfig,
    requests: list[GenRequest],
    params: SamplingParams,
    screen: int | None = None,
    finalists: int = 3,
) -> StaticFit:
    """Time every candidate on ``requests[:screen]`` (one at a time, after one warm-up request each), then the
    ``finalists`` fastest on ``requests[screen:]`` too, and pick the finalist fastest over all of ``requests``
    (``screen=None``: every candidate on every request).

    The candidates take turns request by request, the order reversed at every request
    (:func:`~sage_plugin.engines.profile.alternating`, as forward sizes are timed): a machine whose speed drifts
    during the tuning slows every candidate alike instead of the ones timed last.
    """
    cands = tuning_candidates(base)
    policies = {label: build_policy(cfg.algorithm) for label, cfg in cands.items()}
    for policy in policies.values():
        engine.generate(requests[:1], params, policy)  # warm-up
    tokens, seconds = dict.fromkeys(cands, 0), dict.fromkeys(cands, 0.0)

    def rates() -> dict[str, float]:
        return {label: tokens[label] / seconds[label] if seconds[label] > 0 else 0.0 for label in cands}

    screen = len(requests) if screen is None else screen
    _timed(engine, policies, list(cands), requests[:screen], params, tokens, seconds)
    screened = rates()
    final = tuple(sorted(cands, key=screened.get, reverse=True)[: max(1, finalists)])
    if requests[screen:]:
        _timed(engine, policies, list(final), requests[screen:], params, tokens, seconds)
    tok_s = rates()
    best = max(final, key=tok_s.get)
    return StaticFit(best, cands[best], tok_s, final)
