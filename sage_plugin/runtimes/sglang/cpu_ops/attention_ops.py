"""Paged attention of SGLang's ``intel_amx`` backend: ``decode_attention_cpu`` and ``extend_attention_cpu``.

Schemas and call sites: ``sglang/srt/layers/attention/intel_amx_backend.py`` (0.5.23) passes every argument
positionally, in the order below.  KV buffers are ``MHATokenToKVPool``'s ``[slots, H_kv, D]`` (``page_size
== 1``); query heads ``H`` must be a multiple of ``H_kv`` (GQA: query head ``h`` reads KV head
``h // (H // H_kv)``).  Scores are ``q . k * sm_scale``, then ``logit_cap * tanh(s / logit_cap)`` when
``logit_cap > 0``, then a softmax over the visible keys (plus one value-less ``sinks[h]`` logit per head
when ``sinks`` is given, as in SGLang's Triton kernels).  Computed in float32, written in the output dtype.

* ``decode_attention_cpu(query [R, H, D], k_cache!, v_cache!, key_scale, value_scale, output! [R, H, Dv],
  key [R, H_kv, D]?, value [R, H_kv, Dv]?, loc [R], attn_logits, req_to_token, req_pool_indices [R],
  seq_lens [R] i64, sm_scale, logit_cap, is_cross_attn, sliding_window_size, encoder_lens?, sinks? [H])``:
  if ``key``/``value`` are given they are first written to ``k_cache[loc]`` / ``v_cache[loc]`` (the AMX
  backend leaves that write to the kernel; it writes fp8 caches itself and then passes ``None``).  Then
  row ``i`` attends ``query[i]`` over the slots ``req_to_token[req_pool_indices[i], :seq_lens[i]]``, all
  visible.  In the multi-step draft decode, ``req_to_token`` is the ``[bs*topk, pool_len]`` table of
  ``build_draft_decode_metadata_cpu``, ``req_pool_indices = arange(bs*topk)`` and row ``b*topk + k`` is
  branch ``k`` of request ``b``.  ``attn_logits`` (the C++ kernel's split-KV scratch) is not used.
* ``extend_attention_cpu(q_extend [T, H, D], k_extend [T, H_kv, D]?, v_extend?, o_extend! [T, H, Dv],
  k_buffer, v_buffer, key_scale, value_scale, req_to_token, req_pool_indices [bs], seq_lens [bs] i64,
  extend_seq_lens [bs], extend_start_loc [bs], max_len_extend, sm_scale, logit_cap, is_cross_attn,
  sliding_window_size, encoder_lens?, sinks?, custom_mask?, is_causal)``: request ``b`` owns query rows
  ``start_b + i`` (``i < E_b = extend_seq_lens[b]``) at sequence positions ``P_b + i`` with ``P_b =
  seq_lens[b] - E_b`` prefix tokens.  Keys ``j < P_b`` come from the cache
  (``req_to_token[rpi[b], j]``); keys ``P_b <= j < seq_lens[b]`` from ``k_extend[start_b + j - P_b]`` as
  in the C++ and Triton kernels, or from the cache when ``k_extend is None`` (KV-shared layers).
  Visibility: with ``custom_mask`` the whole prefix plus ``mask[b][i, j - P_b]`` over the extend keys,
  the mask being the concatenation over requests of row-major ``[E_b, E_b]`` blocks (QLEN_ONLY, what
  TARGET_VERIFY passes on CPU; bool or integer) or, recognised by its size ``sum(E_b * seq_lens[b])``,
  of ``[E_b, seq_lens[b]]`` blocks (FULL_MASK); else causal (``j <= P_b + i``) if ``is_causal``, else
  everything.  ``max_len_extend`` is not needed (the longest extend is read from ``extend_seq_lens``).

Dequantisation follows the Triton kernels: keys / values read from the cache are multiplied by
``key_scale`` / ``value_scale``; ``k_extend`` / ``v_extend`` are used as given.

Not supported (``NotImplementedError``, never a silently different result): ``sliding_window_size > 0``
(the backend passes ``layer.sliding_window_size + 1``, so 0 means no window), cross-attention
(``is_cross_attn`` or ``encoder_lens``), and writing ``key``/``value`` with a scale other than 1
(a quantised cache the backend would have written itself).

Cost.  Calls with a few query rows per request (decode, a verify or draft extend of up to 8 tokens per request in a
small call: :func:`~sage_plugin.kernels.paged_attention.kernel_takes`), float32 throughout and no ``logit_cap`` /
``sinks``, run the paged-attention kernel (``kernels/csrc/paged_attention.cpp``): keys and values are read in place from
their cache slots, one task per (request, KV head), nothing gathered or padded, and a row's result depends only on
the keys it sees (a verify row equals, bit for bit, the decode row that later sees the same keys).  Per call on the
2-core Xeon (SmolLM2's 9 / 3 heads of 64, 300 cached tokens), the path below / the kernel: decode of 1 / 16 requests
196 / 119 and 1,229 / 769 us; extend of 2 tokens at 1 / 16 requests 275 / 128 and 1,529 / 1,153 us.

Everything else is batched, not looped: every row's keys are gathered into one padded ``[R, L, H_kv, D]``
float32 tensor (``L`` = longest ``seq_lens``; ``index_select`` over the flattened slots) and attended with one
``torch.nn.functional.scaled_dot_product_attention`` whose query rows are the ``g = H / H_kv`` heads of each KV head
folded together (``[R, H_kv, g * Lq, D]``, an additive mask repeated ``g`` times: no K/V repeated per query head,
and no mask at all where every key is visible).  Memory and time are those of the padded batch, ``O(R * L)`` for
K/V and ``O(R * H * max E * L)`` for scores, so one long request in a batch of short ones pays for padding.  With
``logit_cap`` or ``sinks`` the scores are built explicitly, in query chunks of at most ``_SCORE_BUDGET`` float32
elements.  An extend call's layout (query rows, keys taken from ``k_extend``, the ``[bs, Lq, L]`` visibility, the
kernel's per-request lengths and the folded mask) depends on the lengths and the mask only: it is built once and
reused by the next calls whose lengths and mask are equal by value (the layers of one forward, :mod:`.extend_layout`); the paged slots and
K/V are read anew by every call.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ....kernels.attention import folded_sdpa
from ....kernels.paged_attention import attention_kernel, kernel_takes
from ._common import _long
from .extend_layout import _additive, _extend_layout

__all__ = ["decode_attention_cpu", "extend_attention_cpu"]

# Most float32 scores the explicit (logit_cap / sinks) path holds at once: 64 MiB.
_SCORE_BUDGET = 1 << 24
_NONE = torch.empty(0)  # the kernel's "not given" tensor


def _kernel(logit_cap: float, sinks, query_rows: int, requests: int, *tensors: torch.Tensor) -> Any:
    """The paged-attention kernel where it computes this call (``kernels/paged_attention.py``), else None."""
    if logit_cap > 0 or sinks is not None or not kernel_takes(query_rows, requests, *tensors):
        return None
    return attention_kernel()


def _check_supported(op: str, is_cross_attn: bool, sliding_window_size: int, encoder_lens) -> None:
    if is_cross_attn or encoder_lens is not None:
        raise NotImplementedError(
            f"{op}: cross-attention (is_cross_attn / encoder_lens) is not implemented by sage_plugin's pure-torch "
            "fallback"
        )
    if sliding_window_size > 0:
        raise NotImplementedError(
            f"{op}: sliding-window attention (sliding_window_size={sliding_window_size}) is not implemented by "
            "sage_plugin's pure-torch fallback"
        )


def _check_heads(op: str, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, out: torch.Tensor, sinks) -> None:
    if q.dim() != 3 or k_buf.dim() != 3 or v_buf.dim() != 3 or out.dim() != 3:
        raise RuntimeError(f"{op}: expected 3-d query, output and [slots, heads, dim] KV buffers")
    heads, kv_heads = q.shape[1], k_buf.shape[1]
    if kv_heads == 0 or heads % kv_heads or v_buf.shape[1] != kv_heads:
        raise RuntimeError(f"{op}: {heads} query heads are not a multiple of {kv_heads} KV heads")
    if q.shape[2] != k_buf.shape[2] or out.shape[1:] != (heads, v_buf.shape[2]):
        raise RuntimeError(
            f"{op}: head sizes of query {tuple(q.shape)}, K {tuple(k_buf.shape)}, "
            f"V {tuple(v_buf.shape)} and output {tuple(out.shape)} disagree"
        )
    if sinks is not None and sinks.numel() != heads:
        raise RuntimeError(f"{op}: sinks has {sinks.numel()} entries, expected one per query head ({heads})")


def _slot_table(op: str, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, width: int) -> torch.Tensor:
    """``[R, width]`` int64 (contiguous, a new tensor): ``req_to_token[rpi[r], :width]``; entries past a row's
    sequence may hold stale or garbage slots.

    The columns are cut before the rows are gathered: ``req_to_token`` is ``[max requests + 1, context length]``
    (8,192 columns for SmolLM2), so gathering whole rows copied ~30x the slots a call reads (one call per layer), and
    a copy that large is split over torch's intra-op threads, which on a 2-core machine waits for the other core
    whenever another process holds it (docs/design/sglang-internals.md, "CPU paths").
    """
    if width > req_to_token.shape[1]:
        raise RuntimeError(f"{op}: sequence length {width} exceeds req_to_token's {req_to_token.shape[1]} columns")
    return req_to_token[:, :width].index_select(0, _long(req_pool_indices)).to(torch.long)


def _cache_slots(
    op: str, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, ok: torch.Tensor | None, width: int
) -> torch.Tensor:
    """``[R * width]`` int64 cache slots, row-major: ``req_to_token[rpi[r], j]`` where ``ok[r, j]`` (``[R, width]``
    bool; None: every one), else slot 0.

    Entries outside ``ok`` are never used as indices (they may hold stale or garbage slots).
    """
    rows = _slot_table(op, req_to_token, req_pool_indices, width)
    return (rows if ok is None else rows.masked_fill_(~ok, 0)).reshape(-1)


def _load(buf: torch.Tensor, slots: torch.Tensor, rows: int, scale: float) -> torch.Tensor:
    """Cache rows ``buf[slots]`` (``slots`` ``[R * L]``) as a new float32 ``[R, L, H_kv, D]``, dequantised by
    ``scale``."""
    out = buf.index_select(0, slots).to(torch.float32)
    out = out.view(rows, -1, *buf.shape[1:])
    return out.mul_(scale) if scale != 1.0 else out


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """``q [R, H, Lq, D]``, ``k [R, Hkv, L, D]``, ``v [R, Hkv, L, Dv]``, ``visible [R, Lq, L]`` -> ``[R, H, Lq, Dv]``.

    Rows with no visible key (padding only) come out undefined (NaN).
    """
    rows, heads, lq, dim = q.shape
    kv_heads, lk = k.shape[1], k.shape[2]
    if logit_cap <= 0 and sinks is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=visible[:, None], scale=sm_scale, enable_gqa=heads != kv_heads
        )
    group = heads // kv_heads
    out = q.new_empty(rows, heads, lq, v.shape[-1])
    sink = None if sinks is None else sinks.to(torch.float32).reshape(1, heads, 1, 1)
    step = max(1, _SCORE_BUDGET // max(1, rows * heads * lk))
    for s in range(0, lq, step):
        n = min(lq, s + step) - s
        q_grouped = q[:, :, s : s + n].reshape(rows, kv_heads, group * n, dim)  # head h -> KV head h // group
        scores = (q_grouped @ k.transpose(-1, -2)).view(rows, heads, n, lk) * sm_scale
        if logit_cap > 0:
            scores = logit_cap * torch.tanh(scores / logit_cap)
        scores = scores.masked_fill(~visible[:, None, s : s + n], float("-inf"))
        top = scores.amax(-1, keepdim=True)
        if sink is not None:
            top = torch.maximum(top, sink)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        weights = torch.exp(scores - top)
        denom = weights.sum(-1, keepdim=True)
        if sink is not None:
            denom = denom + torch.exp(sink - top)
        mixed = (weights.view(rows, kv_heads, group * n, lk) @ v).view(rows, heads, n, -1)
        out[:, :, s : s + n] = mixed / denom
    return out


def _write_kv(op: str, cache: torch.Tensor, new: torch.Tensor, loc: torch.Tensor, scale: float) -> None:
    if scale != 1.0:
        raise NotImplementedError(
            f"{op}: writing K/V into a quantised cache (scale {scale}) is not implemented; SGLang writes such "
            "caches itself and passes key=value=None"
        )
    rows = new.reshape(-1, *cache.shape[1:])
    idx = _long(loc)
    if idx.numel() != rows.shape[0]:
        raise RuntimeError(f"{op}: loc has {idx.numel()} slots for {rows.shape[0]} new K/V rows")
    cache.index_copy_(0, idx, rows.to(cache.dtype))


def decode_attention_cpu(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key_scale: float,
    value_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """One query per row over its cached sequence; writes ``key``/``value`` at ``loc`` first (module docstring)."""
    op = "decode_attention_cpu"
    _check_supported(op, is_cross_attn, sliding_window_size, encoder_lens)
    _check_heads(op, query, k_cache, v_cache, output, sinks)
    if (key is None) != (value is None):
        raise RuntimeError(f"{op}: key and value must both be given or both be None")
    if key is not None and value is not None:
        _write_kv(op, k_cache, key, loc, key_scale)
        _write_kv(op, v_cache, value, loc, value_scale)
    seq = _long(seq_lens)
    rows = query.shape[0]
    if seq.numel() != rows or req_pool_indices.numel() != rows:
        raise RuntimeError(f"{op}: {rows} query rows but {seq.numel()} seq_lens / {req_pool_indices.numel()} indices")
    if rows == 0:
        return
    width = int(seq.max())
    kernel = _kernel(logit_cap, sinks, 1, rows, query, output, k_cache, v_cache)
    if kernel is not None:  # row r: query row r, its seq_lens[r] cached keys, all visible
        meta = torch.stack((torch.arange(rows), torch.ones_like(seq), seq, seq, torch.zeros_like(seq)), 1)
        slots = _slot_table(op, req_to_token, req_pool_indices, width)
        kernel.paged_attention(
            query, output, k_cache, v_cache, _NONE, _NONE, slots, meta, _NONE, 0, sm_scale, key_scale, value_scale
        )
        return
    explicit = logit_cap > 0 or sinks is not None
    visible = torch.arange(width) < seq[:, None] if rows > 1 or explicit else None  # [R, L]; one row sees all
    slots = _cache_slots(op, req_to_token, req_pool_indices, visible if rows > 1 else None, width)
    k = _load(k_cache, slots, rows, key_scale).transpose(1, 2)  # [R, Hkv, L, D]
    v = _load(v_cache, slots, rows, value_scale).transpose(1, 2)
    q = query.to(torch.float32)[:, :, None]  # [R, H, 1, D]
    if explicit:
        out = _attend(q, k, v, visible[:, None, :], sm_scale, logit_cap, sinks)
    else:
        out = folded_sdpa(q, k, v, None if visible is None else _additive(visible[:, None, :], 1), sm_scale)
    output.copy_(out[:, :, 0])


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    custom_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Prefill / extend / verify / draft-extend attention over prefix + new tokens (module docstring)."""
    op = "extend_attention_cpu"
    _check_supported(op, is_cross_attn, sliding_window_size, encoder_lens)
    _check_heads(op, q_extend, k_buffer, v_buffer, o_extend, sinks)
    if (k_extend is None) != (v_extend is None):
        raise RuntimeError(f"{op}: k_extend and v_extend must both be given or both be None")
    seq, ext, start = _long(seq_lens), _long(extend_seq_lens), _long(extend_start_loc)
    bs = seq.numel()
    if ext.numel() != bs or start.numel() != bs or req_pool_indices.numel() != bs:
        raise RuntimeError(f"{op}: seq_lens, extend_seq_lens, extend_start_loc and req_pool_indices differ in length")
    if bs == 0:
        return
    fresh = k_extend is not None and v_extend is not None
    lay = _extend_layout(op, seq, ext, start, custom_mask, is_causal, fresh)
    if lay is None:
        return
    lq, lk = lay.visible.shape[1], lay.visible.shape[2]
    news = (k_extend, v_extend) if fresh else ()
    kernel = _kernel(logit_cap, sinks, lq, bs, q_extend, o_extend, k_buffer, v_buffer, *news)
    if kernel is not None:
        k_new, v_new = (
            (t.reshape(-1, *b.shape[1:]) for t, b in zip(news, (k_buffer, v_buffer))) if fresh else (_NONE,) * 2
        )
        mode = 2 if custom_mask is not None else int(is_causal)
        slots = _slot_table(op, req_to_token, req_pool_indices, lk)
        kernel.paged_attention(
            q_extend, o_extend, k_buffer, v_buffer, k_new, v_new, slots, lay.meta, lay.visible if mode == 2 else _NONE,
            mode, sm_scale, key_scale, value_scale,
        )  # fmt: skip
        return
    q = q_extend.index_select(0, lay.q_flat).to(torch.float32).view(bs, lq, *q_extend.shape[1:]).transpose(1, 2)
    slots = _cache_slots(op, req_to_token, req_pool_indices, lay.cached, lk)
    k = _load(k_buffer, slots, bs, key_scale)  # [bs, L, Hkv, D]
    v = _load(v_buffer, slots, bs, value_scale)
    if k_extend is not None and v_extend is not None:  # the extend's own keys, from k_extend / v_extend
        dst, src = lay.fresh_keys
        k.view(-1, *k.shape[2:]).index_copy_(0, dst, k_extend.reshape(-1, *k.shape[2:]).index_select(0, src).float())
        v.view(-1, *v.shape[2:]).index_copy_(0, dst, v_extend.reshape(-1, *v.shape[2:]).index_select(0, src).float())
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # [bs, Hkv, L, D]
    if logit_cap > 0 or sinks is not None:
        out = _attend(q, k, v, lay.visible, sm_scale, logit_cap, sinks)  # [bs, H, Lq, Dv]
    else:
        out = folded_sdpa(q, k, v, lay.mask(q.shape[1] // k.shape[1]), sm_scale)
    rows = out.transpose(1, 2).reshape(bs * lq, *out.shape[1:2], out.shape[-1])  # [bs * Lq, H, Dv]
    o_extend.index_copy_(0, lay.out_rows, rows.index_select(0, lay.valid_flat).to(o_extend.dtype))
