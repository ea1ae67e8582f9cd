"""`--methods` lists: variants with several options, named ablations, distinct names (no model needed)."""

from __future__ import annotations

import pytest

from sage_plugin.bench.methods import ABLATIONS, DEFAULT_METHODS, parse_methods
from sage_plugin.config import ConfigError, SageConfig


def test_variant_options_continue_across_commas():
    base = SageConfig()
    specs = parse_methods("ar,static,joint=sage:threshold_on=joint,node_budget=fixed,theta0=0.2,sage,sage-paper", base)
    assert [s.name for s in specs] == ["ar", "static", "joint", "sage", "sage-paper"]
    joint = specs[2].config.algorithm
    assert (joint.policy, joint.threshold_on, joint.node_budget, joint.theta0) == ("sage", "joint", "fixed", 0.2)
    assert specs[3].config == base  # the option list of "joint" ended where "sage" began
    assert specs[4].config == base.replace(node_budget="fixed", rerank_pool="kept")  # the paper's rule


def test_unnamed_variant_and_ablations_in_one_list():
    base = SageConfig()
    specs = parse_methods("eagle2:eagle_total_tokens=32,eagle_depth=5," + ",".join(ABLATIONS), base)
    assert specs[0].name == "eagle2:eagle_total_tokens=32,eagle_depth=5"
    assert (specs[0].config.algorithm.eagle_total_tokens, specs[0].config.algorithm.eagle_depth) == (32, 5)
    assert [s.name for s in specs[1:]] == list(ABLATIONS)
    assert [s.name for s in parse_methods(",".join(DEFAULT_METHODS), base)] == list(DEFAULT_METHODS)


@pytest.mark.parametrize(
    "text, words",
    [
        ("n_max=4,sage", "unknown method"),  # options before any method
        ("sage,sage", "repeated: sage"),
        ("a=sage:n_max=4,a=static", "repeated: a"),
        ("sage:n_max=4,w_max=99", "w_max"),  # a continued option is validated like the first
        ("sage,b=sage:cpu_draft_dtype=float32", "cpu_draft_dtype is the run's draft"),  # one draft per run
        ("sage,l=sage:cpu_lean_draft=false", "--set cpu_lean_draft=false"),
    ],
)
def test_bad_lists_are_one_clear_error(text, words):
    with pytest.raises(ConfigError, match=words):
        parse_methods(text, SageConfig())


def test_methods_take_turns_batch_by_batch():
    """``run_methods``: one warm-up per method, then the methods in turns per batch, the order reversed at every
    batch; each method's results keep the requests' order and are compared with ``ar``'s."""
    from types import SimpleNamespace

    from sage_plugin.bench.methods import parse_methods
    from sage_plugin.bench.run import run_methods
    from sage_plugin.engines.lm import GenRequest
    from sage_plugin.engines.records import SamplingParams

    specs = parse_methods("ar,static,sage", SageConfig())
    calls = []

    class Recording:
        last_decode_s = last_prefill_s = last_profile_s = last_policy_s = 0.1

        def generate(self, batch, params, policy):
            name = "ar" if policy is None else policy.cfg.policy
            calls.append((name, [r.request_id for r in batch], params.max_new_tokens))
            return [
                SimpleNamespace(request_id=r.request_id, tokens=[1, 2, 3], target_forwards=2, rounds=[]) for r in batch
            ]

    reqs = [GenRequest([1, 2], request_id=str(i)) for i in range(5)]
    res = run_methods(Recording(), specs, reqs, SamplingParams(max_new_tokens=4), batch_size=2, progress=False)
    assert calls[:3] == [("ar", ["0"], 8), ("static", ["0"], 8), ("sage", ["0"], 8)]  # warm-ups
    order = ["ar", "static", "sage"]
    batches = [["0", "1"], ["2", "3"], ["4"]]
    expected = [(m, b, 4) for i, b in enumerate(batches) for m in (order if i % 2 == 0 else order[::-1])]
    assert calls[3:] == expected
    assert all(list(r.outputs) == ["0", "1", "2", "3", "4"] and r.exact == 5 for r in res.values())
