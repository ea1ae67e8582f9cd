"""`SageConfig`: the one frozen, validated configuration object of the project.

Every SAGE knob (paper defaults, arXiv 2602.00523) and every point the paper leaves open
(``docs/design/algorithm.md``, numbered 1..11 below) is a field with its recommended default, held by the section
of the layer that reads it (:mod:`.sections`: ``algorithm``, ``serving``, ``cpu``, ``runtime``, ``vlm``).  Users
write the fields flat (one YAML mapping, one ``--sage-<field>`` flag each); runtimes (the reference engine, the
SGLang and TensorRT-LLM adapters) and the bench build this object and hand each layer its section; nothing else
reads knobs, and no function reads environment variables.

A bad value raises :class:`ConfigError` naming the field and its allowed range::

    >>> SageConfig(d_min=0)
    Traceback (most recent call last):
    ...
    sage_plugin.config.ConfigError: d_min must be an integer in [1, 64], got 0

Open points (``docs/design/algorithm.md``) and their switches:

==  ===========================================  =====================  ==========================
#   open point                                   field                  values (default first)
==  ===========================================  =====================  ==========================
1   which distribution gives alpha               ``alpha_source``       lag1, fresh, path_mean
2   rounding of D, W, W_l                        ``rounding``           half_up, ceil, floor
    clamp W_l >= 1                               ``clamp_level_width``  True, False
3   P_parent in Eq. 12                           ``parent_prob``        conditional, joint
4   what theta_l is compared with                ``threshold_on``       conditional, joint
5   probabilities for W_l / theta_l              ``prob_space``         full, topk
6   order under N_max                            ``budget_order``       best_first, parent_order
7   always keep the rank-0 level-1 child         ``keep_top1``          True, False
8   when the topology is built                   ``topology``           online, planned
9   history step / cap / cool-down               ``history_step``,      1, 10, full_window
                                                 ``d_cap``,
                                                 ``history_cooldown``
10  tau units for the history thresholds         ``history_tau``        drafts, drafts_plus_bonus
    history thresholds: fixed or relative        ``history_mode``,      absolute, relative
                                                 ``history_*_ratio``
11  rebuild buffers every round                  (always; not a knob: trees are rebuilt per round)
==  ===========================================  =====================  ==========================

Point 4's default departs from the recommended reading (``joint``, the paper's formal inclusion rule): under
greedy verification the joint reading keeps confident paths shorter than ``D`` even with a perfect draft (the
measurement is in ``docs/design/algorithm.md``, "Open points").  ``joint`` stays a switch (bench ablation
``sage-theta-joint``).

Beyond the paper: ``node_budget`` (``auto``, ``fixed``).  ``fixed`` verifies every node SAGE builds (at most
``n_max``), as the paper does on its GPU.  ``auto`` (default) also cuts each round's tree to the node count that
maximises expected tokens per second under the target's verify cost measured on this device
(:mod:`sage_plugin.core.cost`), and stops drafting levels the cut would not use.  Where a verify forward costs the
same for 1 or 64 tokens (a GPU at small batch) the two agree.  Only SAGE uses it: the baselines keep their
published shapes.  With ``auto``, ``pad_forwards`` (default on) runs each verify and draft level at the cheapest
measured size at or above its own (masked padding rows), and prices each size by that: on a CPU whose BLAS is slow at
2-3 rows a 3-token verify costs more than an 8-token one (``docs/design/algorithm.md``, "sizing trees to the device").
``cost_refresh`` R re-prices the measured curve every R rounds from the medians of the run's own forward timings
(:mod:`sage_plugin.engines.cost_samples`); 0 (default) keeps the start-up sample, so that within one engine a
seeded sampling run repeats exactly (the tree shapes, and with them the random draws, follow the prices).

Not every runtime honours every field: :mod:`sage_plugin.support` holds each runtime's declared table, and a
runtime refuses a value it does not honour at launch (``docs/reference/runtime-support.md``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..core.tree import MC_SIM_7B_63
from .checks import ConfigError
from .files import read_yaml_mapping
from .opt_out import OPT_OUT_PARAMS, opt_out_names
from .sections import AlgorithmConfig, CpuConfig, RuntimeConfig, ServingConfig, VlmConfig

__all__ = [
    "KNOBS",
    "SECTIONS",
    "AlgorithmConfig",
    "ConfigError",
    "CpuConfig",
    "MC_SIM_7B_63",
    "OPT_OUT_PARAMS",
    "RuntimeConfig",
    "SageConfig",
    "ServingConfig",
    "VlmConfig",
    "from_mapping",
    "knob_fields",
    "opt_out_names",
    "read_sage_yaml",
]

#: section name -> its class, in the order the configuration reference lists them
SECTIONS: dict[str, type] = {
    "algorithm": AlgorithmConfig,
    "serving": ServingConfig,
    "cpu": CpuConfig,
    "runtime": RuntimeConfig,
    "vlm": VlmConfig,
}

#: every field a user sets (flag, YAML key) -> the section that holds it; names are unique across sections
KNOBS: dict[str, str] = {f.name: name for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
assert len(KNOBS) == sum(len(dataclasses.fields(c)) for c in SECTIONS.values()), "a field name in two sections"


#: the fields holding rows (tuples of tuples in the config, lists of lists as users write them) -> what a row list is
_ROW_FIELDS: dict[str, str] = {
    "static_tree": "a list of rank paths like [[0], [0, 0]]",
    "calibration": "a list of rows of acceptance rates",
    "tiers": "a list of [steps, draft_tokens] pairs",
}


def _refuse_unknown(names: Any, where: str = "") -> None:
    """One :class:`ConfigError` naming every name in ``names`` that is not a field (prefixed ``where: `` if given)."""
    unknown = sorted(str(n) for n in names if n not in KNOBS)
    if unknown:
        prefix = f"{where}: " if where else ""
        raise ConfigError(f"{prefix}unknown SAGE option(s): {', '.join(unknown)} (known: {', '.join(sorted(KNOBS))})")


def knob_fields() -> tuple[dataclasses.Field, ...]:
    """Every user-facing field (its :class:`dataclasses.Field`, default included), section by section."""
    return tuple(f for cls in SECTIONS.values() for f in dataclasses.fields(cls))


@dataclass(frozen=True, init=False)
class SageConfig:
    """All knobs of SAGE and its baselines, composed of one section per layer (:mod:`.sections`).

    Built from flat fields, as users write them (``SageConfig(d_max=6, tier_off_lag=128)``), or from section
    objects (``SageConfig(algorithm=AlgorithmConfig(d_max=6))``); each layer is handed its own section
    (``cfg.algorithm`` to the core, ``cfg.serving`` to the tier chooser, ...).  Flat reads by name are for code
    that walks every field (flags, support tables, reports): :meth:`knob`, :meth:`to_dict`.

    >>> cfg = SageConfig(d_max=6, tier_off_lag=128)
    >>> cfg.algorithm.d_max, cfg.serving.tier_off_lag, cfg.knob("d_max")
    (6, 128, 6)
    """

    algorithm: AlgorithmConfig
    serving: ServingConfig
    cpu: CpuConfig
    runtime: RuntimeConfig
    vlm: VlmConfig

    def __init__(self, **values: Any) -> None:
        given = {name: values.pop(name) for name in SECTIONS if name in values}
        _refuse_unknown(values)
        for name, cls in SECTIONS.items():
            mine = {k: v for k, v in values.items() if KNOBS[k] == name}
            section = given.get(name)
            if section is None:
                section = cls(**mine)
            elif not isinstance(section, cls):
                raise ConfigError(f"{name} must be a {cls.__name__}, got {type(section).__name__}")
            elif mine:
                section = dataclasses.replace(section, **mine)
            object.__setattr__(self, name, section)

    def knob(self, name: str) -> Any:
        """The value of the user-facing field ``name`` (KeyError for an unknown name)."""
        return getattr(getattr(self, KNOBS[name]), name)

    # -- (de)serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The flat fields as a user writes them (YAML, flags): tuples of tuples as lists of lists."""
        out: dict[str, Any] = {}
        for name in SECTIONS:
            out.update(dataclasses.asdict(getattr(self, name)))
        for key in _ROW_FIELDS:
            out[key] = [list(row) for row in out[key]]
        return out

    def replace(self, **changes: Any) -> "SageConfig":
        return from_mapping({**self.to_dict(), **changes})

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "SageConfig":
        return from_mapping(values)

    @classmethod
    def from_yaml(cls, path: str | Path, section: str | None = "sage") -> "SageConfig":
        """Load from a YAML file (:func:`read_sage_yaml`) and validate."""
        return from_mapping(read_sage_yaml(path, section=section))


