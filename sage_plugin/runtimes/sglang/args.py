"""SAGE's SGLang command-line surface: ``--sage-*`` flags, ``--sage-config``, and SGLang sizes.

Every :class:`~sage_plugin.config.SageConfig` field ``name`` gets one flag ``--sage-<name with dashes>``,
generated from the dataclass (a new field gets its flag with no edit here).  The flag's type follows
the field's default:

=================  ================================  ==========================================
default            command line                      example
=================  ================================  ==========================================
``bool``           ``true`` / ``false``              ``--sage-use-history false``
``int``            an integer                        ``--sage-w-max 6``
``float``          a number                          ``--sage-theta0 0.2``
``str``            a string (SageConfig checks it)   ``--sage-policy eagle2``
tuple of tuples    JSON rank paths                   ``--sage-static-tree '[[0],[1],[0,0]]'``
=================  ================================  ==========================================

``--sage-static-tree`` also takes one JSON path per value (``--sage-static-tree [0] [1] [0,0]``): that
is what SGLang's ``--config`` YAML produces from a YAML list, so ``sage-static-tree: [[0], [1]]`` works.

``--sage-config PATH`` reads a YAML file of SageConfig fields, in the format of
``engine_configs/reference/smollm2_cpu_sage.yaml`` (a top-level ``sage:`` mapping, or the fields at top
level).  Precedence: SageConfig defaults < ``--sage-config`` file < individual ``--sage-*`` flags.
SGLang's own ``--config`` YAML turns a key ``sage-w-max: 6`` into the flag ``--sage-w-max 6`` (keys
spelled with dashes, like every SGLang key), so its values count as individual flags.

All flags default to ``None`` ("not given"); the merged config is built and validated once, by
:func:`build_sage_config`, and a bad value is one :class:`~sage_plugin.config.ConfigError` that names
flags, not fields:

>>> build_sage_config(SageCliArgs(overrides={"w_max": 99}))
Traceback (most recent call last):
...
sage_plugin.config.ConfigError: --sage-w-max must be an integer in [2, 10] (--sage-w-min <= --sage-w-max <= --sage-k), got 99

This module imports no runtime: the SGLang wiring is in :mod:`.hooks` and :mod:`.algo`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from sage_plugin.config import ConfigError, SageConfig, from_mapping, knob_fields, read_sage_yaml
from sage_plugin.serving.tiers import Tier, parse_tiers

__all__ = [
    "CONFIG_FLAG",
    "FLAGS",
    "MAX_DERIVED_TOPK",
    "STASH_ATTR",
    "SageCliArgs",
    "SageFlag",
    "SpecSizes",
    "add_sage_arguments",
    "build_sage_config",
    "flag_name",
    "sage_cli_of",
    "sage_config_of",
    "spec_sizes",
]

CONFIG_FLAG = "--sage-config"
CONFIG_DEST = "sage_config"
GROUP_TITLE = "SAGE speculative decoding (--speculative-algorithm sage)"

#: Largest ``--speculative-eagle-topk`` derived from ``k`` (SAGE's paper uses k = 10).  The EAGLE beam
#: runs ``batch * topk`` draft tokens per step and scores ``topk**2`` candidates, so a larger ``k``
#: (allowed for the entropy's top-k mass) does not widen the beam past this.  An explicit
#: ``--speculative-eagle-topk`` is not capped.
MAX_DERIVED_TOPK = 10


def flag_name(field_name: str) -> str:
    """``w_max`` -> ``--sage-w-max``.

    >>> flag_name("history_cooldown")
    '--sage-history-cooldown'
    """
    return "--sage-" + field_name.replace("_", "-")


def flag_value(value: Any) -> str:
    """The command-line spelling of a SageConfig value (what :attr:`SageFlag.parse` reads back).

    >>> flag_value(True), flag_value(0.25), flag_value(((0, 1), (1, 2)))
    ('true', '0.25', '[[0, 1], [1, 2]]')
    """
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return json.dumps(value)
    return str(value)


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"expected JSON such as '[[0], [1], [0, 0]]', got {text!r}") from None


@dataclass(frozen=True)
class SageFlag:
    """One generated flag: SageConfig field ``field`` as ``flag`` (argparse ``dest``)."""

    field: str
    flag: str
    dest: str
    kind: str  # bool | int | float | str | paths
    default: Any

    @property
    def parse(self) -> Callable[[str], Any]:
        return {"bool": _parse_bool, "int": int, "float": float, "str": str, "paths": _parse_json}[self.kind]

    @property
    def metavar(self) -> str:
        return {"bool": "{true,false}", "int": "INT", "float": "FLOAT", "str": "STR", "paths": "JSON"}[self.kind]

    @property
    def help(self) -> str:
        if self.kind == "paths":
            shown = f"{len(self.default)} rank paths"
            how = "JSON list of rank paths, e.g. '[[0],[1],[0,0]]', or one JSON path per value. "
        else:
            shown = str(self.default).lower() if self.kind == "bool" else repr(self.default)
            how = ""
        return f"{how}SageConfig.{self.field} (default: {shown})."


def _kind(f: dataclasses.Field) -> str:
    default = f.default
    if isinstance(default, bool):  # before int: bool is an int subclass
        return "bool"
    for kind in (int, float, str):
        if isinstance(default, kind):
            return kind.__name__
    if isinstance(default, tuple) and all(isinstance(p, tuple) for p in default):
        return "paths"
    raise TypeError(f"SageConfig.{f.name}: no command-line type for a default of type {type(default).__name__}")


#: One flag per SageConfig field, in field order.
FLAGS: tuple[SageFlag, ...] = tuple(
    SageFlag(field=f.name, flag=flag_name(f.name), dest="sage_" + f.name, kind=_kind(f), default=f.default)
    for f in knob_fields()
)
_BY_FIELD = {f.field: f for f in FLAGS}


def add_sage_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--sage-config`` and one ``--sage-<field>`` flag per SageConfig field, all defaulting to ``None``."""
    group = parser.add_argument_group(GROUP_TITLE)
    group.add_argument(
        CONFIG_FLAG,
        dest=CONFIG_DEST,
        default=None,
        metavar="PATH",
        help="YAML file of SageConfig fields (engine_configs/reference/smollm2_cpu_sage.yaml format); "
        "individual --sage-* flags override its values.",
    )
    for f in FLAGS:
        group.add_argument(
            f.flag,
            dest=f.dest,
            type=f.parse,
            default=None,
            nargs="+" if f.kind == "paths" else None,
            metavar=f.metavar,
            help=f.help,
        )


