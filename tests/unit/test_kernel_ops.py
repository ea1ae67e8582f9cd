"""The CPU kernels as PyTorch custom ops (``sage_plugin/kernels``): every op is registered in the ``sage_plugin``
namespace with a schema that states what it writes, and a fake kernel, so ``torch.library.opcheck`` passes its schema
and fake-tensor checks and ``FakeTensorMode`` traces each op to the shapes the real kernel returns.

Each case builds the smallest valid call of one op (shapes in the op's module docstring).
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from sage_plugin.core.beam_level import registered_op
from sage_plugin.core.level_expansion import new_pool, top_children
from sage_plugin.kernels.beam_level import beam_ops
from sage_plugin.kernels.linear import rows_kernel
from sage_plugin.kernels.llama_decoder import decoder_kernel
from sage_plugin.kernels.paged_attention import attention_kernel
from sage_plugin.kernels.spec_cache import spec_cache_ops

CHECKS = ("test_schema", "test_faketensor")


def _rows_linear():
    return rows_kernel(), "rows_linear", (torch.randn(3, 32), torch.randn(5, 32).bfloat16())


def _paged_attention():
    g = torch.Generator().manual_seed(0)
    q, o = torch.randn(2, 4, 16, generator=g), torch.zeros(2, 4, 16)
    k_buf, v_buf = torch.randn(9, 2, 16, generator=g), torch.randn(9, 2, 16, generator=g)
    slots = torch.tensor([[3, 5, 1], [2, 8, 0]])
    meta = torch.tensor([[0, 1, 3, 3, 0], [1, 1, 2, 2, 0]])
    none = torch.empty(0)
    args = (q, o, k_buf, v_buf, none, none, slots, meta, none, 0, 0.25, 1.0, 1.0)
    return attention_kernel(), "paged_attention", args


def _llama(hidden=16, heads=2, kv_heads=1, head_dim=8, inter=16, batch=1, new=2, cached=3):
    g = torch.Generator().manual_seed(1)
    w = lambda *s: torch.randn(*s, generator=g) * 0.1  # noqa: E731
    norm = torch.ones(hidden)
    layer = [norm, w((heads + 2 * kv_heads) * head_dim, hidden), w(hidden, heads * head_dim), norm,
             w(2 * inter, hidden), w(hidden, inter)]  # fmt: skip
    cap = cached + new
    return g, w, norm, layer, cap


def _llama_decoder():
    g, w, norm, layer, cap = _llama()
    x, cos, sin = torch.randn(1, 2, 16, generator=g), torch.ones(1, 2, 4), torch.zeros(1, 2, 4)
    mask = torch.ones(1, 2, 5, dtype=torch.bool)
    k_bufs, v_bufs = [torch.zeros(1, 1, cap, 8)], [torch.zeros(1, 1, cap, 8)]
    args = (x, cos, sin, mask, layer, norm, k_bufs, v_bufs, 3, 2, 1, 1e-5, 8**-0.5)
    return decoder_kernel(), "llama_decoder", args


def _llama_layer_before():
    g, w, norm, layer, _ = _llama()
    x, cos, sin = torch.randn(2, 16, generator=g), torch.ones(2, 4), torch.zeros(2, 4)
    return decoder_kernel(), "llama_layer_before", (x, norm, layer[1], cos, sin, 3, 8, 1e-5)


def _llama_layer_after():
    g, w, norm, layer, _ = _llama()
    x, att = torch.randn(2, 16, generator=g), torch.randn(2, 16, generator=g)
    return decoder_kernel(), "llama_layer_after", (x, att, layer[2], norm, layer[4], layer[5], 1e-5)


def _beam_pool():
    pool, frontier = new_pool(torch.tensor([4, 7]), 12, 3)
    logprobs = torch.log_softmax(torch.randn(2, 1, 10, generator=torch.Generator().manual_seed(2)), -1)
    return pool, frontier, top_children(logprobs, 3)


def _beam_level():
    pool, frontier, top = _beam_pool()
    cols = (pool.tokens, pool.parents, pool.depths, pool.logp, pool.logp_topk, pool.joint, pool.joint_topk,
            pool.ranks, pool.codes, pool.conf, pool.count)  # fmt: skip
    args = (*cols, frontier.idx.contiguous(), top.values, top.values, top.tokens, top.logp_topk, top.conf,
            torch.tensor([2, 1]), 1, 4, 3, True)  # fmt: skip
    return beam_ops(), "beam_level", args


def _level_pays():
    pool, _, _ = _beam_pool()
    pool.count[:] = 4
    pool.joint[:, 1:4] = torch.tensor([-0.1, -0.7, -1.9])
    pool.depths[:, 1:4] = 1
    return beam_ops(), "level_pays", (pool.joint, pool.depths, pool.count, 1, torch.tensor([1.0, 1.1, 1.2]), None)


SPEC_CACHE_OPS = ("assign_req_to_token_pool", "assign_extend_cache_locs", "assign_draft_cache_locs_contiguous",
                  "fill_bonus_tokens", "fill_accept_out_cache_loc", "build_draft_decode_metadata",
                  "verify_tree_greedy", "build_tree_kernel_efficient")  # fmt: skip


def _spec_cache(name):
    """One call of a ``spec_cache`` op: two requests in rows 2 and 0 of an 8-column ``req_to_token``."""
    table = torch.arange(24, dtype=torch.int32).reshape(3, 8)
    rpi, start, end = torch.tensor([2, 0]), torch.tensor([1, 3]), torch.tensor([3, 4])
    args = {
        "assign_req_to_token_pool": (rpi, table, start, end, torch.tensor([40, 41, 42]), 8),
        "assign_extend_cache_locs": (rpi, table, start, end, torch.zeros(4, dtype=torch.int64), 8),
        "assign_draft_cache_locs_contiguous": (rpi, table, start, torch.zeros(4, dtype=torch.int64), 8, 2, 1),
        "fill_bonus_tokens": (
            torch.tensor([[5, 6], [7, 8]]),
            torch.tensor([2, 1]),
            torch.zeros(2, dtype=torch.int32),
            2,
        ),
        "fill_accept_out_cache_loc": (
            torch.tensor([[0, -1], [2, 3]]),
            torch.arange(10, 14),
            torch.zeros(4, dtype=torch.int64),
            None,
        ),
        "build_draft_decode_metadata": (table, rpi, start, 2, 2, 8),
        "verify_tree_greedy": (  # one request, root -> node 1 -> node 2 (a chain of three)
            torch.full((3,), -1, dtype=torch.int32),
            torch.full((1, 3), -1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32),
            torch.tensor([[9, 4, 5]]),
            torch.tensor([[0, 1, 2]]),
            torch.tensor([[1, 2, -1]]),
            torch.tensor([[-1, -1, -1]]),
            torch.tensor([4, 7, 6]),
        ),  # fmt: skip
        "build_tree_kernel_efficient": (  # topk 2, 3 levels, 5 nodes (tree_ops' worked example), QLEN_ONLY mask
            torch.tensor([[-1, 0, 1, 2, 3]]),
            torch.tensor([[0, 1, 2, 6]]),
            torch.tensor([7]),
            torch.ones(25, dtype=torch.bool),
            torch.zeros(5, dtype=torch.int64),
            *torch.full((3, 1, 5), -1, dtype=torch.int64),
            2,
            3,
            5,
            1,
        ),  # fmt: skip
    }[name]
    return spec_cache_ops(), name, args


def _case(name):
    case = lambda: _spec_cache(name)  # noqa: E731
    case.__name__ = f"_{name}"
    return case


CASES = [_rows_linear, _paged_attention, _llama_decoder, _llama_layer_before, _llama_layer_after, _beam_level,
         _level_pays, *map(_case, SPEC_CACHE_OPS)]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__.lstrip("_"))
def test_each_op_passes_the_schema_and_fake_tensor_checks(case):
    ops, name, args = case()
    assert ops is not None, "the kernels build on every machine the tests run on (tools/setup.sh builds them)"
    op = getattr(torch.ops.sage_plugin, name)
    torch.library.opcheck(op, args, test_utils=CHECKS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__.lstrip("_"))
def test_fake_tensor_mode_traces_each_op_to_the_real_shapes(case):
    ops, name, args = case()
    op = getattr(torch.ops.sage_plugin, name)
    real = op(*_cloned(args))
    mode = FakeTensorMode()
    with mode:
        fake = op(*_cloned(_faked(mode, args)))
    if real is None:
        assert fake is None
    else:
        assert (fake.shape, fake.dtype) == (real.shape, real.dtype)


def test_the_core_finds_the_beam_ops_by_name_once_registered():
    """The algorithm core never imports the kernels: it looks the op up in ``torch.ops.sage_plugin``."""
    assert beam_ops() is not None
    assert registered_op("beam_level") is torch.ops.sage_plugin.beam_level
    assert registered_op("no_such_op") is None


def _cloned(args):
    return tuple(
        a.clone() if isinstance(a, torch.Tensor) else [t.clone() for t in a] if isinstance(a, list) else a for a in args
    )


def _faked(mode, args):
    conv = mode.from_tensor
    return tuple(
        conv(a) if isinstance(a, torch.Tensor) else [conv(t) for t in a] if isinstance(a, list) else a for a in args
    )