def read_sage_yaml(path: str | Path, *, section: str | None = "sage", label: str | None = None) -> dict[str, Any]:
    """The SageConfig fields of a YAML file, unvalidated: the one reader of SAGE YAML (reference and runtimes).

    The fields sit under a top-level ``section`` mapping (``sage:``, as in ``engine_configs/``) or at top level.
    Errors are one :class:`ConfigError` starting with ``label`` (default: the path): an unreadable file, invalid
    YAML, something other than a mapping, or unknown keys.  Callers merge the mapping with other sources and
    validate the result once (:func:`from_mapping`).
    """
    where = label or str(path)
    data = read_yaml_mapping(path, where, section, what="a mapping of SageConfig fields")
    _refuse_unknown(data, where)
    return dict(data)


def from_mapping(values: Mapping[str, Any]) -> SageConfig:
    """Build a config from plain values (YAML, CLI); unknown keys are one clear error, before any value is read."""
    _refuse_unknown(values)
    kwargs = dict(values)
    for key, what in _ROW_FIELDS.items():
        if key in kwargs:
            rows = kwargs[key]
            if not isinstance(rows, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in rows):
                raise ConfigError(f"{key} must be {what}, got {rows!r}")
            kwargs[key] = tuple(tuple(r) for r in rows)
    return SageConfig(**kwargs)
