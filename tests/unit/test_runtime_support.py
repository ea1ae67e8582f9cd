"""Every SageConfig field x every runtime: honoured, or refused at launch with the field's name.

"Honoured" is checked twice: the runtime's launch check accepts the value, and the runtime's code reads the field
(an attribute access ``.<field>`` in the modules the runtime runs).  "Refused" means the launch check raises one
ConfigError naming the field (SGLang: its ``--sage-*`` flag) and the runtime.  The SGLang launch itself
(``validate_server_args`` on a parsed command line) is exercised for every field in
``tests/integration/sglang/test_flags.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import sage_plugin
from sage_plugin.bench.methods import parse_methods
from sage_plugin.config import ConfigError, SageConfig, knob_fields
from sage_plugin.engines.support import REFERENCE_SUPPORT
from sage_plugin.runtimes.sglang.args import flag_name
from sage_plugin.runtimes.sglang.support import SGLANG_SUPPORT
from sage_plugin.runtimes.trtllm.config import parse_launch
from sage_plugin.runtimes.trtllm.support import TRTLLM_SUPPORT, TRTLLM_TREE_SUPPORT
from sage_plugin.support import support_matrix

from .config_cases import OTHER_VALUES

PACKAGE = Path(sage_plugin.__file__).parent
REPO = PACKAGE.parent

CASES = [(name, value) for name, values in OTHER_VALUES.items() for value in values]


def _reference_launch(cfg: SageConfig) -> None:
    """What ``sage bench`` runs before loading any model: parsing the methods against the base config."""
    parse_methods("ar", cfg)


def _sglang_launch(cfg: SageConfig) -> None:
    """The support check of ``validate_server_args`` (the whole callback runs in the integration tier)."""
    SGLANG_SUPPORT.check(cfg, name=flag_name)


def _trtllm_launch(cfg: SageConfig) -> None:
    """What ``sage trtllm-serve`` checks before anything starts: a drafter-tier launch file with this sage: section."""
    parse_launch({"tier": "drafter", "model": "target", "sage": cfg.to_dict()})


_EAGLE3_TREE = {"decoding_type": "Eagle3", "use_dynamic_tree": True, "dynamic_tree_max_topK": 8, "max_draft_len": 6}


def _trtllm_tree_launch(cfg: SageConfig) -> None:
    """The same for the dynamic-tree tier."""
    spec = {**_EAGLE3_TREE, "speculative_model": "eagle3-head"}
    parse_launch(
        {"tier": "dynamic_tree", "model": "target", "llm": {"speculative_config": spec}, "sage": cfg.to_dict()}
    )


RUNTIMES = {
    "reference": (REFERENCE_SUPPORT, _reference_launch, str, ["core", "engines", "bench"]),
    "sglang": (
        SGLANG_SUPPORT,
        _sglang_launch,
        flag_name,
        ["core/shape.py", "core/beam_selection.py", "serving/slots.py", "core/controller.py", "core/sage.py",
         "core/baselines.py", "runtimes/sglang"],
    ),
    "trtllm": (
        TRTLLM_SUPPORT,
        _trtllm_launch,
        str,
        ["core/shape.py", "serving/slots.py", "core/controller.py", "core/entropy.py", "runtimes/trtllm"],
    ),
    "trtllm-tree": (
        TRTLLM_TREE_SUPPORT,
        _trtllm_tree_launch,
        str,
        ["core/shape.py", "core/beam_selection.py", "serving/slots.py", "core/controller.py", "core/entropy.py",
         "runtimes/trtllm"],
    ),
}  # fmt: skip


def _read_attributes(paths: list[str]) -> set[str]:
    """Attribute names read anywhere in these files / packages (``cfg.d_max`` -> ``d_max``)."""
    out = set()
    for rel in paths:
        root = PACKAGE / rel
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            if "reference" in path.parts:  # the oracle is not the runtime
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    out.add(node.attr)
    return out


def test_every_field_has_test_values():
    assert set(OTHER_VALUES) == {f.name for f in knob_fields()}


def test_every_field_is_declared_by_every_runtime():
    names = {f.name for f in knob_fields()}
    for support, *_ in RUNTIMES.values():
        assert set(support.honours) | set(support.not_read) == names, support.runtime
        assert not set(support.honours) & set(support.not_read), support.runtime


@pytest.mark.slow
@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@pytest.mark.parametrize(("field", "value"), CASES, ids=[f"{n}={v}" for n, v in CASES])
def test_field_is_honoured_or_refused_at_launch(runtime, field, value):
    support, launch, spell, code = RUNTIMES[runtime]
    cfg = SageConfig(**{field: value})
    entry = support.honours.get(field)
    if entry is not None and (entry.values is None or value in entry.values):
        launch(cfg)  # honoured: the launch goes on
        assert field in _read_attributes(code), f"{support.runtime} declares {field} honoured but never reads it"
        return
    with pytest.raises(ConfigError) as err:
        launch(cfg)
    message = str(err.value)
    assert message.startswith(spell(field) + ":"), message
    assert support.runtime in message


def test_defaults_always_launch():
    for support, launch, *_ in RUNTIMES.values():
        launch(SageConfig())
        assert set(support.defaults_not_applied()) <= set(support.honours)


def test_sglang_refuses_what_it_cannot_run():
    """What SGLang cannot run is refused at launch, with the flag: a baseline policy (SGLang's own algorithms build
    the baselines), path_mean (it needs the accepted path's draft distributions) and draft-side image pruning."""
    with pytest.raises(ConfigError, match=r"^--sage-policy: SGLang 0.5.23 honours only 'sage'"):
        _sglang_launch(SageConfig(policy="eagle2"))
    with pytest.raises(ConfigError, match=r"^--sage-alpha-source: SGLang 0.5.23 honours only 'fresh' or 'lag1'"):
        _sglang_launch(SageConfig(alpha_source="path_mean"))
    with pytest.raises(ConfigError, match=r"^--sage-prune-ratio-image: SGLang 0.5.23 does not honour it"):
        _sglang_launch(SageConfig(prune_ratio_image=0.5))


def test_docs_show_the_declared_tables():
    doc = (REPO / "docs" / "reference" / "runtime-support.md").read_text()
    table = re.search(r"<!-- generated by .*? -->\n(.*?)\n<!-- end of generated table -->", doc, re.S)
    assert table is not None
    expected = support_matrix(support for support, *_ in RUNTIMES.values())
    assert table.group(1) == expected, "regenerate the table in docs/reference/runtime-support.md (support_matrix)"