def _paths_value(items: list[Any]) -> Any:
    """``['[[0],[1]]']`` parsed as one tree, or ``[[0], [1]]`` as one path per value -> a list of paths."""
    if len(items) == 1 and isinstance(items[0], list) and all(isinstance(p, list) for p in items[0]):
        return items[0]
    return items


@dataclass(frozen=True)
class SageCliArgs:
    """What the command line asked for: the ``--sage-config`` file and the ``--sage-*`` flags given.

    This is the value SGLang carries from the launcher to its subprocesses (pickled on ``ServerArgs``
    as ``_sage_cli``, :mod:`.hooks`); the config is rebuilt from it with :func:`build_sage_config`.

    Attributes:
        config_path: absolute path of the ``--sage-config`` file, or ``None``.
        overrides: SageConfig field -> value, for each ``--sage-*`` flag given.
    """

    config_path: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> "SageCliArgs":
        """Collect the flags from a parsed namespace (missing attributes count as not given)."""
        overrides = {}
        for f in FLAGS:
            value = getattr(args, f.dest, None)
            if value is not None:
                overrides[f.field] = _paths_value(value) if f.kind == "paths" else value
        path = getattr(args, CONFIG_DEST, None)
        return cls(config_path=os.path.abspath(path) if path else None, overrides=overrides)

    @property
    def given(self) -> bool:
        """Whether any SAGE flag (``--sage-config`` included) was given."""
        return self.config_path is not None or bool(self.overrides)


#: Name of the bookkeeping attribute on SGLang's ``ServerArgs`` record that carries the SAGE flags
#: (set by the ``from_cli_args`` hook, :mod:`.hooks`).
STASH_ATTR = "_sage_cli"


