"""Method specifications for ``sage bench``.

A method is ``ar`` (plain decoding) or a tree policy with optional config overrides::

    sage                                   SAGE with the recommended defaults
    sage-literal=sage:threshold_on=joint,rounding=half_up,topology=online
    sage:threshold_on=joint                an ablation (name defaults to the spec text)
    eagle2:eagle_total_tokens=32

``NAME=POLICY:k=v,...`` names a variant; values are parsed as YAML scalars.  In a ``--methods`` list
(:func:`parse_methods`) a comma item that does not start a method (``ar``, a policy or a named ablation, optionally
as ``NAME=...``) continues the previous method's options::

    ar,static,joint=sage:threshold_on=joint,node_budget=fixed,sage   ->   ar | static | joint (2 options) | sage
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import yaml

from ..config import ConfigError, SageConfig
from ..core.policies import POLICIES
from ..engines.support import REFERENCE_SUPPORT

__all__ = ["MethodSpec", "parse_method", "parse_methods", "DEFAULT_METHODS", "ABLATIONS", "TUNED"]

#: ``sage`` sizes its trees to this device's measured verify cost (``node_budget="auto"``); ``sage-paper`` is SAGE
#: as the paper runs it: every node its levels keep is verified, up to ``n_max`` (``node_budget="fixed"``,
#: ``rerank_pool="kept"``), the setting the baselines use.
DEFAULT_METHODS = ("ar", "chain", "static", "eagle2", "sage", "sage-paper")

#: Named ablations (docs/design/algorithm.md: the components and the open points), usable as ``--methods`` entries.
ABLATIONS: dict[str, str] = {
    "sage-paper": "sage:node_budget=fixed,rerank_pool=kept",
    "sage-kept": "sage:rerank_pool=kept",  # the tree SAGE's levels keep, cut to the device (no beam pool)
    "sage-entropy-only": "sage:use_history=false",
    "sage-history-only": "sage:use_entropy=false",
    "sage-fixed": "sage:use_entropy=false,use_history=false",
    "sage-fresh-alpha": "sage:alpha_source=fresh",
    "sage-path-alpha": "sage:alpha_source=path_mean",
    "sage-ceil": "sage:rounding=ceil",
    "sage-floor": "sage:rounding=floor",
    "sage-theta-joint": "sage:threshold_on=joint",  # the paper's formal rule (open point 4, see sage_plugin/config)
    "sage-no-top1": "sage:keep_top1=false",
    "sage-planned": "sage:topology=planned",
    "sage-history-relative": "sage:history_mode=relative",  # thresholds relative to the draft's running mean
    "sage-paper-relative": "sage:node_budget=fixed,rerank_pool=kept,history_mode=relative",
    "sage-no-lookahead": "sage:lookahead=false",  # stop drafting only where the cut leaves the newest level out
    "sage-forwards-only": "sage:price_level_host=false",  # price a level's draft forward only, not its host time
    "sage-unpadded": "sage:pad_forwards=false",  # forwards at their own size, priced by the running maximum
    "sage-dcap8": "sage:d_cap=8",
    "sage-dcap12": "sage:d_cap=12",
    "sage-beam10": "sage:beam_depth=10",  # the beam to level 10 (d_cap's default: beam_depth against d_cap)
    "sage-nmax32": "sage:n_max=32",
    "sage-nmax96": "sage:n_max=96",
    # SAGE verifying at most as many nodes as the static tree (mc_sim_7b_63: 25): tau at an equal node budget
    "sage-paper-nmax25": "sage:node_budget=fixed,rerank_pool=kept,n_max=25",
    "static-depth8-chain": "chain:chain_depth=8",
}


#: Methods fitted before the run on the bundled tuning prompts: ``static-tuned`` (the fastest fixed tree on this
#: device, :mod:`sage_plugin.bench.tune`), ``sage-calibrated`` (SAGE with a calibration table fitted for this draft,
#: :mod:`sage_plugin.bench.calibrate`).
TUNED = ("static-tuned", "sage-calibrated")


@dataclass(frozen=True, slots=True)
class MethodSpec:
    name: str
    config: SageConfig | None  # None: plain autoregressive decoding
    tuned: bool = False  # the config is a placeholder until ``sage bench`` tunes it (``static-tuned``)


def parse_method(text: str, base: SageConfig) -> MethodSpec:
    """Parse one ``--methods`` entry against the base config (see module docstring)."""
    text = text.strip()
    name = None
    if "=" in text.split(":", 1)[0]:
        name, text = text.split("=", 1)
    if text in ABLATIONS:
        name = name or text
        text = ABLATIONS[text]
    policy, _, overrides = text.partition(":")
    name = name or (policy if not overrides else f"{policy}:{overrides}")
    if policy in ("ar", *TUNED):
        if overrides:
            raise ConfigError(f"method {policy} takes no options")
        if policy == "ar":
            return MethodSpec(name, None)
        return MethodSpec(name, base.replace(policy="static" if policy == "static-tuned" else "sage"), True)
    if policy not in POLICIES:
        raise ConfigError(
            f"unknown method {policy!r}: use ar, {', '.join(TUNED)}, {', '.join(POLICIES)}, or one of "
            f"{', '.join(ABLATIONS)}"
        )
    changes: dict = {"policy": policy}
    for item in filter(None, overrides.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"method option {item!r} must be key=value")
        changes[key.strip()] = yaml.safe_load(value)
    cfg = base.replace(**changes)
    REFERENCE_SUPPORT.check(cfg)  # before any model loads
    # one draft serves every method of a run: its CPU and VLM sections are the run's
    for field in [f.name for section in (cfg.cpu, cfg.vlm) for f in dataclasses.fields(section)]:
        value = cfg.knob(field)
        if value != base.knob(field):
            raise ConfigError(
                f"method {name}: {field} is the run's draft, not a method's: set it with --set {field}="
                f"{str(value).lower() if isinstance(value, bool) else value} (every method then drafts with it)"
            )
    return MethodSpec(name, cfg)


def _starts_method(item: str) -> bool:
    head = item.split(":", 1)[0]
    if "=" in head:  # NAME=POLICY...; a bare key=value continues the previous method's options
        head = head.split("=", 1)[1]
    return head.strip() in ("ar", *TUNED, *POLICIES, *ABLATIONS)


def parse_methods(text: str, base: SageConfig) -> list[MethodSpec]:
    """Parse a comma-separated ``--methods`` list (see module docstring); method names must be distinct.

    Every method's config (and ``base``, which ``ar`` runs with) is checked against what the reference engine
    honours (:data:`~sage_plugin.engines.support.REFERENCE_SUPPORT`).
    """
    REFERENCE_SUPPORT.check(base)
    entries: list[str] = []
    for item in text.split(","):
        if entries and not _starts_method(item):
            entries[-1] += "," + item
        else:
            entries.append(item)
    specs = [parse_method(e, base) for e in entries]
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"--methods names must be distinct; repeated: {', '.join(dup)} (name variants NAME=...)")
    return specs
