"""Pure-torch ``decode_attention_cpu`` / ``extend_attention_cpu`` against naive per-request softmax attention.

Every test runs twice: through the paged-attention kernel (``kernels/csrc/paged_attention.cpp``, which
``tools/setup.sh`` builds) and with it unavailable (the gather + SDPA path).  Every test builds a random paged KV layout (request rows of ``req_to_token`` point at scattered cache slots,
slot 0 reserved, unused columns filled with out-of-range slots that must never be read), calls the ops
positionally through ``torch.ops`` exactly as SGLang's ``intel_amx`` backend does, and compares with a
float64 reference that loops over requests and heads on the logical (unpaged) sequences.  Ops are registered
in a private namespace; no sglang import.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sage_plugin.core.tree import ancestor_mask
from sage_plugin.kernels import native
from sage_plugin.kernels.paged_attention import attention_kernel
from sage_plugin.runtimes.sglang import cpu_ops

NS = "sage_test_sgl_attn"
# the kernel / torch fixture below is set once per test, not per example
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
GARBAGE = 10**6  # req_to_token filler past every sequence: indexing the cache with it would raise
HEADS = st.sampled_from([(1, 1), (4, 4), (4, 2), (6, 1), (8, 2)])  # (query heads, KV heads)
# (D, Dv): the kernel's vector body (multiples of 8 / 16 lanes), its scalar tail, and both
DIMS = st.sampled_from([(8, 8), (8, 4), (64, 64), (40, 24)])


@pytest.fixture(autouse=True, params=["kernel", "torch"])
def path(request, monkeypatch):
    """Run each test through the kernel, then with the kernel unavailable (as where it cannot be built)."""
    if request.param == "kernel":
        assert attention_kernel() is not None, "the kernel builds on every machine the tests run on"
    else:
        monkeypatch.setitem(native._built, "paged_attention", False)
    return request.param


def ops():
    cpu_ops.register_cpu_ops(NS)
    return getattr(torch.ops, NS)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def paged_pool(g, lens, hkv, d, dv, dtype=torch.float32, spare_rows=2):
    """Cache ``[slots, hkv, d|dv]`` and a ``req_to_token`` whose row ``rpi[b]`` holds ``lens[b]`` scattered slots."""
    bs = len(lens)
    num_slots = sum(lens) + 6
    k_cache = torch.randn(num_slots, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(num_slots, hkv, dv, generator=g).to(dtype)
    req_to_token = torch.full((bs + spare_rows, max(lens) + 3), GARBAGE, dtype=torch.int32)
    rpi = torch.randperm(bs + spare_rows, generator=g)[:bs]
    free = 1 + torch.randperm(num_slots - 1, generator=g)  # slot 0 is SGLang's padding slot
    off = 0
    for b, n in enumerate(lens):
        req_to_token[rpi[b], :n] = free[off : off + n].int()
        off += n
    return k_cache, v_cache, req_to_token, rpi


def ref_attention(q, k, v, visible, sm_scale, logit_cap=0.0, sinks=None):
    """``q [Lq, H, D]``, ``k [L, Hkv, D]``, ``v [L, Hkv, Dv]``, ``visible [Lq, L]`` -> float64 ``[Lq, H, Dv]``."""
    q, k, v = q.double(), k.double(), v.double()
    lq, heads, _ = q.shape
    group = heads // k.shape[1]
    out = torch.zeros(lq, heads, v.shape[-1], dtype=torch.float64)
    for h in range(heads):
        s = q[:, h] @ k[:, h // group].T * sm_scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        s = s.masked_fill(~visible, float("-inf"))
        if sinks is not None:  # one value-less logit per head
            s = torch.cat([s, torch.full((lq, 1), float(sinks[h]), dtype=torch.float64)], 1)
        out[:, h] = torch.softmax(s, -1)[:, : k.shape[0]] @ v[:, h // group]
    return out


def rows_of(cache, req_to_token, row, n):
    return cache[req_to_token[row, :n].long()]


def call_decode(q, k_cache, v_cache, out, key, value, loc, req_to_token, rpi, seq_lens, sm_scale, **kw):
    rows, heads = q.shape[:2]
    attn_logits = torch.zeros(rows, heads, 8, v_cache.shape[-1] + 1)
    ops().decode_attention_cpu(
        q, k_cache, v_cache, kw.get("key_scale", 1.0), kw.get("value_scale", 1.0), out, key, value, loc,
        attn_logits, req_to_token, rpi, seq_lens.long(), sm_scale, kw.get("logit_cap", 0.0),
        kw.get("is_cross_attn", False), kw.get("sliding_window_size", 0), kw.get("encoder_lens"), kw.get("sinks"),
    )  # fmt: skip


def call_extend(q, k_ext, v_ext, out, k_buf, v_buf, req_to_token, rpi, seq, ext, start, sm_scale, **kw):
    ops().extend_attention_cpu(
        q, k_ext, v_ext, out, k_buf, v_buf, kw.get("key_scale", 1.0), kw.get("value_scale", 1.0), req_to_token,
        rpi, seq.long(), ext.int(), start.int(), int(ext.max()) if ext.numel() else 0, sm_scale,
        kw.get("logit_cap", 0.0), kw.get("is_cross_attn", False), kw.get("sliding_window_size", 0),
        kw.get("encoder_lens"), kw.get("sinks"), kw.get("custom_mask"), kw.get("is_causal", True),
    )  # fmt: skip


def options(draw_cap: bool, draw_sinks: bool, heads: int, g) -> dict:
    return {
        "logit_cap": 2.5 if draw_cap else 0.0,
        "sinks": torch.randn(heads, generator=g) if draw_sinks else None,
    }


# ------------------------------------------------------------------------------------------ decode


@SETTINGS
@given(
    st.integers(0, 2**31), st.lists(st.integers(1, 12), min_size=1, max_size=4), HEADS,
    DIMS, st.booleans(), st.booleans(), st.booleans(),
)  # fmt: skip
def test_decode_writes_kv_at_loc_and_attends(seed, seq_lens, heads, dims, cap, sink, write):
    g = gen(seed)
    (h, hkv), (d, dv) = heads, dims
    k_cache, v_cache, rtt, rpi = paged_pool(g, seq_lens, hkv, d, dv)
    bs = len(seq_lens)
    seq = torch.tensor(seq_lens)
    loc = torch.stack([rtt[rpi[b], seq_lens[b] - 1] for b in range(bs)]).long()  # the new token's slot
    key, value = torch.randn(bs, hkv, d, generator=g), torch.randn(bs, hkv, dv, generator=g)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    if write:
        want_k[loc], want_v[loc] = key, value
    q = torch.randn(bs, h, d, generator=g)
    out = torch.full((bs, h, dv), float("nan"))
    kw = options(cap, sink, h, g)
    args = (key, value) if write else (None, None)
    call_decode(q, k_cache, v_cache, out, *args, loc, rtt, rpi, seq, 0.3, **kw)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)  # exactly the loc rows changed
    for b in range(bs):
        k, v = rows_of(want_k, rtt, rpi[b], seq_lens[b]), rows_of(want_v, rtt, rpi[b], seq_lens[b])
        ref = ref_attention(q[b : b + 1], k, v, torch.ones(1, seq_lens[b], dtype=torch.bool), 0.3, **kw)
        torch.testing.assert_close(out[b : b + 1].double(), ref, atol=1e-5, rtol=1e-5)


def test_decode_bf16_cache_and_kv_scales():
    g = gen(1)
    k_cache, v_cache, rtt, rpi = paged_pool(g, [5, 9, 1], 2, 8, 8, dtype=torch.bfloat16)
    seq = torch.tensor([5, 9, 1])
    q = torch.randn(3, 4, 8, generator=g).bfloat16()
    out = torch.empty(3, 4, 8, dtype=torch.bfloat16)
    call_decode(q, k_cache, v_cache, out, None, None, torch.zeros(3).long(), rtt, rpi, seq, 0.5, key_scale=0.5,
                value_scale=2.0)  # fmt: skip
    for b in range(3):
        k = rows_of(k_cache, rtt, rpi[b], int(seq[b])).double() * 0.5  # dequantised on read
        v = rows_of(v_cache, rtt, rpi[b], int(seq[b])).double() * 2.0
        ref = ref_attention(q[b : b + 1], k, v, torch.ones(1, int(seq[b]), dtype=torch.bool), 0.5)
        torch.testing.assert_close(out[b : b + 1].double(), ref, atol=3e-2, rtol=2e-2)


@SETTINGS
@given(st.integers(0, 2**31), st.integers(1, 3), st.integers(1, 3), st.integers(2, 4), HEADS, st.booleans())
def test_multi_step_draft_decode_layout(seed, bs, topk, num_steps, heads, cap):
    """IntelAMXMultiStepDraftBackend: rows ``b*topk + k`` over ``build_draft_decode_metadata_cpu``'s table.

    Each draft step writes every branch's new K/V at its own slot and attends over the request's prefix plus
    that branch's drafts so far; the reference keeps one logical K/V list per branch and never looks at
    slots, so a branch seeing another branch's drafts (or stale slots) would show up.
    """
    g = gen(seed)
    (h, hkv), d = heads, 8
    prefix = torch.randint(1, 8, (bs,), generator=g)
    width = topk * num_steps
    k_cache, v_cache, rtt, rpi = paged_pool(g, [int(p) + width for p in prefix], hkv, d, d)
    pool_len = rtt.shape[1]
    table = ops().build_draft_decode_metadata_cpu(rtt, rpi, prefix, topk, num_steps, pool_len)
    rows = bs * topk
    branch_k = [rows_of(k_cache, rtt, rpi[r // topk], int(prefix[r // topk])) for r in range(rows)]
    branch_v = [rows_of(v_cache, rtt, rpi[r // topk], int(prefix[r // topk])) for r in range(rows)]
    kw = options(cap, False, h, g)
    for step in range(num_steps - 1):
        seq = prefix.repeat_interleave(topk) + step + 1
        loc = torch.stack(
            [rtt[rpi[r // topk], int(prefix[r // topk]) + (r % topk) * num_steps + step] for r in range(rows)]
        )
        key, value = torch.randn(rows, hkv, d, generator=g), torch.randn(rows, hkv, d, generator=g)
        q = torch.randn(rows, h, d, generator=g)
        out = torch.empty(rows, h, d)
        call_decode(q, k_cache, v_cache, out, key, value, loc, table, torch.arange(rows), seq, 0.35, **kw)
        for r in range(rows):
            branch_k[r] = torch.cat([branch_k[r], key[r : r + 1]])
            branch_v[r] = torch.cat([branch_v[r], value[r : r + 1]])
            ref = ref_attention(
                q[r : r + 1], branch_k[r], branch_v[r], torch.ones(1, len(branch_k[r]), dtype=torch.bool), 0.35, **kw
            )
            torch.testing.assert_close(out[r : r + 1].double(), ref, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------ extend


def extend_case(g, prefix_lens, ext_lens, hkv, d, dv, write_cache=True):
    """Paged prefix + extend tokens; the extend K/V sit in ``k_ext`` and (if ``write_cache``) in the cache."""
    seq_lens = [p + e for p, e in zip(prefix_lens, ext_lens)]
    k_cache, v_cache, rtt, rpi = paged_pool(g, [max(s, 1) for s in seq_lens], hkv, d, dv)
    total = sum(ext_lens)
    k_ext, v_ext = torch.randn(total, hkv, d, generator=g), torch.randn(total, hkv, dv, generator=g)
    start = torch.tensor([0] + ext_lens[:-1]).cumsum(0)
    logical_k, logical_v = [], []
    for b, (p, e) in enumerate(zip(prefix_lens, ext_lens)):
        s0 = int(start[b])
        slots = rtt[rpi[b], p : p + e].long()
        if write_cache:  # what the backend's set_kv_buffer did before the call
            k_cache[slots], v_cache[slots] = k_ext[s0 : s0 + e], v_ext[s0 : s0 + e]
        else:  # stale cache rows: the kernel must read the extend part from k_ext / v_ext
            k_cache[slots], v_cache[slots] = 99.0, -99.0
        logical_k.append(torch.cat([rows_of(k_cache, rtt, rpi[b], p), k_ext[s0 : s0 + e]]))
        logical_v.append(torch.cat([rows_of(v_cache, rtt, rpi[b], p), v_ext[s0 : s0 + e]]))
    return k_cache, v_cache, rtt, rpi, k_ext, v_ext, torch.tensor(seq_lens), start, logical_k, logical_v


@SETTINGS
@given(
    st.integers(0, 2**31), st.lists(st.tuples(st.integers(0, 9), st.integers(1, 6)), min_size=1, max_size=4),
    HEADS, DIMS, st.sampled_from(["given", "cache_only", "stale_cache"]),
    st.booleans(), st.booleans(), st.booleans(),
)  # fmt: skip
def test_extend_causal_over_prefix_and_extend(seed, lens, heads, dims, source, causal, cap, sink):
    g = gen(seed)
    (h, hkv), (d, dv) = heads, dims
    prefix_lens, ext_lens = [p for p, _ in lens], [e for _, e in lens]
    case = extend_case(g, prefix_lens, ext_lens, hkv, d, dv, write_cache=source != "stale_cache")
    k_cache, v_cache, rtt, rpi, k_ext, v_ext, seq, start, logical_k, logical_v = case
    q = torch.randn(sum(ext_lens), h, d, generator=g)
    out = torch.full((sum(ext_lens), h, dv), float("nan"))
    kw = options(cap, sink, h, g)
    fresh = (None, None) if source == "cache_only" else (k_ext, v_ext)
    ext = torch.tensor(ext_lens)
    call_extend(q, *fresh, out, k_cache, v_cache, rtt, rpi, seq, ext, start, 0.3, is_causal=causal, **kw)
    for b, (p, e) in enumerate(zip(prefix_lens, ext_lens)):
        s0 = int(start[b])
        visible = torch.ones(e, p + e, dtype=torch.bool)
        if causal:
            visible[:, p:] = torch.ones(e, e, dtype=torch.bool).tril()
        ref = ref_attention(q[s0 : s0 + e], logical_k[b], logical_v[b], visible, 0.3, **kw)
        torch.testing.assert_close(out[s0 : s0 + e].double(), ref, atol=1e-5, rtol=1e-5)


def random_tree_masks(g, bs, n):
    """``[bs, n, n]`` ancestor masks of random trees (node 0 the root, parents before children)."""
    parents = torch.full((bs, n), -1)
    for i in range(1, n):
        parents[:, i] = torch.randint(0, i, (bs,), generator=g)
    return ancestor_mask(parents, n)


@SETTINGS
@given(
    st.integers(0, 2**31), st.lists(st.integers(0, 10), min_size=1, max_size=3), st.integers(1, 7), HEADS,
    st.sampled_from([8, 64]),
)  # fmt: skip
def test_target_verify_with_qlen_only_tree_mask(seed, prefix_lens, n, heads, d):
    """TARGET_VERIFY: E = n draft tokens per request, the prefix fully visible, the tree by ancestor mask."""
    g = gen(seed)
    h, hkv = heads
    bs = len(prefix_lens)
    case = extend_case(g, prefix_lens, [n] * bs, hkv, d, d)
    k_cache, v_cache, rtt, rpi, k_ext, v_ext, seq, start, logical_k, logical_v = case
    assert start.tolist() == list(range(0, bs * n, n))  # the backend's arange(0, bs*E, E)
    masks = random_tree_masks(g, bs, n)
    q = torch.randn(bs * n, h, d, generator=g)
    ext = torch.full((bs,), n)
    out_qlen, out_full = torch.empty(bs * n, h, d), torch.empty(bs * n, h, d)
    call_extend(
        q, k_ext, v_ext, out_qlen, k_cache, v_cache, rtt, rpi, seq, ext, start, 0.3, custom_mask=masks.flatten()
    )
    full = torch.cat(
        [torch.cat([torch.ones(n, p, dtype=torch.bool), masks[b]], 1).flatten() for b, p in enumerate(prefix_lens)]
    )
    call_extend(
        q, k_ext, v_ext, out_full, k_cache, v_cache, rtt, rpi, seq, ext, start, 0.3, custom_mask=full.to(torch.uint8)
    )
    for b, p in enumerate(prefix_lens):
        visible = torch.cat([torch.ones(n, p, dtype=torch.bool), masks[b]], 1)
        ref = ref_attention(q[b * n : (b + 1) * n], logical_k[b], logical_v[b], visible, 0.3)
        torch.testing.assert_close(out_qlen[b * n : (b + 1) * n].double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_full, out_qlen, atol=1e-6, rtol=1e-6)


def test_layers_share_a_layout_but_never_a_stale_one():
    """The layout an extend call builds (query rows, fresh keys, visibility) is reused while the lengths and the
    mask repeat, as across one forward's layers; calls that keep the shapes but change the mask (a new tensor or
    the same one written in place), the paged slots or the lengths must each match the reference."""
    g = gen(7)
    prefix_lens, n, (h, hkv) = [5, 3], 4, (4, 2)
    mask_obj = random_tree_masks(g, 2, n).flatten().clone()
    layouts = []
    for step in range(8):
        lens = prefix_lens if step < 6 else [3, 5]  # same total, other split
        case = extend_case(g, lens, [n, n], hkv, 8, 8)  # new paged slots and cache contents each step
        k_cache, v_cache, rtt, rpi, k_ext, v_ext, seq, start, logical_k, logical_v = case
        if step % 2:  # the same mask object, rewritten in place
            mask_obj.copy_(random_tree_masks(g, 2, n).flatten())
        masks = mask_obj.view(2, n, n)
        q = torch.randn(2 * n, h, 8, generator=g)
        for _layer in range(3):
            out = torch.full((2 * n, h, 8), float("nan"))
            call_extend(
                q, k_ext, v_ext, out, k_cache, v_cache, rtt, rpi, seq, torch.full((2,), n), start, 0.3,
                custom_mask=mask_obj,
            )  # fmt: skip
            layouts.append(cpu_ops.extend_layout._LAST[1])
            for b, p in enumerate(lens):
                visible = torch.cat([torch.ones(n, p, dtype=torch.bool), masks[b]], 1)
                ref = ref_attention(q[b * n : (b + 1) * n], logical_k[b], logical_v[b], visible, 0.3)
                torch.testing.assert_close(out[b * n : (b + 1) * n].double(), ref, atol=1e-5, rtol=1e-5)
        assert layouts[-1] is layouts[-2] is layouts[-3], "one layout for the three layers of a step"


def test_verify_chain_mask_equals_mask_free_causal():
    """``tree_topk == 1`` skips the mask: a chain's ancestor mask must give the mask-free causal result."""
    g = gen(7)
    case = extend_case(g, [4, 0, 6], [5, 5, 5], 2, 8, 8)
    k_cache, v_cache, rtt, rpi, k_ext, v_ext, seq, start, _, _ = case
    chain = ancestor_mask(torch.arange(-1, 4).repeat(3, 1), 5)
    q = torch.randn(15, 4, 8, generator=g)
    a, b = torch.empty(15, 4, 8), torch.empty(15, 4, 8)
    ext = torch.full((3,), 5)
    call_extend(q, k_ext, v_ext, a, k_cache, v_cache, rtt, rpi, seq, ext, start, 0.3, custom_mask=chain.flatten())
    call_extend(q, k_ext, v_ext, b, k_cache, v_cache, rtt, rpi, seq, ext, start, 0.3)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_draft_extend_bf16_ragged_with_zero_length_request():
    """DRAFT_EXTEND-like ragged batch in bf16, one request extending by nothing (its rows stay untouched)."""
    g = gen(3)
    case = extend_case(g, [3, 5, 2], [2, 0, 4], 1, 8, 8)
    k_cache, v_cache, rtt, rpi, k_ext, v_ext, seq, start, logical_k, logical_v = case
    k_cache, v_cache, k_ext, v_ext = (t.bfloat16() for t in (k_cache, v_cache, k_ext, v_ext))
    q = torch.randn(6, 3, 8, generator=g).bfloat16()
    out = torch.zeros(7, 3, 8, dtype=torch.bfloat16)  # one spare row past the tokens
    call_extend(q, k_ext, v_ext, out, k_cache, v_cache, rtt, rpi, seq, torch.tensor([2, 0, 4]), start, 0.4)
    assert torch.equal(out[6], torch.zeros(3, 8, dtype=torch.bfloat16))
    for b, (p, e) in enumerate([(3, 2), (5, 0), (2, 4)]):
        s0 = int(start[b])
        visible = torch.ones(e, p + e, dtype=torch.bool)
        visible[:, p:] = torch.ones(e, e, dtype=torch.bool).tril()
        ref = ref_attention(q[s0 : s0 + e], logical_k[b].bfloat16(), logical_v[b].bfloat16(), visible, 0.4)
        torch.testing.assert_close(out[s0 : s0 + e].double(), ref, atol=3e-2, rtol=2e-2)


