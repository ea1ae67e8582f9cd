"""KV-cache and cache-location ops: KV copy, ``req_to_token`` writes/gathers, bonus, accept, rotate.

Conventions are the package's (:mod:`sage_plugin.runtimes.sglang.cpu_ops`).  Semantics, shapes:

* ``copy_all_layer_kv_cache_cpu(data_ptrs [2L] u64, strides [2L] i64, tgt_loc [n], src_loc [n])``:
  for every KV buffer (base address ``data_ptrs[b]``, ``strides[b]`` bytes per token slot)
  ``buf_b[tgt_loc[i]] = buf_b[src_loc[i]]``, all sources read before any target is written (overlap-safe).
  The buffers are reached through zero-copy ``uint8`` views of the raw addresses (``ctypes`` +
  ``torch.frombuffer``); no registry of KV tensors is needed.  Targets must be distinct.
* ``assign_req_to_token_pool_cpu(req_pool_indices [bs], req_to_token!, start [bs], end [bs],
  out_cache_loc [sum(end-start)], pool_len, bs_upper=None)``:
  ``req_to_token[rpi[b], start[b]:end[b]] = out_cache_loc[off_b : off_b + end[b]-start[b]]``, ``off_b`` the
  exclusive running sum of the lengths.  ``bs_upper`` (passed by some versions) is ignored.
* ``assign_draft_cache_locs_contiguous_cpu(req_pool_indices [bs], req_to_token, seq_lens [bs],
  out_cache_loc! [bs*topk*num_steps], pool_len, topk, num_steps)``:
  ``out_cache_loc[b*topk*ns : (b+1)*topk*ns] = req_to_token[rpi[b], seq_lens[b] : seq_lens[b] + topk*ns]``
  (per request laid out ``(topk, num_steps)``).
* ``assign_extend_cache_locs_cpu(req_pool_indices [bs], req_to_token, start [bs], end [bs],
  out_cache_loc! [>= sum(end-start)], pool_len)``: ``out_cache_loc`` starts with the concatenation over
  ``b`` of ``req_to_token[rpi[b], start[b]:end[b]]``; entries past the total are left alone.
* ``build_draft_decode_metadata_cpu(req_to_token, req_pool_indices [bs], seq_lens [bs], topk, num_steps,
  pool_len) -> [bs*topk, pool_len]`` (dtype of ``req_to_token``): row ``b*topk + k`` is the prefix
  ``req_to_token[rpi[b], :s]`` (``s = seq_lens[b]``) then branch k's draft slots
  ``req_to_token[rpi[b], s + k*num_steps : s + (k+1)*num_steps]``; columns past ``s + num_steps`` hold the
  source row's own values (the C++ kernel leaves them uninitialised; nobody reads them).
* ``fill_bonus_tokens_cpu(accept_tokens [bs, stride], accept_lens [bs], bonus_tokens! [bs], accept_stride)``:
  ``bonus_tokens[b] = accept_tokens.flatten()[accept_stride*b + accept_lens[b] - 1]``.
* ``fill_accept_out_cache_loc_cpu(accept_index [bs, S], out_cache_loc, accept_out_cache_loc!, size=None)``:
  stable compaction over the first ``size`` (default all) entries of ``accept_index.flatten()``:
  ``accept_out_cache_loc[:n] = out_cache_loc[a[a != -1]]``; the tail is left alone.  ``size`` is passed by
  some versions only.
* ``rotate_input_ids_cpu(input_ids! [T] , extend_start_loc [bs], extend_seq_lens [bs], topk_index [bs],
  select_index=None)`` (multi-layer EAGLE): each request's segment shifts left by one
  (``ids[s:s+l-1] = ids[s+1:s+l]``) and ``topk_index[b]`` is written at ``select_index[b]`` if given, else at
  ``s + l - 1`` (requests with ``l == 0`` are untouched).
"""

from __future__ import annotations

import ctypes

import torch

from ._common import _flat_out, _long, _segments, native

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
]


# --------------------------------------------------------------------------------------------- KV cache


def _raw_rows(address: int, rows: int, row_bytes: int) -> torch.Tensor:
    """Zero-copy ``uint8 [rows, row_bytes]`` view of memory the caller owns (a live KV buffer)."""
    raw = (ctypes.c_uint8 * (rows * row_bytes)).from_address(address)
    return torch.frombuffer(raw, dtype=torch.uint8).view(rows, row_bytes)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """``buf[tgt_loc] = buf[src_loc]`` for every KV buffer given by base address and row size in bytes.

    ``MHATokenToKVPool`` passes ``data_ptrs = [k.data_ptr() for k in k_buffer + v_buffer]`` (uint64) and
    ``strides = [prod(shape[1:]) * itemsize]`` (int64), i.e. one token slot per row.  A Python loop over the
    ``2 * num_layers`` buffers; each copy is one vectorised gather + scatter.  Pairs with ``tgt == src`` are dropped
    first (a row copied onto itself): the verify's accepted-path compaction passes every request's path, which after a
    speculation-off step or a first-child path is already in place (copying it costs a loop over every buffer).
    """
    if tgt_loc.numel() != src_loc.numel():
        raise RuntimeError("tgt_loc and src_loc must have the same length")
    if data_ptrs.numel() != strides.numel():
        raise RuntimeError("data_ptrs and strides must have the same length")
    if tgt_loc.numel() == 0 or data_ptrs.numel() == 0:
        return
    tgt, src = _long(tgt_loc), _long(src_loc)
    moved = tgt != src
    if not bool(moved.all()):
        tgt, src = tgt[moved], src[moved]
        if tgt.numel() == 0:
            return
    lo = int(torch.minimum(tgt.min(), src.min()))
    if lo < 0:
        raise RuntimeError("copy_all_layer_kv_cache_cpu: negative slot index")
    rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        view = _raw_rows(int(address), rows, int(row_bytes))
        view[tgt] = view[src]  # the right side is gathered into a fresh tensor first: overlap-safe


