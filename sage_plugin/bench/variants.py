"""``sage bench-serving --methods`` variants: ``NAME=METHOD:option=value,...``, a method's server with extra flags.

``--methods plain,sage,ragged=sage:ragged_verify=true`` launches the SAGE server twice, the second time with
``--sage-ragged-verify true``, so an A/B of one SAGE option runs in one command with every server launched alike.
An option spelled as an SGLang flag (``--min-free-slots-delay=4``, or a bare switch such as
``--disable-overlap-schedule``) is passed to the server as it is, on any method:
``--methods plain,sage,pd=plain:--min-free-slots-delay=4,sd=sage:--min-free-slots-delay=4`` A/Bs a scheduler flag
on both sides.
"""

from __future__ import annotations

import re

import yaml

from ..config import ConfigError, SageConfig
from ..runtimes.sglang.args import flag_name, flag_value

__all__ = ["entry_name", "method_entries", "serving_variants"]

#: the methods whose variants may set SageConfig fields (SAGE servers); SGLang flags go with any method
_SAGE_BASES = ("sage", "sage-single", "sage-eagle3")
_SGLANG_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets (``tiers=[[0,1],[1,2]]`` stays one item)."""
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    return [*items, cur]


def method_entries(text: str) -> list[str]:
    """``--methods`` split at commas, a bare ``field=value`` or ``--flag`` continuing the variant before it."""
    entries: list[str] = []
    for item in (i.strip() for i in _split_top(text)):
        continues = item.startswith("-") or ("=" in item and ":" not in item)  # a method name never starts with -
        if entries and continues and "=" in entries[-1].split(":", 1)[0]:
            entries[-1] += "," + item
        elif item:
            entries.append(item)
    return entries


def entry_name(entry: str) -> str:
    """The method name an entry of :func:`method_entries` is benched under: ``NAME`` of a variant, else the entry."""
    head = entry.partition(":")[0]
    return head.split("=", 1)[0].strip() if "=" in head else entry


def serving_variants(text: str, methods: tuple[str, ...]) -> dict[str, tuple[str, list[str]]]:
    """The ``NAME=METHOD:option=value,...`` entries of ``--methods``: ``{NAME: (METHOD, extra launch flags)}``.

    ``METHOD`` is one of ``methods`` (the bench's method names).  An option is a
    :class:`~sage_plugin.config.SageConfig` field (``METHOD`` a SAGE server: ``sage``, ``sage-single``,
    ``sage-eagle3``), passed as its ``--sage-`` flag, or an SGLang flag ``--name=value`` (any method), passed as
    ``--name value``; both come after the method's own flags, so they win over the ``--config`` YAML.  SAGE fields are
    validated before any server starts (an SGLang flag by the server's own parser at launch).  Example: ``--methods
    plain,sage,ragged=sage:ragged_verify=true`` benches the SAGE server with and without a ragged verify in one run.
    """
    out: dict[str, tuple[str, list[str]]] = {}
    for entry in method_entries(text):
        head, _, options = entry.partition(":")
        if "=" not in head:
            continue
        name, base = entry_name(entry), head.split("=", 1)[1].strip()
        if base not in methods or not name:
            raise ConfigError(f"--methods {entry!r}: a variant is NAME=METHOD:option=value,... with METHOD one of "
                              f"{', '.join(methods)}")  # fmt: skip
        values, server_flags = {}, []
        for item in filter(None, _split_top(options)):
            key, sep, value = (part.strip() for part in item.partition("="))
            if not sep and not key.startswith("-"):
                raise ConfigError(f"--methods {entry!r}: option {item!r} must be field=value, --sglang-flag=value "
                                  "or a bare --sglang-switch")  # fmt: skip
            if key.startswith("-"):
                if not _SGLANG_FLAG.fullmatch(key) or key.startswith("--sage-"):
                    raise ConfigError(f"--methods {entry!r}: {key!r} is not an SGLang flag (SAGE options are "
                                      "written as SageConfig fields: ragged_verify=true)")  # fmt: skip
                server_flags += [key, value] if sep else [key]
            else:
                values[key] = yaml.safe_load(value)
        if values and base not in _SAGE_BASES:
            raise ConfigError(f"--methods {entry!r}: SAGE options need a SAGE method ({', '.join(_SAGE_BASES)})")
        SageConfig.from_mapping(values)  # one clear error naming a bad field or value, before any server starts
        flags = [arg for key, value in values.items() for arg in (flag_name(key), flag_value(value))]
        out[name] = (base, flags + server_flags)
    return out
