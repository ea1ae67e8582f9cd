"""The configuration reference: every :class:`~sage_plugin.config.SageConfig` field rendered as Markdown.

``docs/reference/configuration.md`` is this module's output, and ``tests/unit/test_config_reference.py`` fails when
the committed page differs from it.  Regenerate the page with::

    python -m sage_plugin.config_reference > docs/reference/configuration.md

Everything on the page comes from the code, so it cannot drift from it:

* **meaning**: the comments beside the field's declaration (the block of ``#`` lines right above it and the comment
  at the end of its line); a ``# -- title --`` comment starts a section;
* **default**: the dataclass default;
* **allowed values**: the validator's own message for the field set to a value nothing accepts (so the range shown
  is the range enforced);
* **SGLang flag and YAML keys**: :func:`sage_plugin.runtimes.sglang.args.flag_name`;
* **honoured by**: each runtime's declared table (:mod:`sage_plugin.support`; the reasons are in
  ``docs/reference/runtime-support.md``).

The fields are walked with :func:`dataclasses.fields`; a field whose default is itself a dataclass is a section
and its fields are listed under it, so the page follows the config's structure.

>>> rows = {r.name: r for r in field_rows()}
>>> rows["d_min"].allowed
'an integer in [1, 64]'
>>> rows["d_min"].flag
'--sage-d-min'
>>> rows["tp_sync"].honoured_by
'SGLang 0.5.23'
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import sys
import textwrap
import tokenize
from dataclasses import dataclass
from typing import Any, Iterator

from .config import ConfigError, SageConfig
from .engines.support import REFERENCE_SUPPORT
from .runtimes.sglang.args import flag_name
from .runtimes.sglang.support import SGLANG_SUPPORT
from .runtimes.trtllm.support import TRTLLM_SUPPORT, TRTLLM_TREE_SUPPORT
from .support import RuntimeSupport

__all__ = ["RUNTIME_TABLES", "FieldRow", "field_comments", "field_rows", "render"]

#: every runtime's declared support table, in the order the pages show them
RUNTIME_TABLES: tuple[RuntimeSupport, ...] = (REFERENCE_SUPPORT, SGLANG_SUPPORT, TRTLLM_SUPPORT, TRTLLM_TREE_SUPPORT)

COMMAND = "python -m sage_plugin.config_reference > docs/reference/configuration.md"


@dataclass(frozen=True)
class FieldRow:
    """One field as the page shows it: ``group`` is the comment title it sits under, ``section`` the config section
    holding it (``algorithm``, ``serving``, ...)."""

    group: str
    section: str
    name: str
    meaning: str
    default: str
    allowed: str
    flag: str
    honoured_by: str


class _Invalid:
    """A value no validator accepts (not a number, string, bool or tuple)."""

    def __repr__(self) -> str:
        return "<invalid>"


def field_comments(cls: type) -> dict[str, tuple[str, str]]:
    """``field -> (section, meaning)`` from the comments in ``cls``'s source.

    A field's meaning is the block of full-line comments right above its declaration followed by the comment on its
    own line; a comment ``# -- title ---`` starts the section ``title`` and belongs to no field.
    """
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, whole line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            comments[row] = (tok.string.lstrip("#").strip(), not lines[row - 1][:col].strip())
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    out: dict[str, tuple[str, str]] = {}
    section, last = "", 0
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        block = []
        for row in range(last + 1, node.lineno):
            text, whole = comments.get(row, ("", False))
            if not whole:
                block = []
            elif text.startswith("--"):
                section, block = re.sub(r"\s*\[[A-Z]\](\s*\+\s*\[[A-Z]\])*", "", text.strip("- ")), []
            else:
                block.append(text)
        inline = [comments[r][0] for r in range(node.lineno, node.end_lineno + 1) if r in comments]
        meaning = " ".join(block + inline).removeprefix(f"{node.target.id}: ")
        out[node.target.id] = (section, meaning)
        last = node.end_lineno
    return out


def _allowed(cls: type, name: str) -> str:
    """The validator's description of the values ``name`` accepts (its message, less the field and the bad value)."""
    try:
        cls(**{name: _Invalid()})
    except ConfigError as err:
        message = str(err)
    else:  # pragma: no cover - every field is validated (tests/unit/test_config_reference.py)
        return "any value"
    for bad in (", got <invalid>", "; got <invalid>"):
        message = message.replace(bad, "")
    message = message.split(f"{name} ", 1)[1] if message.startswith(f"{name} ") else message
    return message.removeprefix("must be ").strip()


