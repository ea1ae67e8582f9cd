"""``static-tuned``: the best fixed tree for this device, found by a timed sweep before the run (Sequoia-style).

A fixed tree tuned to the hardware is the baseline a device-aware SAGE has to beat: Sequoia picks its tree's size
and depth from measured timings, EAGLE its ``total_token`` by profiling.  Candidates are the static tree family cut
to N rank paths (N in :data:`STATIC_SIZES`, level order, ancestor-closed) and chains of depth
:data:`CHAIN_DEPTHS`; each decodes the tuning prompts (the bundled mixed set, not the run's own prompts unless the
run uses the bundled set) and the one with the highest decode tokens per second is run as ``static-tuned``.
"""

from __future__ import annotations

from ..config import SageConfig
from ..core.policies import build_policy
from ..engines.lm import GenRequest
from ..engines.profile import alternating
from ..engines.speculative import SamplingParams, SpecEngine

__all__ = ["CHAIN_DEPTHS", "STATIC_SIZES", "static_cut", "tune_static", "tuning_candidates"]

STATIC_SIZES = (2, 4, 6, 8, 12, 16, 25)
CHAIN_DEPTHS = (1, 2, 3, 4, 5, 6)


def static_cut(base: SageConfig, n: int) -> tuple[tuple[int, ...], ...]:
    """The first ``n`` rank paths of the static tree in level order: every parent comes before its children."""
    return tuple(sorted(base.static_tree, key=lambda p: (len(p), p))[:n])


def tuning_candidates(base: SageConfig) -> dict[str, SageConfig]:
    """``{label: config}`` of the fixed trees tried: ``static@N`` and ``chain@D``."""
    out = {
        f"static@{n}": base.replace(policy="static", static_tree=[list(p) for p in static_cut(base, n)])
        for n in STATIC_SIZES
    }
    out.update({f"chain@{d}": base.replace(policy="chain", chain_depth=d) for d in CHAIN_DEPTHS})
    return out


def tune_static(
    engine: SpecEngine, base: SageConfig, requests: list[GenRequest], params: SamplingParams
) -> tuple[str, SageConfig, dict[str, float]]:
    """Time every candidate on ``requests`` (one at a time, after one warm-up request each).

    The candidates take turns request by request, the order reversed at every request
    (:func:`~sage_plugin.engines.profile.alternating`, as forward sizes are timed): a machine whose speed drifts
    during the tuning slows every candidate alike instead of the ones timed last.

    Returns ``(label, config, tok_s)``: the fastest candidate and every candidate's decode tokens per second.
    """
    cands = tuning_candidates(base)
    policies = {label: build_policy(cfg) for label, cfg in cands.items()}
    for policy in policies.values():
        engine.generate(requests[:1], params, policy)  # warm-up
    tokens, seconds = dict.fromkeys(cands, 0), dict.fromkeys(cands, 0.0)
    for i, label in alternating(list(policies), len(requests)):
        (out,) = engine.generate([requests[i]], params, policies[label])
        tokens[label] += max(0, len(out.tokens) - 1)
        seconds[label] += engine.last_decode_s
    tok_s = {label: tokens[label] / seconds[label] if seconds[label] > 0 else 0.0 for label in cands}
    best = max(tok_s, key=tok_s.get)
    return best, cands[best], tok_s