# ------------------------------------------------------------------------------------------ unsupported


def small_decode_args():
    k_cache, v_cache, rtt, rpi = paged_pool(gen(0), [3], 1, 4, 4)
    return torch.randn(1, 2, 4), k_cache, v_cache, torch.empty(1, 2, 4), rtt, rpi


@pytest.mark.parametrize(
    "kw",
    [{"sliding_window_size": 5}, {"is_cross_attn": True}, {"encoder_lens": torch.tensor([2])}, {"key_scale": 0.5}],
)
def test_unsupported_features_raise(kw):
    q, k_cache, v_cache, out, rtt, rpi = small_decode_args()
    key, value = torch.randn(1, 1, 4), torch.randn(1, 1, 4)
    with pytest.raises(NotImplementedError):
        call_decode(q, k_cache, v_cache, out, key, value, torch.tensor([1]), rtt, rpi, torch.tensor([3]), 0.5, **kw)
    if "key_scale" in kw:
        return
    with pytest.raises(NotImplementedError):
        call_extend(q, None, None, out, k_cache, v_cache, rtt, rpi, torch.tensor([3]), torch.tensor([1]),
                    torch.tensor([0]), 0.5, **kw)  # fmt: skip


def test_bad_inputs_raise():
    q, k_cache, v_cache, out, rtt, rpi = small_decode_args()
    seq, one, zero = torch.tensor([3]), torch.tensor([1]), torch.tensor([0])
    with pytest.raises(RuntimeError, match="custom_mask"):
        call_extend(
            q,
            None,
            None,
            out,
            k_cache,
            v_cache,
            rtt,
            rpi,
            seq,
            one,
            zero,
            0.5,
            custom_mask=torch.ones(2, dtype=torch.bool),
        )
    with pytest.raises(RuntimeError, match="multiple"):
        kv = torch.zeros(k_cache.shape[0], 2, 4)
        call_decode(torch.randn(1, 3, 4), kv, kv.clone(), torch.empty(1, 3, 4), None, None, one, rtt, rpi, seq, 0.5)
    with pytest.raises(RuntimeError, match="exceeds"):
        call_decode(q, k_cache, v_cache, out, None, None, one, rtt, rpi, torch.tensor([rtt.shape[1] + 1]), 0.5)


