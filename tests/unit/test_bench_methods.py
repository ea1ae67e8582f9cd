"""`--methods` lists: variants with several options, named ablations, distinct names (no model needed)."""

from __future__ import annotations

import pytest

from sage_plugin.bench.methods import ABLATIONS, DEFAULT_METHODS, parse_methods
from sage_plugin.config import ConfigError, SageConfig


def test_variant_options_continue_across_commas():
    base = SageConfig()
    specs = parse_methods("ar,static,joint=sage:threshold_on=joint,node_budget=fixed,theta0=0.2,sage,sage-paper", base)
    assert [s.name for s in specs] == ["ar", "static", "joint", "sage", "sage-paper"]
    joint = specs[2].config
    assert (joint.policy, joint.threshold_on, joint.node_budget, joint.theta0) == ("sage", "joint", "fixed", 0.2)
    assert specs[3].config == base  # the option list of "joint" ended where "sage" began
    assert specs[4].config == base.replace(node_budget="fixed", rerank_pool="kept")  # the paper's rule


def test_unnamed_variant_and_ablations_in_one_list():
    base = SageConfig()
    specs = parse_methods("eagle2:eagle_total_tokens=32,eagle_depth=5," + ",".join(ABLATIONS), base)
    assert specs[0].name == "eagle2:eagle_total_tokens=32,eagle_depth=5"
    assert (specs[0].config.eagle_total_tokens, specs[0].config.eagle_depth) == (32, 5)
    assert [s.name for s in specs[1:]] == list(ABLATIONS)
    assert [s.name for s in parse_methods(",".join(DEFAULT_METHODS), base)] == list(DEFAULT_METHODS)


@pytest.mark.parametrize(
    "text, words",
    [
        ("n_max=4,sage", "unknown method"),  # options before any method
        ("sage,sage", "repeated: sage"),
        ("a=sage:n_max=4,a=static", "repeated: a"),
        ("sage:n_max=4,w_max=99", "w_max"),  # a continued option is validated like the first
    ],
)
def test_bad_lists_are_one_clear_error(text, words):
    with pytest.raises(ConfigError, match=words):
        parse_methods(text, SageConfig())
