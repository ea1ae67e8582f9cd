"""``docs/reference/configuration.md`` is :func:`sage_plugin.config_reference.render`'s output, for every field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import sage_plugin
from sage_plugin.config import SageConfig
from sage_plugin.config_reference import COMMAND, RUNTIME_TABLES, field_rows, render

REPO = Path(sage_plugin.__file__).parent.parent
PAGE = REPO / "docs" / "reference" / "configuration.md"


def _leaf_fields(cls: type) -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        default = getattr(cls(), f.name)
        out += _leaf_fields(type(default)) if dataclasses.is_dataclass(default) else [f.name]
    return out


def test_the_committed_page_is_the_generated_one():
    assert PAGE.read_text() == render(), f"docs/reference/configuration.md is stale; regenerate it: {COMMAND}"


def test_every_field_has_a_row_with_meaning_range_and_runtimes():
    rows = list(field_rows())
    assert [r.name for r in rows] == _leaf_fields(SageConfig)
    for r in rows:
        assert r.meaning, f"{r.name}: add a comment beside its declaration in sage_plugin/config/sections.py"
        assert r.allowed and r.allowed != "any value", r
        assert r.flag == "--sage-" + r.name.replace("_", "-")


def test_honoured_by_follows_the_runtime_tables():
    rows = {r.name: r for r in field_rows()}
    for table in RUNTIME_TABLES:
        for name in table.honours:
            assert table.runtime in rows[name].honoured_by, (table.runtime, name)
        for name in table.not_read:
            assert f"{table.runtime}," not in rows[name].honoured_by + ",", (table.runtime, name)


def test_allowed_values_are_the_validators():
    rows = {r.name: r for r in field_rows()}
    assert rows["k"].allowed == "an integer in [2, 64]"
    assert rows["node_budget"].allowed == "one of auto, fixed"
    assert rows["use_history"].allowed == "true or false"
    assert rows["theta0"].allowed == "a number in [0.0, 1.0]"