# --------------------------------------------------------------------------------------------- req_to_token


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    bs_upper: int | None = None,
) -> None:
    """Write each request's new KV slots into its ``req_to_token`` row (see the module docstring)."""
    if (loops := native()) is not None:
        loops.assign_req_to_token_pool(
            req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
        )
        return
    rows, cols = _segments(_long(start_offset), _long(end_offset))
    flat = _flat_out(req_to_token, "req_to_token")
    dst = _long(req_pool_indices)[rows] * pool_len + cols
    flat[dst] = out_cache_loc.reshape(-1)[: dst.numel()].to(flat.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Gather ``topk * num_steps`` draft slots per request, starting at ``seq_lens`` (module docstring)."""
    if (loops := native()) is not None:
        loops.assign_draft_cache_locs_contiguous(
            req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_steps
        )
        return
    bs, width = req_pool_indices.numel(), topk * num_steps
    if out_cache_loc.numel() != bs * width:
        raise RuntimeError(
            f"out_cache_loc has {out_cache_loc.numel()} entries, expected bs*topk*num_steps={bs * width}"
        )
    src = (_long(req_pool_indices) * pool_len + _long(seq_lens))[:, None] + torch.arange(width)  # [bs, width]
    out = _flat_out(out_cache_loc, "out_cache_loc")
    out.copy_(req_to_token.reshape(-1)[src.reshape(-1)])


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Concatenate ``req_to_token[rpi[b], start[b]:end[b]]`` over requests into ``out_cache_loc``."""
    if (loops := native()) is not None:
        loops.assign_extend_cache_locs(
            req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
        )
        return
    rows, cols = _segments(_long(start_offset), _long(end_offset))
    out = _flat_out(out_cache_loc, "out_cache_loc")
    src = _long(req_pool_indices)[rows] * pool_len + cols
    out[: src.numel()] = req_to_token.reshape(-1)[src].to(out.dtype)


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """Per-branch ``req_to_token`` rows ``[bs*topk, pool_len]`` for the multi-step draft decode."""
    if (loops := native()) is not None:
        return loops.build_draft_decode_metadata(req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len)
    bs = req_pool_indices.numel()
    flat = req_to_token.reshape(-1)
    col = torch.arange(pool_len)  # [P]
    seq = _long(seq_lens)[:, None, None]  # [bs, 1, 1]
    branch = torch.arange(topk)[None, :, None]  # [1, topk, 1]
    in_draft = (col >= seq) & (col < seq + num_steps)  # [bs, 1, P]
    src_col = torch.where(in_draft, col + branch * num_steps, col).clamp(max=max(pool_len - 1, 0))
    src = _long(req_pool_indices)[:, None, None] * pool_len + src_col  # [bs, topk, P]
    return flat[src.clamp(max=max(flat.numel() - 1, 0))].reshape(bs * topk, pool_len)


def _build_draft_decode_metadata_fake(req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len):
    return req_to_token.new_empty((req_pool_indices.shape[0] * topk, pool_len))


# --------------------------------------------------------------------------------------------- accept / bonus


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """``bonus_tokens[b] = accept_tokens.flat[accept_stride*b + accept_lens[b] - 1]``."""
    if (loops := native()) is not None:
        loops.fill_bonus_tokens(accept_tokens, accept_lens, bonus_tokens, accept_stride)
        return
    bs = accept_lens.numel()
    src = torch.arange(bs) * accept_stride + _long(accept_lens) - 1
    _flat_out(bonus_tokens, "bonus_tokens")[:bs] = accept_tokens.reshape(-1)[src].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
    size: int | None = None,
) -> None:
    """Stable compaction of the accepted nodes' KV slots to the front of ``accept_out_cache_loc``."""
    if (loops := native()) is not None:
        loops.fill_accept_out_cache_loc(accept_index, out_cache_loc, accept_out_cache_loc, size)
        return
    flat = _long(accept_index)
    if size is not None:
        flat = flat[: max(int(size), 0)]
    slots = out_cache_loc.reshape(-1)[flat[flat != -1]]
    _flat_out(accept_out_cache_loc, "accept_out_cache_loc")[: slots.numel()] = slots.to(accept_out_cache_loc.dtype)


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: torch.Tensor | None = None,
) -> None:
    """Shift each request's extend segment left by one and place the new draft token (module docstring)."""
    ids = _flat_out(input_ids, "input_ids")
    start, lens = _long(extend_start_loc), _long(extend_seq_lens)
    rows, cols = _segments(start, start + (lens - 1).clamp(min=0))  # every slot but each segment's last
    ids[cols] = ids[cols + 1]  # right side gathered first, so the overlapping shift is safe
    has = lens > 0
    dst = _long(select_index) if select_index is not None else start + lens - 1
    ids[dst[has]] = _long(topk_index)[has].to(ids.dtype)
