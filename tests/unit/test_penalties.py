"""Per-node tree penalties (sage_plugin.core.penalties) against the naive per-node oracle (tests/oracles)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.core.penalties import MinTokens, TokenPenalty, advance, path_tokens, tree_parents, tree_penalties
from tests.oracles.penalties import Request, node_logits, parents_to_pointers

VOCAB = 9  # small: drafted tokens collide with the request's output and with each other


def random_parents(rng: random.Random, n: int) -> list[int]:
    """A tree with a parent before each child (SGLang's layout)."""
    return [-1] + [rng.randrange(i) for i in range(1, n)]


def depth_of(parents: list[int]) -> list[int]:
    d = [0]
    for p in parents[1:]:
        d.append(d[p] + 1)
    return d


def state_of(reqs: list[Request]) -> tuple[list[TokenPenalty | MinTokens], list[TokenPenalty]]:
    """The accumulators a runtime keeps for ``reqs`` after their outputs (built with :func:`advance`)."""
    b = len(reqs)
    pad = max(len(r.output) for r in reqs) or 1
    out = torch.full((b, pad), -1, dtype=torch.int64)
    for i, r in enumerate(reqs):
        out[i, : len(r.output)] = torch.tensor(r.output, dtype=torch.int64)

    def acc(values: list[float], fill: float, accumulate: bool) -> TokenPenalty:
        value = torch.tensor(values, dtype=torch.float32).unsqueeze(1)
        a = torch.full((b, VOCAB), fill, dtype=torch.float32)
        advance(a, out, value, accumulate=accumulate)
        return TokenPenalty(value, a, accumulate)

    stop = torch.zeros(b, VOCAB)
    for i, r in enumerate(reqs):
        stop[i, list(r.stop)] = float("-inf")
    minimum = torch.tensor([[r.min_tokens] for r in reqs])
    length = torch.tensor([[len(r.output)] for r in reqs])
    additive = [
        acc([r.frequency for r in reqs], 0.0, True),
        MinTokens(minimum, stop, length),
        acc([r.presence for r in reqs], 0.0, False),
    ]
    return additive, [acc([r.repetition for r in reqs], 1.0, False)]


@st.composite
def tree_cases(draw, max_batch=3, max_nodes=9):
    rng = random.Random(draw(st.integers(0, 2**31 - 1)))
    b = draw(st.integers(1, max_batch))
    n = draw(st.integers(1, max_nodes))
    reqs, parents, tokens, missing = [], [], [], []
    for _ in range(b):
        reqs.append(
            Request(
                output=tuple(rng.randrange(VOCAB) for _ in range(rng.randrange(6))),
                frequency=rng.choice([0.0, 0.25, 1.5]),
                presence=rng.choice([0.0, -0.5, 1.0]),
                repetition=rng.choice([1.0, 1.25, 2.0]),
                min_tokens=rng.randrange(8),
                stop=frozenset(rng.sample(range(VOCAB), rng.randrange(3))),
            )
        )
        parents.append(random_parents(rng, n))
        tokens.append([rng.randrange(VOCAB) for _ in range(n)])
        missing.append([rng.randrange(VOCAB) for _ in range(rng.randrange(3))])  # output the state has not seen
    logits = [[rng.uniform(-4, 4) for _ in range(VOCAB)] for _ in range(b * n)]
    return reqs, parents, tokens, missing, logits


@settings(max_examples=150, deadline=None)
@given(tree_cases())
def test_tree_penalties_equal_the_per_node_oracle(case):
    reqs, parents, tokens, missing, logits = case
    b, n = len(reqs), len(parents[0])
    pointers = [parents_to_pointers(p) for p in parents]
    parent = tree_parents(torch.tensor([f for f, _ in pointers]), torch.tensor([s for _, s in pointers]))
    assert parent.tolist() == parents
    depth = max(max(depth_of(p)) for p in parents)
    path = path_tokens(parent, torch.tensor(tokens), depth)
    lead = max(len(m) for m in missing)
    ahead = torch.full((b, n, lead), -1, dtype=torch.int64)
    for i, m in enumerate(missing):
        ahead[i, :, : len(m)] = torch.tensor(m, dtype=torch.int64)
    additive, scaling = state_of(reqs)
    before = [t.acc.clone() for t in additive if isinstance(t, TokenPenalty)]
    got = torch.tensor(logits, dtype=torch.float32)
    tree_penalties(got, torch.cat([ahead, path], dim=2), additive=additive, scaling=scaling)
    for t, acc in zip([t for t in additive if isinstance(t, TokenPenalty)], before):
        assert torch.equal(t.acc, acc)  # the request's state is not advanced by a verify
    for r in range(b):
        for i in range(n):
            node, chain = i, []
            while node > 0:
                chain.append(tokens[r][node])
                node = parents[r][node]
            want = node_logits(logits[r * n + i], reqs[r], missing[r] + chain)
            assert got[r * n + i].tolist() == pytest.approx(want, abs=1e-5), (r, i, chain)


def test_worked_example_of_the_module_docstring():
    # vocabulary a b c d = 0 1 2 3; presence 0.5; min_tokens 3, stop d; output [a]; root -> b -> a, root -> c
    req = Request(output=(0,), presence=0.5, min_tokens=3, stop=frozenset({3}))
    additive, _ = state_of([req])
    parent = torch.tensor([[-1, 0, 1, 0]])
    path = path_tokens(parent, torch.tensor([[0, 1, 0, 2]]), 2)
    logits = torch.zeros(4, VOCAB)
    tree_penalties(logits, path, additive=additive)
    inf = float("-inf")
    assert logits[:, :4].tolist() == [[-0.5, 0, 0, inf], [-0.5, -0.5, 0, inf], [-0.5, -0.5, 0, 0], [-0.5, 0, -0.5, inf]]


def test_a_node_no_pointer_reaches_has_no_parent():
    # node 2 unlinked (SGLang's pointers skip it): root -> 1 only
    parent = tree_parents(torch.tensor([[1, -1, -1]]), torch.tensor([[-1, -1, -1]]))
    assert parent.tolist() == [[-1, 0, -1]]


def test_one_node_trees_and_no_drafted_tokens():
    req = Request(output=(2, 2), frequency=1.0, repetition=2.0)
    additive, scaling = state_of([req])
    logits = torch.tensor([[1.0, -1.0, 4.0, 0.5, 0, 0, 0, 0, 0]])
    tree_penalties(logits, torch.full((1, 1, 0), -1), additive=additive, scaling=scaling)
    assert logits[0, :4].tolist() == [1.0, -1.0, 1.0, 0.5]  # (4 - 2) / 2


def _req(**params):
    from types import SimpleNamespace

    sp = dict(frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0, min_new_tokens=0, logit_bias=None,
              json_schema=None, regex=None, ebnf=None, structural_tag=None, temperature=0.0, top_k=-1,
              custom_params=None)  # fmt: skip
    custom = params.pop("custom_logit_processor", None)
    return SimpleNamespace(sampling_params=SimpleNamespace(**{**sp, **params}), custom_logit_processor=custom)


def test_a_request_opts_out_by_its_own_key_a_processor_or_a_listed_parameter():
    from sage_plugin.runtimes.sglang.penalties import OPT_OUT_KEY, opt_out_reason

    listed = frozenset({"presence_penalty", "sampling"})
    assert opt_out_reason(_req(), listed) == ""
    assert opt_out_reason(_req(frequency_penalty=0.5), listed) == ""  # exact under SAGE: not listed, speculates
    assert opt_out_reason(_req(presence_penalty=0.5), listed) == "presence_penalty"
    assert opt_out_reason(_req(temperature=0.7), listed) == "sampling"
    assert opt_out_reason(_req(temperature=0.7, top_k=1), listed) == ""  # top_k 1 is greedy
    assert opt_out_reason(_req(custom_params={OPT_OUT_KEY: True}), frozenset()) == f"custom_params.{OPT_OUT_KEY}"
    assert opt_out_reason(_req(custom_params={OPT_OUT_KEY: "yes"}), frozenset()) == ""  # only a JSON true
    assert opt_out_reason(_req(custom_logit_processor="{...}"), frozenset()) == "custom_logit_processor"
    req = _req(presence_penalty=0.5)
    assert opt_out_reason(req, listed) == "presence_penalty"
    assert opt_out_reason(req, frozenset()) == "presence_penalty"  # decided once, at the request's first step


def test_every_listable_parameter_has_a_predicate():
    from sage_plugin.config import OPT_OUT_PARAMS
    from sage_plugin.runtimes.sglang.penalties import USES_PARAM

    assert tuple(USES_PARAM) == OPT_OUT_PARAMS
