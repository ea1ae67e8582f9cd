"""Tree ops: EAGLE tree build (mask, positions, retrieve lists), greedy tree verify, NGRAM tree rebuild.

Conventions are the package's (:mod:`sage_plugin.runtimes.sglang.cpu_ops`).  Semantics, shapes:

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

import torch

from ._common import _flat_out, _long, _write_accepted_paths, native

__all__ = [
    "FULL_MASK",
    "QLEN_ONLY",
    "QLEN_ONLY_BITPACKING",
    "build_tree_kernel_efficient_cpu",
    "reconstruct_indices_from_tree_mask_cpu",
    "verify_tree_greedy_cpu",
]

# TreeMaskMode values (sglang.srt.speculative.eagle_utils.TreeMaskMode).
FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


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
    N]`` pairwise comparisons plus one step per tree level.  Where the ``spec_cache`` library is built, its loop over
    the requests computes the same (:func:`._common.native`).
    """
    if (loops := native()) is not None:
        loops.build_tree_kernel_efficient(
            parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index, retrive_next_token,
            retrive_next_sibling, topk, depth, draft_token_num, tree_mask_mode,
        )  # fmt: skip
        return
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
    per sibling-list position finds every node's matching child, then one step per level walks them.  Where the
    ``spec_cache`` library is built, its loop over the requests computes the same (:func:`._common.native`).
    """
    if (loops := native()) is not None:
        loops.verify_tree_greedy(
            predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
            retrive_next_sibling, target_predict,
        )  # fmt: skip
        return
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

    taken = _write_accepted_paths(accept_index, accept_token_num, acc)
    path = acc[taken]
    _flat_out(predicts, "predicts")[path] = target[path].to(predicts.dtype)


# --------------------------------------------------------------------------------------------- NGRAM


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