def sage_cli_of(server_args: Any) -> SageCliArgs | None:
    """The SAGE flags a ``ServerArgs`` record (or SGLang's resolution stand-in) carries; ``None`` if it has none.

    A record built without SGLang's parser (``Engine(**kwargs)``) has none: SAGE then uses the defaults.
    """
    return getattr(server_args, STASH_ATTR, None)


def sage_config_of(server_args: Any) -> SageConfig:
    """The validated SageConfig of a launch: defaults < ``--sage-config`` file < ``--sage-*`` flags.

    Works on the ``ServerArgs`` record in any SGLang process (the flags ride on it) and on SGLang's resolution
    stand-in.

    Raises:
        ConfigError: a bad value, named by its flag.
    """
    return build_sage_config(sage_cli_of(server_args))


_FIELD_RE = re.compile(r"(?<![\w-])(" + "|".join(sorted(_BY_FIELD, key=len, reverse=True)) + r")(?![\w-])")


def _flag_message(message: str) -> tuple[str, str | None]:
    """Rewrite field names as flag names in the part before ``got``; return it and the first field named."""
    head, sep, tail = message.partition(" got ")
    first = _FIELD_RE.search(head)
    return _FIELD_RE.sub(lambda m: flag_name(m.group(1)), head) + sep + tail, first and first.group(1)


def build_sage_config(cli: SageCliArgs | None) -> SageConfig:
    """Merge defaults < ``--sage-config`` file < ``--sage-*`` flags into one validated SageConfig.

    Raises:
        ConfigError: one message naming the offending flag(s); a value that came from the
            ``--sage-config`` file says so.

    >>> build_sage_config(None) == SageConfig()
    True
    >>> build_sage_config(SageCliArgs(overrides={"d_max": 5, "use_history": False})).algorithm.max_plan_depth
    5
    """
    cli = cli or SageCliArgs()
    from_file = read_sage_yaml(cli.config_path, label=f"{CONFIG_FLAG} {cli.config_path}") if cli.config_path else {}
    try:
        return from_mapping({**from_file, **cli.overrides})
    except ConfigError as exc:
        message, first = _flag_message(str(exc))
        if first is not None and first in from_file and first not in cli.overrides:
            message += f" (value from {CONFIG_FLAG} {cli.config_path})"
        raise ConfigError(message) from None


@dataclass(frozen=True)
class SpecSizes:
    """SGLang's draft sizes for SAGE: ``--speculative-eagle-topk``, ``-num-steps``, ``-num-draft-tokens``.

    With tiers (``--sage-tiers``) the steps and draft tokens are the largest tier's (what SGLang allocates and
    captures first) and ``tiers`` lists every tier; without, ``tiers`` is that one shape.
    """

    topk: int
    num_steps: int
    num_draft_tokens: int
    tiers: tuple[Tier, ...] = ()

    @property
    def max_alloc_per_decode(self) -> int:
        """KV slots one request may take in one decode step under any tier: ``max(steps * topk, draft_tokens)``."""
        shapes = self.tiers or (Tier(self.num_steps, self.num_draft_tokens),)
        return max(max(t.steps * self.topk, t.draft_tokens) for t in shapes)


def _candidates(topk: int, num_steps: int) -> int:
    """Draft nodes the EAGLE beam scores in ``num_steps`` steps (the pool the tree's N - 1 nodes come from)."""
    return topk + (num_steps - 1) * topk * topk if num_steps else 0