# ------------------------------------------------------------------------------------------ registration


def test_registered_with_schemas_and_fakes():
    names = cpu_ops.register_cpu_ops(NS)
    assert {"decode_attention_cpu", "extend_attention_cpu"} <= set(names) <= set(cpu_ops.CPU_OP_NAMES)
    q, k_cache, v_cache, out, rtt, rpi = small_decode_args()
    decode_args = (q, k_cache, v_cache, 1.0, 1.0, out, torch.randn(1, 1, 4), torch.randn(1, 1, 4), torch.tensor([2]),
                   torch.zeros(1, 2, 8, 5), rtt, rpi, torch.tensor([3]), 0.5, 0.0, False, 0, None, None)  # fmt: skip
    torch.library.opcheck(ops().decode_attention_cpu, decode_args, test_utils=("test_schema", "test_faketensor"))
    extend_args = (q, torch.randn(1, 1, 4), torch.randn(1, 1, 4), out, k_cache, v_cache, 1.0, 1.0, rtt, rpi,
                   torch.tensor([3]), torch.tensor([1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32), 1,
                   0.5, 0.0, False, 0, None, None, None, True)  # fmt: skip
    torch.library.opcheck(ops().extend_attention_cpu, extend_args, test_utils=("test_schema", "test_faketensor"))
