"""The paged-attention kernel's own properties (``kernels/csrc/paged_attention.cpp``, through SGLang's CPU attention ops).

``test_sglang_attention_ops.py`` checks both paths of the ops against a float64 oracle; here: which calls the kernel
takes, and that a kernel row's bits depend only on its query and the keys it sees.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sage_plugin.core.tree import ancestor_mask
from sage_plugin.kernels import native
from sage_plugin.kernels.paged_attention import MAX_QUERY_ROWS, SMALL_CALL_ROWS, attention_kernel
from tests.unit.test_sglang_attention_ops import (
    GARBAGE,
    call_decode,
    call_extend,
    extend_case,
    gen,
    paged_pool,
    random_tree_masks,
)  # fmt: skip


def recording_kernel(monkeypatch) -> list:
    """Replace the kernel by a recorder around it; returns the list of its calls' modes."""
    real, calls = attention_kernel(), []

    class Recording:
        @staticmethod
        def paged_attention(*args):
            calls.append(args[9])
            return real.paged_attention(*args)

    monkeypatch.setitem(native._built, "paged_attention", Recording)
    return calls


def test_the_kernel_takes_decode_verify_and_draft_extend_calls_and_leaves_the_rest(monkeypatch):
    calls = recording_kernel(monkeypatch)
    g = gen(5)
    k_cache, v_cache, rtt, rpi = paged_pool(g, [7, 3], 2, 64, 64)
    q, out = torch.randn(2, 4, 64, generator=g), torch.empty(2, 4, 64)
    call_decode(q, k_cache, v_cache, out, None, None, torch.tensor([1, 2]), rtt, rpi, torch.tensor([7, 3]), 0.3)
    assert calls == [0]
    call_decode(q, k_cache, v_cache, out, None, None, torch.tensor([1, 2]), rtt, rpi, torch.tensor([7, 3]), 0.3,
                logit_cap=2.0)  # fmt: skip
    assert calls == [0], "a logit cap takes the explicit torch path"
    for bs, n, mask, want in [
        (1, 3, True, 2), (1, 3, False, 1), (16, 2, True, 2), (2, 8, False, 1),
        (1, MAX_QUERY_ROWS + 1, False, None), (SMALL_CALL_ROWS // 4 + 1, 4, True, None),
    ]:  # fmt: skip
        case = extend_case(g, [4] * bs, [n] * bs, 2, 64, 64)
        k_c, v_c, rtt_e, rpi_e, k_ext, v_ext, seq, start, _, _ = case
        custom = random_tree_masks(g, bs, n).flatten() if mask else None
        before = len(calls)
        call_extend(torch.randn(bs * n, 4, 64, generator=g), k_ext, v_ext, torch.empty(bs * n, 4, 64), k_c, v_c,
                    rtt_e, rpi_e, seq, torch.full((bs,), n), start, 0.3, custom_mask=custom)  # fmt: skip
        assert calls[before:] == ([] if want is None else [want]), (bs, n, mask)
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    call_decode(q.bfloat16(), k16, v16, out.bfloat16(), None, None, torch.tensor([1, 2]), rtt, rpi,
                torch.tensor([7, 3]), 0.3)  # fmt: skip
    assert calls == [0, 2, 1, 2, 1], "bfloat16 caches take the torch path"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # monkeypatch
@given(
    st.integers(0, 2**31), st.integers(0, 40), st.integers(1, MAX_QUERY_ROWS), st.sampled_from([(4, 2), (9, 3), (4, 1)]),
    st.sampled_from([64, 36, 20]),
)  # fmt: skip
def test_a_kernel_row_is_the_same_bits_alone_in_a_batch_and_as_the_decode_it_becomes(monkeypatch, seed, p, n, heads, d):
    """A tree-verify row of one request equals, bit for bit, the same row verified beside other requests, and the
    decode of that node once its path is in the cache (the keys it sees are the same, in the same order).  Head
    sizes 36 and 20 leave a scalar tail after the vectors (on AVX2 and AVX-512)."""
    calls = recording_kernel(monkeypatch)
    g = gen(seed)
    h, hkv = heads
    parents = torch.full((1, n), -1)
    for i in range(1, n):
        parents[0, i] = int(torch.randint(0, i, (1,), generator=g))
    mask = ancestor_mask(parents, n)[0]  # [n, n]
    k_cache, v_cache = (
        torch.randn(p + 2 * n + 60, hkv, d, generator=g),
        torch.randn(p + 2 * n + 60, hkv, d, generator=g),
    )
    slots = 1 + torch.randperm(k_cache.shape[0] - 1, generator=g)
    prefix, node_slots, path_slots = slots[:p], slots[p : p + n], slots[p + n : p + 2 * n]
    k_ext, v_ext, q = (torch.randn(n, hkv, d, generator=g), torch.randn(n, hkv, d, generator=g),
                       torch.randn(n, h, d, generator=g))  # fmt: skip
    # the request alone, then after a second request (other prefix, a chain of 3) in one call
    rtt = torch.full((3, p + n + 50), GARBAGE, dtype=torch.int32)
    rtt[0, : p + n] = torch.cat([prefix, node_slots]).int()
    rtt[1, :50] = slots[p + 2 * n : p + 2 * n + 50].int()
    alone = torch.empty(n, h, d)
    call_extend(q, k_ext, v_ext, alone, k_cache, v_cache, rtt, torch.tensor([0]), torch.tensor([p + n]),
                torch.tensor([n]), torch.tensor([0]), 0.125, custom_mask=mask.flatten())  # fmt: skip
    other = ancestor_mask(torch.arange(-1, 2)[None], 3)[0]
    k2, v2, q2 = (torch.cat([torch.randn(3, *t.shape[1:], generator=g), t]) for t in (k_ext, v_ext, q))
    both = torch.empty(n + 3, h, d)
    call_extend(q2, k2, v2, both, k_cache, v_cache, rtt, torch.tensor([1, 0]), torch.tensor([50, p + n]),
                torch.tensor([3, n]), torch.tensor([0, 3]), 0.125,
                custom_mask=torch.cat([other.flatten(), mask.flatten()]))  # fmt: skip
    assert torch.equal(both[3:], alone)
    # node i decoded once its path (root .. i) is committed to the cache
    for i in range(n):
        path_nodes = mask[i].nonzero().flatten()  # ancestors-or-self in tree order
        m = path_nodes.numel()
        k_cache[path_slots[:m].long()], v_cache[path_slots[:m].long()] = k_ext[path_nodes], v_ext[path_nodes]
        rtt[2, : p + m] = torch.cat([prefix, path_slots[:m]]).int()
        out = torch.empty(1, h, d)
        call_decode(q[i : i + 1], k_cache, v_cache, out, None, None, torch.tensor([0]), rtt, torch.tensor([2]),
                    torch.tensor([p + m]), 0.125)  # fmt: skip
        assert torch.equal(out[0], alone[i]), i
    assert calls == [2, 2] + [0] * n  # every call took the kernel