def spec_sizes(
    cfg: SageConfig, *, topk: int | None = None, num_steps: int | None = None, num_draft_tokens: int | None = None
) -> SpecSizes:
    """The sizes SGLang allocates for SAGE: explicit SGLang flags win, the rest come from ``cfg``.

    * ``topk = min(k, MAX_DERIVED_TOPK)``: the beam width (>= 2: SAGE builds a tree, and with topk 1
      SGLang's draft loop never reaches its tree selection);
    * ``num_steps = cfg.max_plan_depth``: the deepest level SAGE's plan can reach (``d_cap`` with the
      history controller, ``d_max`` without, or the static first-round tree's depth; the reference engine's
      ``beam_depth`` is not SGLang's: its beam is these steps);
    * ``num_draft_tokens = cfg.max_tree_nodes + 1`` (the root counts), capped at what the beam can
      score in ``num_steps`` steps plus the root;
    * with ``cfg.tiers``: every tier must fit the beam, the largest tier must be largest in both steps and draft
      tokens (it is the shape SGLang allocates), and ``--speculative-num-steps`` / ``-num-draft-tokens`` must not
      be given (the tiers set them).

    Raises:
        ConfigError: an explicit SGLang value SAGE cannot use (named by its flag), or a tier list SGLang cannot run.

    >>> spec_sizes(SageConfig())
    SpecSizes(topk=10, num_steps=10, num_draft_tokens=65, tiers=())
    >>> spec_sizes(SageConfig(), topk=2, num_steps=3)  # 2 + 2 * 4 = 10 candidates: N capped at 11
    SpecSizes(topk=2, num_steps=3, num_draft_tokens=11, tiers=())
    >>> s = spec_sizes(SageConfig(tiers=((0, 1), (2, 4), (4, 8))), topk=4)
    >>> (s.num_steps, s.num_draft_tokens, s.max_alloc_per_decode)
    (4, 8, 16)
    """
    if topk is not None and topk < 2:
        raise ConfigError(
            "--speculative-eagle-topk must be >= 2 with --speculative-algorithm sage (SAGE drafts a tree; "
            f"leave it unset to derive it from --sage-k), got {topk}"
        )
    if num_steps is not None and num_steps < 1:
        raise ConfigError(f"--speculative-num-steps must be >= 1 with --speculative-algorithm sage, got {num_steps}")
    topk = topk if topk is not None else min(cfg.algorithm.k, MAX_DERIVED_TOPK)
    if cfg.serving.tiers:
        return _tier_sizes(cfg, topk, num_steps, num_draft_tokens)
    num_steps = num_steps if num_steps is not None else cfg.algorithm.max_plan_depth
    most = _candidates(topk, num_steps) + 1
    if num_draft_tokens is None:
        num_draft_tokens = min(cfg.algorithm.max_tree_nodes + 1, most)
    elif not 2 <= num_draft_tokens <= most:
        raise ConfigError(
            f"--speculative-num-draft-tokens must be in [2, {most}] with --speculative-algorithm sage "
            f"(the root plus the {most - 1} nodes a topk-{topk} beam scores in {num_steps} steps), "
            f"got {num_draft_tokens}"
        )
    return SpecSizes(topk=topk, num_steps=num_steps, num_draft_tokens=num_draft_tokens)


def _tier_sizes(cfg: SageConfig, topk: int, num_steps: int | None, num_draft_tokens: int | None) -> SpecSizes:
    flag = flag_name("tiers")
    if num_steps is not None or num_draft_tokens is not None:
        raise ConfigError(
            f"{flag} sets the draft shapes: leave --speculative-num-steps and --speculative-num-draft-tokens unset"
        )
    tiers = parse_tiers(cfg.serving.tiers)
    for t in tiers:
        if not t.off and t.draft_tokens - 1 > _candidates(topk, t.steps):
            raise ConfigError(
                f"{flag}: tier [{t.steps}, {t.draft_tokens}] verifies {t.draft_tokens - 1} draft nodes but a "
                f"topk-{topk} beam scores only {_candidates(topk, t.steps)} in {t.steps} steps"
            )
    top = tiers[-1]
    if top.off:
        raise ConfigError(f"{flag}: at least one tier must speculate (steps >= 1), got only [0, 1]")
    if any(t.draft_tokens > top.draft_tokens for t in tiers):
        raise ConfigError(
            f"{flag}: the tier with the most steps must also verify the most tokens (SGLang allocates and "
            f"captures it first); got {[[t.steps, t.draft_tokens] for t in tiers]}"
        )
    return SpecSizes(topk=topk, num_steps=top.steps, num_draft_tokens=top.draft_tokens, tiers=tiers)
