"""What each runtime honours of :class:`~sage_plugin.config.SageConfig`, and the launch check that enforces it.

Every consumer of the config (the reference engine, SGLang, TensorRT-LLM) declares a :class:`RuntimeSupport`: for
each field it reads, a :class:`Honoured` entry (every valid value, or a set of values); a field it does not list
is one it never reads.  :meth:`RuntimeSupport.check` runs when the runtime starts (before any model loads or server
process spawns) and raises one :class:`~sage_plugin.config.ConfigError` naming the field and the runtime for:

* a non-default value of a field the runtime does not read;
* a non-default value outside the values the runtime honours.

A default the runtime does not apply (for example ``node_budget: auto`` where the runtime verifies a fixed number
of tokens) is accepted and reported by :meth:`RuntimeSupport.defaults_not_applied`, so a launch with no SAGE
options always starts.  ``docs/reference/runtime-support.md`` shows the tables (:func:`support_matrix`).

Example::

    >>> from sage_plugin.config import SageConfig
    >>> only_sage = RuntimeSupport("demo", {"policy": Honoured({"sage"}, "baselines run elsewhere")})
    >>> only_sage.check(SageConfig(policy="chain"))
    Traceback (most recent call last):
    ...
    sage_plugin.config.ConfigError: policy: demo honours only 'sage' (baselines run elsewhere), got 'chain'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from .config import KNOBS, ConfigError, SageConfig, knob_fields

__all__ = ["FIXED_BEAM_SELECTION", "Honoured", "RuntimeSupport", "support_matrix"]

_DEFAULTS = SageConfig()


@dataclass(frozen=True)
class Honoured:
    """A field a runtime reads.

    Attributes:
        values: the values it honours (None: every valid value).
        note: how the runtime applies the field, or why other values are not honoured.
    """

    values: frozenset | set | None = None
    note: str = ""


#: how a runtime that runs :func:`~sage_plugin.core.beam_selection.select_shaped` inside its own fixed draft beam (SGLang's
#: EAGLE v2 worker, TensorRT-LLM's dynamic tree) applies the selection's beam-dependent fields
FIXED_BEAM_SELECTION: Mapping[str, Honoured] = {
    "prob_space": Honoured(note="topk renormalises over the siblings the beam holds"),
    "rerank_pool": Honoured(
        note="which beam candidates come before the rest: beam (default) the most probable paths, children "
        "the children of what SAGE's shape grows, kept the shape's nodes (the paper's tree), then fill"
    ),
}


@dataclass(frozen=True)
class RuntimeSupport:
    """One runtime's declared table.

    Attributes:
        runtime: its name in messages (``"SGLang 0.5.23"``).
        honours: field -> :class:`Honoured` for every field the runtime reads.
        not_read: field -> why the runtime does not read it (shown in the error and the docs).
    """

    runtime: str
    honours: Mapping[str, Honoured]
    not_read: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted((set(self.honours) | set(self.not_read)) - set(KNOBS))
        if unknown:
            raise ValueError(f"{self.runtime}: support table names unknown SageConfig fields {unknown}")

    def check(self, cfg: SageConfig, name: Callable[[str], str] = str) -> None:
        """Raise :class:`ConfigError` for the first field ``cfg`` sets to a value this runtime does not honour.

        Args:
            cfg: the validated config.
            name: how the field is spelled to the user (SGLang: ``--sage-<field>``).
        """
        for f in knob_fields():
            value, default = cfg.knob(f.name), _DEFAULTS.knob(f.name)
            if value == default:
                continue
            entry = self.honours.get(f.name)
            if entry is None:
                why = self.not_read.get(f.name, "it does not read this field")
                raise ConfigError(
                    f"{name(f.name)}: {self.runtime} does not honour it ({why}); leave it at its default "
                    f"{_show(default)}, got {_show(value)}"
                )
            if entry.values is not None and value not in entry.values:
                allowed = " or ".join(_show(v) for v in sorted(entry.values, key=str))
                note = f" ({entry.note})" if entry.note else ""
                raise ConfigError(f"{name(f.name)}: {self.runtime} honours only {allowed}{note}, got {_show(value)}")

    def defaults_not_applied(self) -> dict[str, str]:
        """Fields whose default this runtime does not apply: field -> what it does instead."""
        out = {}
        for f in knob_fields():
            entry = self.honours.get(f.name)
            default = _DEFAULTS.knob(f.name)
            if entry is not None and entry.values is not None and default not in entry.values:
                out[f.name] = entry.note
        return out

    def status(self, field_name: str) -> str:
        """One table cell: ``yes``, ``yes: a, b``, or ``no`` with the reason."""
        entry = self.honours.get(field_name)
        if entry is None:
            return f"no ({self.not_read.get(field_name, 'not read')})"
        if entry.values is None:
            return "yes" + (f" ({entry.note})" if entry.note else "")
        shown = ", ".join(str(v) for v in sorted(entry.values, key=str))
        return f"only {shown}" + (f" ({entry.note})" if entry.note else "")


def _show(value: Any) -> str:
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        return f"{len(value)} rank paths"
    return repr(value)


def support_matrix(tables: Iterable[RuntimeSupport]) -> str:
    """A Markdown table: one row per SageConfig field (with its section), one column per runtime."""
    tables = list(tables)
    lines = [
        "| section | field | default | " + " | ".join(t.runtime for t in tables) + " |",
        "|---|---|---|" + "---|" * len(tables),
    ]
    for f in knob_fields():
        default = _show(_DEFAULTS.knob(f.name))
        cells = " | ".join(t.status(f.name) for t in tables)
        lines.append(f"| {KNOBS[f.name]} | `{f.name}` | {default} | {cells} |")
    return "\n".join(lines)