def _honoured_by(name: str, tables: tuple[RuntimeSupport, ...]) -> str:
    out = []
    for table in tables:
        entry = table.honours.get(name)
        if entry is None:
            continue
        if entry.values is None:
            out.append(table.runtime)
        else:
            out.append(f"{table.runtime} (only {', '.join(str(v) for v in sorted(entry.values, key=str))})")
    return ", ".join(out) or "none"


def _show_default(value: Any) -> str:
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        return f"{len(value)} rank paths (SpecVLM's mc_sim_7b_63)" if len(value) > 4 else repr([list(v) for v in value])
    if isinstance(value, tuple):
        return "[]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def field_rows(
    cls: type = SageConfig, tables: tuple[RuntimeSupport, ...] = RUNTIME_TABLES, section: str = ""
) -> Iterator[FieldRow]:
    """One :class:`FieldRow` per field of ``cls``, in declaration order (a dataclass-valued field is a section: its
    fields, with the section's name)."""
    comments = field_comments(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        value = getattr(defaults, f.name)
        if dataclasses.is_dataclass(value):
            yield from field_rows(type(value), tables, f.name)
            continue
        group, meaning = comments.get(f.name, ("", ""))
        yield FieldRow(
            group=group or cls.__name__,
            section=section,
            name=f.name,
            meaning=meaning,
            default=_show_default(value),
            allowed=_allowed(cls, f.name),
            flag=flag_name(f.name),
            honoured_by=_honoured_by(f.name, tables),
        )


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


HEADER = f"""# Configuration reference

<!-- generated by sage_plugin.config_reference; tests/unit/test_config_reference.py keeps it current:
     {COMMAND} -->

Every SAGE option is a field of `sage_plugin.config.SageConfig`, one frozen object validated when it is built: a
value outside the range below stops the launch with one message naming the field (SGLang: its flag) and the range.
The object holds the fields in sections, one per layer that reads them (`algorithm`, `serving`, `cpu`, `runtime`,
`vlm`; [architecture](../design/architecture.md#the-config-in-sections)); users set every field by its own name, flat.

Where a field is set:

* **SGLang**: the flag `--sage-<field with dashes>` on `python -m sglang.launch_server`; the same key with dashes in
  SGLang's own `--config` YAML (`sage-w-max: 6`); or a SAGE YAML passed as `--sage-config FILE.yaml` (fields under a
  top-level `sage:` mapping, spelled with underscores). Precedence: defaults < `--sage-config` < `--sage-*` flags.
* **`sage bench`**: `--config FILE.yaml` (the same SAGE YAML) and `--set field=value`; per method,
  `NAME=POLICY:field=value,...`.
* **TensorRT-LLM**: the `sage:` section of a `sage trtllm-serve` launch file.

"Honoured by" lists the runtimes that read the field; every other runtime refuses a non-default value at launch.
Why a runtime does not read a field, and what it does instead:
[runtime-support.md](runtime-support.md). The algorithm behind the fields: [the algorithm](../design/algorithm.md).
"""


def render(cls: type = SageConfig) -> str:
    """The whole page (``docs/reference/configuration.md``)."""
    rows = list(field_rows(cls))
    groups: dict[tuple[str, str], list[FieldRow]] = {}
    for row in rows:
        groups.setdefault((row.group, row.section), []).append(row)
    out = [HEADER]
    for (title, section), members in groups.items():
        out.append(f"## {title[0].upper()}{title[1:]}: section `{section}`\n")
        out.append("| field | meaning | default | allowed | honoured by |")
        out.append("|---|---|---|---|---|")
        for r in members:
            name = f"`{r.name}`<br>`{r.flag}`"
            out.append(f"| {name} | {_cell(r.meaning)} | `{r.default}` | {_cell(r.allowed)} | {_cell(r.honoured_by)} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
