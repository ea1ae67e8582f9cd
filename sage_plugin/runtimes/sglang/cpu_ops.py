"""Pure-PyTorch CPU implementations of the ``sgl_kernel`` speculative-decoding ops SGLang 0.5.23 calls on CPU.

The PyPI ``sgl_kernel`` is a CUDA build and registers none of the ``torch.ops.sgl_kernel.*_cpu`` ops that
SGLang's CPU speculative path needs (``SGLANG_ON_CPU.md``).  :func:`register_cpu_ops` defines them with
``torch.library`` (only where nobody defined them yet) and binds the functions below as their CPU kernels.
SGLang's Python wrappers look the ops up in ``torch.ops.sgl_kernel`` at call time, so registering is enough.
This module imports only torch and the standard library (never sglang).

Conventions: ``bs`` requests, ``N = draft_token_num`` tree nodes per request (node 0 = the root, i.e. the
last verified token), ``page_size == 1``.  Index inputs may be int32 or int64 (the upstream kernels differ
between versions); outputs are written in the dtype of the buffer the caller passes.  ``req_to_token`` is
addressed like the C++ kernels do, as ``req_to_token.flatten()[row * pool_len + col]``.  Ops mutate their
``(a!)`` arguments in place and return nothing, except ``build_draft_decode_metadata_cpu``.

Ops (semantics, shapes):

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
* ``build_tree_kernel_efficient_cpu(parent_list [bs, topk*(depth-1)+1], selected_index [bs, N-1],
  verified_seq_len [bs], tree_mask!, positions! [bs*N], retrive_index! [bs,N], retrive_next_token! [bs,N],
  retrive_next_sibling! [bs,N], topk, depth, N, tree_mask_mode)``: node ``i >= 1`` is EAGLE candidate
  ``selected_index[i-1]``, a child of the root if that id ``// topk == 0``, else of the node whose id equals
  ``parent_list[id // topk]``.  Writes ``retrive_index = b*N + i``, first-child / next-sibling links in
  increasing node order, ``positions = seq_len + depth`` and mask rows (root, self, ancestors) in mode
  0 FULL_MASK, 1 QLEN_ONLY (CPU default) or 2 QLEN_ONLY_BITPACKING (details on the function).
* ``verify_tree_greedy_cpu(predicts! [bs*N] i32, accept_index! [bs, S] i32, accept_token_num! [bs] i32,
  candidates [bs,N], retrive_index, retrive_next_token, retrive_next_sibling, target_predict [bs*N])``:
  from the root, for up to ``S - 1`` levels, accept the first child in sibling order whose candidate equals
  ``target_predict[last accepted]``.  Writes ``accept_index[b, :tau+1]`` (global ids), ``accept_token_num =
  tau`` and ``predicts[g] = target_predict[g]`` on the accepted path (the last one is the bonus token).
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
* ``reconstruct_indices_from_tree_mask_cpu(tree_mask [bs*N*N] bool, verified_seq_len [bs], positions!,
  retrive_index!, retrive_next_token!, retrive_next_sibling!, bs, N)`` (NGRAM): from a QLEN mask whose row i
  marks i's ancestors: ``positions = seq_len + #strict ancestors``, ``retrive_index = b*N + i``,
  ``next_token[i] = min{k > i : mask[k, i]}``, ``next_sibling[i] = min{k > i : parent[k] == parent[i]}``
  with ``parent[i] = max{j < i : mask[i, j]}`` (-1 for the root); every entry is written.

``tree_speculative_sampling_target_only`` is not provided: in 0.5.23 CPU verification always takes the
greedy path (``eagle_utils._verify_uses_greedy`` is True on CPU), so no CPU sampling op is ever called.

Worked example (one request, ``topk = 2``, ``depth = 3`` draft steps, ``N = 5``, committed length 7).  The
EAGLE draft loop scored the root's children (flat ids 0, 1), expanded beams 0 and 1 into ids 2..5, then
beams 2, 3 into ids 6..9, and kept the top ``N - 1`` ids, sorted::

        root(0) "The"
        ├── 1 "cat"   id 0   (0 // 2 = 0: the root's child)
        │    └── 3 "sat"   id 2   (2 // 2 = 1: parent_list[1] = 0 = node 1's id)
        │         └── 4 "on"   id 6   (6 // 2 = 3: parent_list[3] = 2 = node 3's id)
        └── 2 "dog"   id 1

>>> import torch
>>> parent_list, selected = torch.tensor([[-1, 0, 1, 2, 3]]), torch.tensor([[0, 1, 2, 6]])
>>> mask = torch.ones(25, dtype=torch.bool)
>>> pos = torch.empty(5, dtype=torch.long)
>>> idx, nxt, sib = torch.full((3, 1, 5), -1, dtype=torch.long)
>>> build_tree_kernel_efficient_cpu(parent_list, selected, torch.tensor([7]), mask, pos, idx, nxt, sib, 2, 3, 5, 1)
>>> pos.tolist(), idx.tolist(), nxt.tolist(), sib.tolist()
([7, 8, 8, 9, 10], [[0, 1, 2, 3, 4]], [[1, 3, -1, 4, -1]], [[-1, 2, -1, -1, -1]])
>>> mask.view(5, 5).int().tolist()
[[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]

Greedy verify with tokens The=10 cat=11 dog=12 sat=13 on=14 and the target's argmax after each node
cat, sat, ran=20, in=21, the=22: "cat" then "sat" match, "on" != "in", so two drafts are accepted and "in"
(``predicts[3]``) is the bonus token:

>>> predicts, accept = torch.full((5,), -1, dtype=torch.int32), torch.full((1, 4), -1, dtype=torch.int32)
>>> num = torch.empty(1, dtype=torch.int32)
>>> cand, target = torch.tensor([[10, 11, 12, 13, 14]]), torch.tensor([11, 13, 20, 21, 22])
>>> verify_tree_greedy_cpu(predicts, accept, num, cand, idx, nxt, sib, target)
>>> predicts.tolist(), accept.tolist(), num.tolist()
([11, 13, -1, 21, -1], [[0, 1, 3, -1]], [2])
"""

