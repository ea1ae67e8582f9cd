"""``sage bench-serving --methods`` variants: ``NAME=METHOD:field=value,...``, a SAGE server with extra SAGE flags.

``--methods plain,sage,ragged=sage:ragged_verify=true`` launches the SAGE server twice, the second time with
``--sage-ragged-verify true``, so an A/B of one SAGE option runs in one command with every server launched alike.
"""

from __future__ import annotations

import yaml

from ..config import ConfigError, SageConfig
from ..runtimes.sglang.args import flag_name, flag_value

__all__ = ["method_entries", "serving_variants"]

#: the methods a ``NAME=METHOD:field=value,...`` variant may start from (SAGE servers: the options are SAGE flags)
_VARIANT_BASES = ("sage", "sage-single", "sage-eagle3")


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
    """``--methods`` split at commas, a bare ``field=value`` continuing the variant before it."""
    entries: list[str] = []
    for item in (i.strip() for i in _split_top(text)):
        if entries and "=" in item and ":" not in item and "=" in entries[-1].split(":", 1)[0]:
            entries[-1] += "," + item
        elif item:
            entries.append(item)
    return entries


def serving_variants(text: str) -> dict[str, tuple[str, list[str]]]:
    """The ``NAME=METHOD:field=value,...`` entries of ``--methods``: ``{NAME: (METHOD, extra launch flags)}``.

    ``METHOD`` is a SAGE server method (``sage``, ``sage-single``, ``sage-eagle3``) and each ``field`` a
    :class:`~sage_plugin.config.SageConfig` field, passed as its ``--sage-`` flag after the method's own flags (so it
    wins over the ``--config`` YAML) and validated before any server starts.  Example: ``--methods
    plain,sage,ragged=sage:ragged_verify=true`` benches the SAGE server with and without a ragged verify in one run.
    """
    out: dict[str, tuple[str, list[str]]] = {}
    for entry in method_entries(text):
        head, _, options = entry.partition(":")
        if "=" not in head:
            continue
        name, base = (s.strip() for s in head.split("=", 1))
        if base not in _VARIANT_BASES or not name:
            raise ConfigError(f"--methods {entry!r}: a variant is NAME=METHOD:field=value,... with METHOD one of "
                              f"{', '.join(_VARIANT_BASES)}")  # fmt: skip
        values = {}
        for item in filter(None, _split_top(options)):
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"--methods {entry!r}: option {item!r} must be field=value")
            values[key.strip()] = yaml.safe_load(value)
        SageConfig.from_mapping(values)  # one clear error naming a bad field or value, before any server starts
        flags = [arg for key, value in values.items() for arg in (flag_name(key), flag_value(value))]
        out[name] = (base, flags)
    return out