from __future__ import annotations

import ctypes
from typing import Callable

import torch

__all__ = [
    "CPU_OP_NAMES",
    "FULL_MASK",
    "QLEN_ONLY",
    "QLEN_ONLY_BITPACKING",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask_cpu",
    "register_cpu_ops",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]

# TreeMaskMode values (sglang.srt.speculative.eagle_utils.TreeMaskMode).
FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


def _long(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).to(torch.long)


def _flat_out(t: torch.Tensor, name: str) -> torch.Tensor:
    """A flat view that writes through to ``t`` (the C++ kernels require contiguous outputs too)."""
    if not t.is_contiguous():
        raise RuntimeError(f"{name} must be contiguous")
    return t.view(-1)


def _segments(start: torch.Tensor, end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged ranges ``[start[b], end[b])`` flattened: ``(request id [T], column [T])``."""
    lens = (end - start).clamp(min=0)
    rows = torch.repeat_interleave(torch.arange(lens.numel()), lens)
    first = torch.cumsum(lens, 0) - lens  # exclusive running sum: where each request's run begins
    cols = torch.arange(rows.numel()) - first[rows] + start[rows]
    return rows, cols


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
    ``2 * num_layers`` buffers; each copy is one vectorised gather + scatter.
    """
    if tgt_loc.numel() != src_loc.numel():
        raise RuntimeError("tgt_loc and src_loc must have the same length")
    if data_ptrs.numel() != strides.numel():
        raise RuntimeError("data_ptrs and strides must have the same length")
    if tgt_loc.numel() == 0 or data_ptrs.numel() == 0:
        return
    tgt, src = _long(tgt_loc), _long(src_loc)
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


# --------------------------------------------------------------------------------------------- tree build


def _link_children(parent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First child and next sibling (increasing node order) from ``parent [bs, N]`` (< 0: unlinked).

    Returns ``(first_child, next_sibling)`` ``[bs, N]`` int64 with -1 where there is none.
    """
    bs, n = parent.shape
    node = torch.arange(n)
    linked = parent >= 0
    # child_of[b, p, c]: c is linked under p.  First child = smallest such c.
    child_of = (parent[:, None, :] == node[None, :, None]) & linked[:, None, :]
    first_child = torch.where(child_of, node, n).min(-1).values
    # later_sib[b, i, j]: j > i shares i's parent.  Next sibling = smallest such j.
    later_sib = (parent[:, :, None] == parent[:, None, :]) & linked[:, :, None] & linked[:, None, :]
    later_sib &= node[None, None, :] > node[None, :, None]
    next_sibling = torch.where(later_sib, node, n).min(-1).values
    none = torch.tensor(-1)
    return torch.where(first_child == n, none, first_child), torch.where(next_sibling == n, none, next_sibling)


def _ancestor_rows(parent: torch.Tensor) -> torch.Tensor:
    """``[bs, N, N]`` bool: row i is True on i and each ancestor reachable through ``parent`` (>= 0).

    Column 0 (the root) is always True, matching the kernels; a walk stops at the root or at an
    unresolved parent (< 0).  One vectorised step per tree level.
    """
    bs, n = parent.shape
    rows = torch.eye(n, dtype=torch.bool).repeat(bs, 1, 1)
    rows[:, :, 0] = True
    hop = parent.clone()
    hop[:, 0] = -1
    b_idx = torch.arange(bs)[:, None].expand(bs, n)
    i_idx = torch.arange(n)[None, :].expand(bs, n)
    for _ in range(n):  # at most N - 1 hops; exits after (tree depth) steps
        live = hop > 0  # hop 0 = the root, already set
        if not bool(live.any()):
            break
        rows[b_idx[live], i_idx[live], hop[live]] = True
        hop = torch.where(live, parent.gather(1, hop.clamp(min=0)), torch.full_like(hop, -1))
    return rows


def _tree_parents(parent_list: torch.Tensor, selected_index: torch.Tensor, topk: int, n: int) -> torch.Tensor:
    """Parent node of every node from EAGLE's ``(parent_list, selected_index)``: ``[bs, N]`` int64.

    -1 for the root, -2 where the parent's candidate id is not among the selected ones.
    """
    bs = selected_index.shape[0]
    sel = selected_index.reshape(bs, -1)[:, : n - 1].to(torch.long)  # [bs, N-1]
    plist = parent_list.reshape(bs, -1).to(torch.long)
    group = torch.div(sel, topk, rounding_mode="floor")  # 0: a child of the root
    in_range = (group >= 1) & (group < plist.shape[1])
    want = plist.gather(1, torch.where(in_range, group, 0)) if plist.shape[1] else torch.zeros_like(sel)
    hit = sel[:, None, :] == want[:, :, None]  # [bs, i-1, j]: candidate j is node i's parent's id
    found = hit.any(-1)
    par = torch.where(found, hit.to(torch.int8).argmax(-1) + 1, torch.full_like(sel, -2))  # first match wins
    par = torch.where(group == 0, torch.zeros_like(par), torch.where(in_range, par, torch.full_like(par, -2)))
    return torch.cat([torch.full((bs, 1), -1, dtype=torch.long), par], 1)


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """EAGLE draft tree -> verify mask, positions and first-child / next-sibling lists.

    Links: children are linked in increasing node order (the kernels head-insert from ``i = N-1`` down);
    ``retrive_next_token`` / ``retrive_next_sibling`` are written only where a child / later sibling exists,
    the rest keeps the caller's -1 fill.  Mask rows are True on column 0 (root), the node and its ancestors,
    False on the other tree columns:

    * 0 FULL_MASK: per request ``N`` rows of ``seq_len + N`` columns, flattened and concatenated over
      requests; only the ``N`` tree columns are written (the caller pre-fills the prefix columns True).
    * 1 QLEN_ONLY: ``[bs, N, N]`` flattened (what SGLang's CPU attention consumes).
    * 2 QLEN_ONLY_BITPACKING: ``bs*N`` little-endian integers of 1/2/4 bytes (the buffer's dtype), bit j =
      column j.

    A parent id missing from ``selected_index`` (never the case in EAGLE trees, whose selection keeps every
    ancestor) leaves the node unlinked and stops its ancestor walk, as in the Triton reference.  The walk is
    not cut at ``depth`` hops (the C++ CPU kernel's behaviour; the Triton kernel cuts it, which changes
    nothing on EAGLE trees, whose nodes are at most ``depth`` deep).  Vectorised over the batch: ``[bs, N,
    N]`` pairwise comparisons plus one step per tree level.
    """
    n = draft_token_num
    bs = verified_seq_len.numel()
    seq = _long(verified_seq_len)
    parent = _tree_parents(parent_list, selected_index, topk, n) if n > 1 else torch.full((bs, 1), -1)
    first_child, next_sibling = _link_children(parent)
    rows = _ancestor_rows(parent)  # [bs, N, N]

    node = torch.arange(n)
    ri = _flat_out(retrive_index, "retrive_index").view(bs, n)
    ri.copy_(torch.arange(bs)[:, None] * n + node)
    has_child, has_sib = first_child >= 0, next_sibling >= 0
    rnt = _flat_out(retrive_next_token, "retrive_next_token").view(bs, n)
    rns = _flat_out(retrive_next_sibling, "retrive_next_sibling").view(bs, n)
    rnt[has_child] = first_child[has_child].to(rnt.dtype)
    rns[has_sib] = next_sibling[has_sib].to(rns.dtype)
    depth_of = rows[:, :, 1:].sum(-1)  # set columns past the root = self + ancestors below the root
    _flat_out(positions, "positions")[: bs * n] = (seq[:, None] + depth_of).reshape(-1).to(positions.dtype)

    mask = _flat_out(tree_mask, "tree_mask")
    if tree_mask_mode == QLEN_ONLY:
        mask[: bs * n * n] = rows.reshape(-1)
    elif tree_mask_mode == FULL_MASK:
        # request b's block starts after b*N*N tree cells and N rows of every earlier request's prefix
        start = torch.arange(bs) * n * n + (torch.cumsum(seq, 0) - seq) * n  # [bs]
        cell = start[:, None, None] + node[None, :, None] * (seq[:, None, None] + n) + seq[:, None, None] + node
        mask[cell.reshape(-1)] = rows.reshape(-1)
    elif tree_mask_mode == QLEN_ONLY_BITPACKING:
        item = tree_mask.element_size()
        if item * 8 < n:
            raise RuntimeError(f"QLEN_ONLY_BITPACKING: {item}-byte items cannot hold {n} columns")
        values = (rows.to(torch.long) << node).sum(-1)  # [bs, N] row bit sets, bit j = column j
        shifts = torch.arange(item) * 8
        packed = ((values[..., None] >> shifts) & 0xFF).to(torch.uint8)  # little-endian bytes
        mask.view(torch.uint8)[: bs * n * item] = packed.reshape(-1)
    else:
        raise RuntimeError(f"unknown tree_mask_mode {tree_mask_mode}")


# --------------------------------------------------------------------------------------------- verify


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification: the longest root path whose drafts equal the target's argmax.

    Entries off the accepted path are left as the caller filled them (SGLang: -1).  Vectorised: one step
    per sibling-list position finds every node's matching child, then one step per level walks them.
    """
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    cand = candidates.to(torch.long)
    ri = retrive_index.reshape(bs, n).to(torch.long)
    nt = retrive_next_token.reshape(bs, n).to(torch.long)
    ns = retrive_next_sibling.reshape(bs, n).to(torch.long)
    target = _long(target_predict)
    want = target[ri]  # [bs, N]: the target's token after each node

    # match[b, p]: p's first child, in sibling order, whose draft equals want[b, p] (-1: none).
    # One vectorised step per sibling-list position for all (b, p) at once.
    match = torch.full((bs, n), -1, dtype=torch.long)
    cur = nt.clone()
    for _ in range(n):
        live = cur >= 0
        if not bool(live.any()):
            break
        c = cur.clamp(min=0)
        hit = live & (cand.gather(1, c) == want)
        match = torch.where(hit, c, match)
        cur = torch.where(live & ~hit, ns.gather(1, c), torch.full_like(cur, -1))

    # Walk the matched children from the root, one level per step, all requests at once.
    b = torch.arange(bs)
    node = torch.zeros(bs, dtype=torch.long)
    live = torch.ones(bs, dtype=torch.bool)
    acc = torch.full((bs, steps), -1, dtype=torch.long)
    acc[:, 0] = ri[:, 0]
    for j in range(1, steps):
        child = match[b, node]
        live &= child >= 0
        if not bool(live.any()):
            break
        node = torch.where(live, child, node)
        acc[:, j] = torch.where(live, ri[b, node], acc[:, j])

    taken = acc >= 0
    ai = accept_index.view(bs, steps)
    ai[taken] = acc[taken].to(ai.dtype)
    _flat_out(accept_token_num, "accept_token_num")[:bs] = (taken.sum(1) - 1).to(accept_token_num.dtype)
    path = acc[taken]
    _flat_out(predicts, "predicts")[path] = target[path].to(predicts.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """``bonus_tokens[b] = accept_tokens.flat[accept_stride*b + accept_lens[b] - 1]``."""
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


def reconstruct_indices_from_tree_mask_cpu(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM: positions and first-child / next-sibling lists from a ``[bs, N, N]`` ancestor mask."""
    bs, n = batch_size, draft_token_num
    if tree_mask.numel() != bs * n * n:
        raise RuntimeError(f"tree_mask has {tree_mask.numel()} entries, expected bs*N*N={bs * n * n}")
    node = torch.arange(n)
    strict = tree_mask.reshape(bs, n, n).to(torch.bool) & (node[None, :] < node[:, None])  # [bs, i, j<i]
    parent = torch.where(strict, node, -1).max(-1).values  # nearest ancestor, -1 for roots
    first_child = torch.where(strict, node[:, None], n).min(1).values  # smallest descendant k of each j
    first_child = torch.where(first_child == n, -1, first_child)
    same = (parent[:, :, None] == parent[:, None, :]) & (node[None, :] > node[:, None]) & (parent[:, :, None] >= 0)
    next_sibling = torch.where(same, node, n).min(-1).values
    next_sibling = torch.where(next_sibling == n, -1, next_sibling)
    seq = _long(verified_seq_len)
    _flat_out(positions, "positions")[: bs * n] = (seq[:, None] + strict.sum(-1)).reshape(-1).to(positions.dtype)
    _flat_out(retrive_index, "retrive_index")[: bs * n] = torch.arange(bs * n).to(retrive_index.dtype)
    _flat_out(retrive_next_token, "retrive_next_token")[: bs * n] = first_child.reshape(-1).to(retrive_next_token.dtype)
    _flat_out(retrive_next_sibling, "retrive_next_sibling")[: bs * n] = next_sibling.reshape(-1).to(
        retrive_next_sibling.dtype
    )


# --------------------------------------------------------------------------------------------- registration

# name -> (schema after the name, implementation, fake or None for "mutates only, returns nothing").
# Argument names follow sgl-kernel's C++ (``retrive_*`` spelling included) so keyword calls line up.
_OPS: dict[str, tuple[str, Callable, Callable | None]] = {
    "copy_all_layer_kv_cache_cpu": (
        "(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()",
        copy_all_layer_kv_cache_cpu,
        None,
    ),
    "assign_req_to_token_pool_cpu": (
        "(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, Tensor end_offset, "
        "Tensor out_cache_loc, int pool_len, int? bs_upper=None) -> ()",
        assign_req_to_token_pool_cpu,
        None,
    ),
    "assign_draft_cache_locs_contiguous_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, Tensor(a!) out_cache_loc, int pool_len, "
        "int topk, int num_steps) -> ()",
        assign_draft_cache_locs_contiguous_cpu,
        None,
    ),
    "assign_extend_cache_locs_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, Tensor end_offset, "
        "Tensor(a!) out_cache_loc, int pool_len) -> ()",
        assign_extend_cache_locs_cpu,
        None,
    ),
    "build_draft_decode_metadata_cpu": (
        "(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, int topk, int num_steps, int pool_len) "
        "-> Tensor",
        build_draft_decode_metadata_cpu,
        _build_draft_decode_metadata_fake,
    ),
    "build_tree_kernel_efficient_cpu": (
        "(Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, Tensor(a!) tree_mask, "
        "Tensor(b!) positions, Tensor(c!) retrive_index, Tensor(d!) retrive_next_token, "
        "Tensor(e!) retrive_next_sibling, int topk, int depth, int draft_token_num, int tree_mask_mode) -> ()",
        build_tree_kernel_efficient_cpu,
        None,
    ),
    "verify_tree_greedy_cpu": (
        "(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, Tensor candidates, "
        "Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, Tensor target_predict) -> ()",
        verify_tree_greedy_cpu,
        None,
    ),
    "fill_bonus_tokens_cpu": (
        "(Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, int accept_stride) -> ()",
        fill_bonus_tokens_cpu,
        None,
    ),
    "fill_accept_out_cache_loc_cpu": (
        "(Tensor accept_index, Tensor out_cache_loc, Tensor(a!) accept_out_cache_loc, int? size=None) -> ()",
        fill_accept_out_cache_loc_cpu,
        None,
    ),
    "rotate_input_ids_cpu": (
        "(Tensor(a!) input_ids, Tensor extend_start_loc, Tensor extend_seq_lens, Tensor topk_index, "
        "Tensor? select_index=None) -> ()",
        rotate_input_ids_cpu,
        None,
    ),
    "reconstruct_indices_from_tree_mask_cpu": (
        "(Tensor tree_mask, Tensor verified_seq_len, Tensor(a!) positions, Tensor(b!) retrive_index, "
        "Tensor(c!) retrive_next_token, Tensor(d!) retrive_next_sibling, int batch_size, int draft_token_num) -> ()",
        reconstruct_indices_from_tree_mask_cpu,
        None,
    ),
}

CPU_OP_NAMES: tuple[str, ...] = tuple(_OPS)

# torch.library.Library objects must stay alive: their registrations are dropped when they are collected.
_LIBRARIES: list[torch.library.Library] = []
_OURS: dict[str, list[str]] = {}


def _no_op_fake(*args, **kwargs) -> None:
    """Fake kernel of an op that only mutates its arguments: nothing to allocate."""


def _op_exists(namespace: str, name: str) -> bool:
    return hasattr(getattr(torch.ops, namespace), name)


def _has_cpu_kernel(qualname: str) -> bool:
    try:
        has = torch._C._dispatch_has_kernel_for_dispatch_key
    except AttributeError:  # private API gone: assume the existing op works rather than override it
        return True
    return any(has(qualname, key) for key in ("CPU", "CompositeExplicitAutograd", "CompositeImplicitAutograd"))


def register_cpu_ops(namespace: str = "sgl_kernel") -> list[str]:
    """Define and implement the missing CPU ops in ``torch.ops.<namespace>``; safe to call repeatedly.

    An op is left alone when its schema already exists with a CPU kernel (a real CPU ``sgl_kernel`` build,
    or an earlier call here).  A schema that exists without a CPU kernel gets this module's kernel.  Every
    op this module defines also gets a fake (meta) kernel so ``torch.compile`` can trace calls to it
    (``copy_all_layer_kv_cache_cpu`` writes through raw addresses its schema cannot declare: keep it out of
    compiled regions, as SGLang does).

    Call it after ``sgl_kernel`` (if importable) has been imported: a real CPU build then keeps its own
    kernels, whereas loading such a build after this call would collide with the schemas defined here.

    Returns:
        The op names in ``namespace`` backed by this module's kernels (from this or earlier calls), in
        :data:`CPU_OP_NAMES` order; the same list on every call.
    """
    ours = _OURS.setdefault(namespace, [])
    lib: torch.library.Library | None = None
    for name, (schema, impl, fake) in _OPS.items():
        if name in ours:
            continue
        qualname = f"{namespace}::{name}"
        defined_here = False
        if _op_exists(namespace, name):
            if _has_cpu_kernel(qualname):
                continue  # someone else's kernel (or a real CPU build): never override it
        else:
            lib = lib or torch.library.Library(namespace, "FRAGMENT")
            lib.define(name + schema)
            defined_here = True
        lib = lib or torch.library.Library(namespace, "FRAGMENT")
        lib.impl(name, impl, "CPU")
        if defined_here:
            torch.library.register_fake(qualname, fake or _no_op_fake, lib=lib)
        ours.append(name)
    if lib is not None:
        _LIBRARIES.append(lib)
    order = {name: i for i, name in enumerate(CPU_OP_NAMES)}
    ours.sort(key=order.__getitem__)
    return list(ours)
