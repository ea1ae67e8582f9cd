"""Pure-torch SGLang CPU spec ops (sage_plugin.runtimes.sglang.cpu_ops) against per-request references.

The references below are plain loops written from SGLang's own reference kernels (Triton
``sgl_build_tree_kernel_efficient_triton`` / ``verify_tree_greedy_kernel_triton``, the sgl-kernel CPU
C++ and ``test/srt/cpu/test_spec_kernels.py``).  Ops are registered into a private namespace so the tests
neither need nor touch ``sgl_kernel``.  No sglang import.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.core.tree import DraftTree, ancestor_mask
from sage_plugin.core.verify import walk_tree
from sage_plugin.kernels.spec_cache import spec_cache_ops
from sage_plugin.runtimes.sglang import cpu_ops
from sage_plugin.runtimes.sglang.cpu_ops import (
    CPU_OP_NAMES,
    FULL_MASK,
    QLEN_ONLY,
    QLEN_ONLY_BITPACKING,
    cache_ops,
    tree_ops,
)
from tests.oracles.tree_formats import to_retrieve_arrays, tree_positions

NS = "sage_test_sgl"
SETTINGS = settings(max_examples=40, deadline=None)


def ops():
    cpu_ops.register_cpu_ops(NS)
    return getattr(torch.ops, NS)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


#: the per-step ops run through their one-call loops (``kernels/csrc/spec_cache.cpp``) or their torch path
PATHS = pytest.mark.parametrize("path", ["native", "torch"])


@contextmanager
def cache_path(path: str):
    """The per-step ops of ``cpu_ops`` (cache locations, greedy verify) through ``path``: ``native`` (skipped where the library cannot be
    built) or ``torch``."""
    if path == "native" and spec_cache_ops() is None:
        pytest.skip("the spec_cache library is not built here")
    saved = cache_ops.native, tree_ops.native
    if path == "torch":
        cache_ops.native = tree_ops.native = lambda: None
    try:
        yield
    finally:
        cache_ops.native, tree_ops.native = saved


# ------------------------------------------------------------------------------------------ tree inputs


def eagle_tree(seed: int, bs: int, topk: int, steps: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random EAGLE draft ``(parent_list, selected_index)`` the way the draft loop builds it.

    Step 0 scores the root's top-k (flat ids 0..topk-1); step i >= 1 expands the ``topk`` beams into
    ``topk**2`` children (flat ids ``topk + (i-1)*topk**2 + beam*topk + child``) and keeps the best
    ``topk`` cumulative scores as the next beams.  ``parent_list`` lists ``-1``, then the flat id of every
    beam of every step but the last; ``selected_index`` is the sorted top ``n-1`` flat ids.  Child scores
    are strictly below their parent's, so every selected node's ancestors are selected too.
    """
    g = gen(seed)
    rand = lambda *shape: torch.rand(*shape, generator=g, dtype=torch.float64) * 0.9 + 0.05  # noqa: E731
    cum = rand(bs, topk)
    scores, chunks = [cum], [torch.arange(-1, topk).expand(bs, -1)]
    for i in range(1, steps):
        expand = (cum[:, :, None] * rand(bs, topk, topk)).flatten(1)
        cum, pick = torch.topk(expand, topk, dim=1)
        scores.append(expand)
        chunks.append(pick + topk + (i - 1) * topk * topk)
    selected = torch.sort(torch.topk(torch.cat(scores, 1), n - 1, dim=1).indices, dim=1).values
    parent_list = torch.cat(chunks[:-1], 1) if steps > 1 else torch.empty(bs, 0, dtype=torch.long)
    return parent_list.contiguous(), selected.contiguous()


def find(seq: list[int], value: int) -> int | None:
    for j, v in enumerate(seq):
        if v == value:
            return j
    return None


def ref_build_tree(parent_list, selected, seq_lens, topk, n, mode):
    """Loop reference: ``(tree_mask, positions, retrive_index, next_token, next_sibling)``.

    The output buffers start the way SGLang's ``build_tree_kernel_efficient`` fills them: retrieve
    arrays -1, the mask True (FULL_MASK / QLEN_ONLY) or 0 (bit-packed).
    """
    bs = len(seq_lens)
    pl, sel = parent_list.tolist(), selected.tolist()
    retrive_index = [[b * n + i for i in range(n)] for b in range(bs)]
    next_token = [[-1] * n for _ in range(bs)]
    next_sibling = [[-1] * n for _ in range(bs)]
    positions, rows = [], []
    for b in range(bs):

        def parent_of(i, b=b):  # tree node of node i's parent; None when its candidate id is not selected
            group = sel[b][i - 1] // topk
            if group == 0:
                return 0
            if group >= len(pl[b]):
                return None
            j = find(sel[b][: n - 1], pl[b][group])
            return None if j is None else j + 1

        for i in range(n - 1, 0, -1):  # head insertion, last node first
            p = parent_of(i)
            if p is None:
                continue
            if next_token[b][p] != -1:
                next_sibling[b][i] = next_token[b][p]
            next_token[b][p] = i
        for i in range(n):
            row = [False] * n
            row[0] = True
            depth, cur = 0, i
            while cur not in (0, None) and depth < n:  # self, then each ancestor below the root
                row[cur] = True
                depth += 1
                cur = parent_of(cur)
            positions.append(seq_lens[b] + depth)
            rows.append(row)
    if mode == QLEN_ONLY:
        mask = [x for row in rows for x in row]
    elif mode == FULL_MASK:
        mask = []
        for b in range(bs):
            for i in range(n):
                mask += [True] * seq_lens[b] + rows[b * n + i]
    else:
        mask = [sum(1 << j for j, x in enumerate(row) if x) for row in rows]
    return mask, positions, retrive_index, next_token, next_sibling


def run_build_tree(parent_list, selected, seq_lens, topk, depth, n, mode, seq_dtype=torch.int64):
    bs = len(seq_lens)
    if mode == QLEN_ONLY:
        mask = torch.ones(bs * n * n, dtype=torch.bool)
    elif mode == FULL_MASK:
        mask = torch.ones(sum(seq_lens) * n + bs * n * n, dtype=torch.bool)
    else:
        mask = torch.zeros(bs * n, dtype=torch.uint8 if n <= 8 else torch.uint16 if n <= 16 else torch.uint32)
    positions = torch.zeros(bs * n, dtype=torch.int64)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.int64)
    ops().build_tree_kernel_efficient_cpu(
        parent_list,
        selected,
        torch.tensor(seq_lens, dtype=seq_dtype),
        mask,
        positions,
        *retrieve,
        topk,
        depth,
        n,
        mode,
    )
    mask_out = mask.to(torch.int64).tolist() if mode == QLEN_ONLY_BITPACKING else mask.tolist()
    return mask_out, positions.tolist(), *(r.tolist() for r in retrieve)


@st.composite
def eagle_configs(draw, max_batch=3):
    """``(seed, bs, topk, steps, n, seq_lens)`` for a valid EAGLE tree (``n - 1`` <= candidates)."""
    topk = draw(st.integers(1, 4))
    steps = draw(st.integers(1, 4))
    n = draw(st.integers(1, min(topk + (steps - 1) * topk * topk, 24) + 1))
    bs = draw(st.integers(1, max_batch))
    seq_lens = draw(st.lists(st.integers(0, 9), min_size=bs, max_size=bs))
    return draw(st.integers(0, 2**31)), bs, topk, steps, n, seq_lens


@PATHS
@SETTINGS
@given(eagle_configs(), st.sampled_from([QLEN_ONLY, FULL_MASK, QLEN_ONLY_BITPACKING]), st.booleans())
def test_build_tree_matches_reference(path, cfg, mode, int32_seq):
    with cache_path(path):
        seed, bs, topk, steps, n, seq_lens = cfg
        if mode == QLEN_ONLY_BITPACKING and n > 32:
            return
        parent_list, selected = eagle_tree(seed, bs, topk, steps, n)
        got = run_build_tree(
            parent_list, selected, seq_lens, topk, steps, n, mode, torch.int32 if int32_seq else torch.int64
        )
        assert got == ref_build_tree(parent_list, selected, seq_lens, topk, n, mode)


@PATHS
def test_build_tree_topk1_chain_and_hand_case(path):
    with cache_path(path):
        # topk = 1 chain (EAGLEWorkerV2's constant inputs): a causal mask and consecutive positions.
        steps, n = 3, 4
        plist, sel = torch.arange(-1, steps - 1).repeat(2, 1), torch.arange(steps).repeat(2, 1)
        mask, pos, idx, nxt, sib = run_build_tree(plist, sel, [7, 12], 1, steps, n, QLEN_ONLY)
        assert mask == torch.tril(torch.ones(n, n, dtype=torch.bool)).flatten().repeat(2).tolist()
        assert pos == [7, 8, 9, 10, 12, 13, 14, 15] and idx == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert nxt == [[1, 2, 3, -1]] * 2 and sib == [[-1] * 4] * 2
        # topk = 2: nodes 1, 2 are the root's children, node 3 is node 1's child
        mask, pos, idx, nxt, sib = run_build_tree(
            torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 1, 2]]), [5], 2, 2, 4, 1
        )
        assert (nxt, sib, pos) == ([[1, 3, -1, -1]], [[-1, 2, -1, -1]], [5, 6, 6, 7])
        assert torch.tensor(mask).view(4, 4).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


@PATHS
def test_build_tree_missing_parent_is_left_unlinked(path):
    with cache_path(path):
        # node 2's parent id (5) was not selected: it stays unlinked, its mask row holds root + itself
        mask, pos, _, nxt, sib = run_build_tree(torch.tensor([[-1, 0, 5]]), torch.tensor([[0, 4]]), [3], 2, 3, 3, 1)
        assert nxt == [[1, -1, -1]] and sib == [[-1, -1, -1]] and pos == [3, 4, 4]
        assert mask == [True, False, False, True, True, False, True, False, True]


# ------------------------------------------------------------------------------------------ sage round trip


@st.composite
def sage_trees(draw, max_nodes=16):
    """One unpadded tree in sage core's level order: ``(parents, depths)`` host lists.

    Levels are built one at a time; each new node picks a parent on the previous level.  With
    ``canonical`` the nodes of a level are ordered by (parent, sibling rank), which is the order
    EAGLE's sorted ``selected_index`` produces; otherwise a level's nodes are shuffled.
    """
    n = draw(st.integers(1, max_nodes))
    parents, depths, level = [-1], [0], [0]
    while len(parents) < n:
        count = draw(st.integers(1, n - len(parents)))
        owners = sorted(draw(st.lists(st.sampled_from(level), min_size=count, max_size=count)))
        if not draw(st.booleans()):
            owners = draw(st.permutations(owners))
        level = list(range(len(parents), len(parents) + count))
        parents += owners
        depths += [depths[owners[0]] + 1] * count
    return parents, depths


def sage_to_sglang(parents: list[int], depths: list[int]) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Express a sage tree in EAGLE's ``(parent_list, selected_index, topk, depth)`` input format.

    Node i (>= 1) becomes the flat candidate id EAGLE would give it: depth 1 -> its sibling rank; depth
    d >= 2 -> ``topk + (d-2)*topk**2 + beam*topk + rank`` where ``beam`` is its parent's slot among the
    expanded nodes of depth d-1 (slots in node order) and ``parent_list[1 + (d-2)*topk + beam]`` is that
    parent's flat id.  ``topk`` must cover both the widest sibling group and the most expanded nodes of
    one level; unused parent slots hold -1.
    """
    n = len(parents)
    depth = max(depths)
    children: dict[int, list[int]] = {}
    for i in range(1, n):
        children.setdefault(parents[i], []).append(i)
    expanded: dict[int, list[int]] = {}
    for p in sorted(children):
        expanded.setdefault(depths[p], []).append(p)
    topk = max([1] + [len(c) for c in children.values()] + [len(e) for e in expanded.values()])
    slot = {p: expanded[depths[p]].index(p) for p in children}
    rank = {c: k for kids in children.values() for k, c in enumerate(kids)}
    flat = [0] * n
    parent_list = [-1] * (topk * (depth - 1) + 1) if depth > 0 else [-1]
    for i in range(1, n):
        d, p = depths[i], parents[i]
        if d == 1:
            flat[i] = rank[i]
        else:
            flat[i] = topk + (d - 2) * topk * topk + slot[p] * topk + rank[i]
            parent_list[1 + (d - 2) * topk + slot[p]] = flat[p]
    return torch.tensor([parent_list]), torch.tensor([flat[1:]], dtype=torch.long).view(1, n - 1), topk, depth


@PATHS
@settings(max_examples=40, deadline=None)
@given(sage_trees(), st.integers(0, 50))
def test_sage_tree_round_trip(path, tree, seq_len):
    with cache_path(path):
        """A sage tree, fed to SGLang's tree builder in EAGLE's format, comes back as the same tree."""
        parents, depths = tree
        n = len(parents)
        plist, sel, topk, depth = sage_to_sglang(parents, depths)
        mask, pos, idx, nxt, sib = run_build_tree(plist, sel, [seq_len], topk, depth, n, QLEN_ONLY)
        par = torch.tensor([parents])
        s_idx, s_nxt, s_sib = to_retrieve_arrays(par, torch.tensor([n]))
        assert (idx, nxt, sib) == (s_idx.tolist(), s_nxt.tolist(), s_sib.tolist())
        assert mask == ancestor_mask(par, max(depth, 1)).flatten().tolist()
        assert pos == tree_positions(torch.tensor([depths]), torch.tensor([seq_len]))[0].tolist()
        # the selection is sorted exactly when the level order is canonical (by parent, then rank)
        canonical = all((parents[i], i) > (parents[i - 1], i - 1) or depths[i] > depths[i - 1] for i in range(2, n))
        assert (sorted(sel[0].tolist()) == sel[0].tolist()) == canonical


@PATHS
@settings(max_examples=30, deadline=None)
@given(sage_trees(), st.integers(0, 2**31), st.data())
def test_verify_agrees_with_sage_walk(path, tree, seed, data):
    with cache_path(path):
        """SGLang's greedy verify and sage's walk_tree accept the same path (distinct sibling tokens)."""
        parents, depths = tree
        n = len(parents)
        g = gen(seed)
        tokens = torch.randperm(1000, generator=g)[:n]  # all distinct, so siblings differ
        target = torch.randint(0, 1000, (n,), generator=g)
        for i in data.draw(st.lists(st.integers(1, max(n - 1, 1)), max_size=n)):  # make some drafts match
            if i < n:
                target[parents[i]] = tokens[i]
        plist, sel, topk, depth = sage_to_sglang(parents, depths)
        _, _, idx, nxt, sib = (torch.tensor(x) for x in run_build_tree(plist, sel, [0], topk, depth, n, QLEN_ONLY))
        steps = max(depths) + 1
        predicts = torch.full((n,), -1, dtype=torch.int32)
        accept = torch.full((1, steps), -1, dtype=torch.int32)
        num = torch.zeros(1, dtype=torch.int32)
        ops().verify_tree_greedy_cpu(predicts, accept, num, tokens[None], idx, nxt, sib, target)
        d = torch.tensor([depths])
        valid = torch.ones(1, n, dtype=torch.bool)
        sage = walk_tree(
            DraftTree(
                tokens[None],
                torch.tensor([parents]),
                d,
                torch.tensor([n]),
                torch.zeros(1, n),
                torch.where(valid, 0, -1),
                max(depths),
                torch.full((1, n), float("nan")),
            ),
            target[None],
        )
        assert accept.tolist() == sage.accepted_nodes[:, :steps].tolist()  # b = 0: global ids == local ids
        assert num.tolist() == sage.num_accepted.tolist()
        last = int(accept[0, num[0]])
        assert int(predicts[last]) == int(sage.bonus[0])


# ------------------------------------------------------------------------------------------ verify


def ref_verify(candidates, retrive_index, next_token, next_sibling, target, steps, predicts, accept, num):
    """Loop reference of greedy verification, mutating the given host lists like the kernel."""
    for b in range(len(candidates)):
        last = retrive_index[b][0]
        accept[b][0] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = next_token[b][cur]
            while cur != -1:
                if candidates[b][cur] == target[last]:
                    predicts[last] = target[last]
                    accepted += 1
                    accept[b][accepted] = retrive_index[b][cur]
                    last = retrive_index[b][cur]
                    break
                cur = next_sibling[b][cur]
            if cur == -1:
                break
        num[b] = accepted
        predicts[last] = target[last]


@PATHS
@SETTINGS
@given(eagle_configs(max_batch=4), st.integers(1, 3), st.integers(0, 2))
def test_verify_tree_greedy_matches_reference(path, cfg, vocab, extra_steps):
    with cache_path(path):
        seed, bs, topk, steps, n, seq_lens = cfg
        g = gen(seed + 1)
        parent_list, selected = eagle_tree(seed, bs, topk, steps, n)
        _, _, idx, nxt, sib = ref_build_tree(parent_list, selected, seq_lens, topk, n, QLEN_ONLY)
        candidates = torch.randint(0, vocab, (bs, n), generator=g)
        target = torch.randint(0, vocab, (bs * n,), generator=g)
        num_steps = max(1, steps + 1 - extra_steps) if extra_steps < 2 else steps + 2
        predicts = torch.full((bs * n,), -1, dtype=torch.int32)
        accept = torch.full((bs, num_steps), -1, dtype=torch.int32)
        num = torch.full((bs,), 99, dtype=torch.int32)
        ops().verify_tree_greedy_cpu(
            predicts, accept, num, candidates, torch.tensor(idx), torch.tensor(nxt), torch.tensor(sib), target
        )
        want = [predicts.new_full((bs * n,), -1).tolist(), [[-1] * num_steps for _ in range(bs)], [99] * bs]
        ref_verify(candidates.tolist(), idx, nxt, sib, target.tolist(), num_steps, *want)
        assert [predicts.tolist(), accept.tolist(), num.tolist()] == want


@PATHS
def test_verify_tree_greedy_keyword_call_and_chain(path):
    with cache_path(path):
        # SGLang's CPU branch passes keywords spelled retrive_*; drafts 3, 4 match, draft 5 does not
        predicts = torch.full((4,), -1, dtype=torch.int32)
        accept = torch.full((1, 4), -1, dtype=torch.int32)
        num = torch.empty(1, dtype=torch.int32)
        ops().verify_tree_greedy_cpu(
            predicts=predicts,
            accept_index=accept,
            accept_token_num=num,
            candidates=torch.tensor([[10, 3, 4, 5]]),
            retrive_index=torch.arange(4)[None],
            retrive_next_token=torch.tensor([[1, 2, 3, -1]]),
            retrive_next_sibling=torch.full((1, 4), -1),
            target_predict=torch.tensor([[3, 4, 9, 9]]),
        )
        assert (predicts.tolist(), accept.tolist(), num.tolist()) == ([3, 4, 9, -1], [[0, 1, 2, -1]], [2])


# ------------------------------------------------------------------------------------------ NGRAM


@settings(max_examples=30, deadline=None)
@given(st.lists(sage_trees(max_nodes=10), min_size=1, max_size=3), st.integers(0, 2**31))
def test_reconstruct_indices_from_tree_mask(trees, seed):
    n = max(len(p) for p, _ in trees)
    bs = len(trees)
    masks, parent_rows = [], []
    for parents, _ in trees:  # pad every tree to n nodes by hanging extra chain nodes off its last node
        parents = parents + [len(parents) - 1 + k for k in range(n - len(parents))]
        parent_rows.append(parents)
        masks.append(ancestor_mask(torch.tensor([parents]), n)[0])
    seq = torch.randint(0, 100, (bs,), generator=gen(seed))
    out = torch.full((4, bs, n), -7, dtype=torch.int64)
    ops().reconstruct_indices_from_tree_mask_cpu(torch.stack(masks).flatten(), seq, out[0], *out[1:], bs, n)
    for b, mask in enumerate(masks):
        m = mask.tolist()
        anc = [[j for j in range(i) if m[i][j]] for i in range(n)]
        par = [max(a) if a else -1 for a in anc]
        first = [next((k for k in range(i + 1, n) if m[k][i]), -1) for i in range(n)]
        nsib = [next((k for k in range(i + 1, n) if par[k] == par[i]), -1) if par[i] >= 0 else -1 for i in range(n)]
        assert out[0, b].tolist() == [int(seq[b]) + len(a) for a in anc]
        assert out[1, b].tolist() == [b * n + i for i in range(n)]
        assert out[2, b].tolist() == first and out[3, b].tolist() == nsib
        assert par == parent_rows[b]
        # the mask round trip agrees with sage's own retrieve arrays
        _, s_nxt, s_sib = to_retrieve_arrays(torch.tensor([parent_rows[b]]), torch.tensor([n]))
        assert (first, nsib) == (s_nxt[0].tolist(), s_sib[0].tolist())


# ------------------------------------------------------------------------------------------ cache locations


@st.composite
def pools(draw):
    """``(seed, bs, num_reqs, pool_len, req_pool_indices)`` with distinct request rows."""
    num_reqs = draw(st.integers(1, 6))
    bs = draw(st.integers(1, num_reqs))
    rpi = draw(st.permutations(range(num_reqs)))[:bs]
    return draw(st.integers(0, 2**31)), bs, num_reqs, draw(st.integers(8, 40)), rpi


@PATHS
@SETTINGS
@given(pools(), st.sampled_from([torch.int32, torch.int64]), st.booleans())
def test_assign_req_to_token_pool(path, pool, idx_dtype, with_bs_upper):
    with cache_path(path):
        seed, bs, num_reqs, pool_len, rpi = pool
        g = gen(seed)
        start = torch.randint(0, pool_len, (bs,), generator=g)
        end = start + (torch.rand(bs, generator=g) * (pool_len - start + 1)).long()
        total = int((end - start).sum())
        out_cache_loc = torch.randperm(10_000, generator=g)[:total]
        req_to_token = torch.randint(0, 10_000, (num_reqs, pool_len), generator=g, dtype=torch.int32)
        want = req_to_token.clone()
        off = 0
        for b in range(bs):
            length = int(end[b] - start[b])
            want[rpi[b], int(start[b]) : int(end[b])] = out_cache_loc[off : off + length].int()
            off += length
        args = [torch.tensor(rpi, dtype=idx_dtype), req_to_token, start.to(idx_dtype), end.to(idx_dtype), out_cache_loc]
        ops().assign_req_to_token_pool_cpu(*args, pool_len, *([8] if with_bs_upper else []))
        assert torch.equal(req_to_token, want)


@PATHS
@SETTINGS
@given(pools(), st.integers(1, 3), st.integers(1, 3), st.sampled_from([torch.int32, torch.int64]))
def test_assign_draft_cache_locs_contiguous(path, pool, topk, num_steps, idx_dtype):
    with cache_path(path):
        seed, bs, num_reqs, pool_len, rpi = pool
        g = gen(seed)
        width = topk * num_steps
        req_to_token = torch.randint(0, 10_000, (num_reqs, pool_len + width), generator=g, dtype=torch.int32)
        seq_lens = torch.randint(0, pool_len + 1, (bs,), generator=g)
        out = torch.empty(bs * width, dtype=torch.int64)
        ops().assign_draft_cache_locs_contiguous_cpu(
            torch.tensor(rpi, dtype=idx_dtype),
            req_to_token,
            seq_lens.to(idx_dtype),
            out,
            pool_len + width,
            topk,
            num_steps,
        )
        want = [int(req_to_token[rpi[b], int(seq_lens[b]) + j]) for b in range(bs) for j in range(width)]
        assert out.tolist() == want
        with pytest.raises(RuntimeError):
            ops().assign_draft_cache_locs_contiguous_cpu(
                torch.tensor(rpi), req_to_token, seq_lens, out[:-1], pool_len + width, topk, num_steps
            )


@PATHS
@SETTINGS
@given(pools(), st.sampled_from([torch.int32, torch.int64]))
def test_assign_extend_cache_locs(path, pool, idx_dtype):
    with cache_path(path):
        seed, bs, num_reqs, pool_len, rpi = pool
        g = gen(seed)
        req_to_token = torch.randint(0, 10_000, (num_reqs, pool_len), generator=g, dtype=torch.int32)
        start = torch.randint(0, pool_len, (bs,), generator=g)
        end = torch.minimum(start + torch.randint(0, 6, (bs,), generator=g), torch.tensor(pool_len))
        want = [int(req_to_token[rpi[b], c]) for b in range(bs) for c in range(int(start[b]), int(end[b]))]
        out = torch.full((len(want) + 3,), -5, dtype=torch.int64)  # SGLang sizes it bs*draft_token_num
        ops().assign_extend_cache_locs_cpu(
            torch.tensor(rpi, dtype=idx_dtype), req_to_token, start.to(idx_dtype), end.to(idx_dtype), out, pool_len
        )
        assert out.tolist() == want + [-5] * 3


@PATHS
@SETTINGS
@given(pools(), st.integers(1, 3), st.integers(1, 3))
def test_build_draft_decode_metadata(path, pool, topk, num_steps):
    with cache_path(path):
        seed, bs, num_reqs, prefix_room, rpi = pool
        g = gen(seed)
        pool_len = prefix_room + topk * num_steps
        req_to_token = torch.randint(0, 10_000, (num_reqs, pool_len), generator=g, dtype=torch.int32)
        seq_lens = torch.randint(0, prefix_room + 1, (bs,), generator=g)
        out = ops().build_draft_decode_metadata_cpu(
            req_to_token, torch.tensor(rpi), seq_lens, topk, num_steps, pool_len
        )
        assert out.shape == (bs * topk, pool_len) and out.dtype == req_to_token.dtype
        for b in range(bs):
            s, row = int(seq_lens[b]), req_to_token[rpi[b]].tolist()
            for k in range(topk):
                want = row[:s] + row[s + k * num_steps : s + (k + 1) * num_steps]
                assert out[b * topk + k, : s + num_steps].tolist() == want
        if path == "native":  # past the draft columns too, the loop writes what the torch path does
            cache_ops.native = lambda: None
            torch_out = ops().build_draft_decode_metadata_cpu(
                req_to_token, torch.tensor(rpi), seq_lens, topk, num_steps, pool_len
            )
            assert torch.equal(out, torch_out)


def test_native_cache_ops_refuse_an_index_outside_their_buffers():
    """An index past ``req_to_token`` or past an output raises, as the torch path's indexing does, instead of writing
    outside the buffer."""
    with cache_path("native"):
        table = torch.zeros(2, 8, dtype=torch.int32)
        with pytest.raises(RuntimeError, match="out of range"):  # row 2 of a 2-row table
            ops().assign_req_to_token_pool_cpu(torch.tensor([2]), table, torch.tensor([0]), torch.tensor([1]),
                                               torch.tensor([5]), 8)  # fmt: skip
        with pytest.raises(RuntimeError, match="out of range"):  # more slots than out_cache_loc holds
            ops().assign_req_to_token_pool_cpu(torch.tensor([1]), table, torch.tensor([0]), torch.tensor([3]),
                                               torch.tensor([5, 6]), 8)  # fmt: skip
        out = torch.zeros(2, dtype=torch.int64)
        with pytest.raises(RuntimeError, match="out of range"):  # three locations into a two-entry output
            ops().assign_extend_cache_locs_cpu(torch.tensor([0]), table, torch.tensor([0]), torch.tensor([3]), out, 8)
        assert not table[:, 2:].any()


# ------------------------------------------------------------------------------------------ accept / bonus


@PATHS
@SETTINGS
@given(st.integers(0, 2**31), st.integers(1, 5), st.integers(1, 5), st.booleans())
def test_fill_bonus_and_accept_out_cache_loc(path, seed, bs, steps, pass_size):
    with cache_path(path):
        g = gen(seed)
        n = steps + 2
        accept_lens = torch.randint(1, steps + 1, (bs,), generator=g, dtype=torch.int32)
        accept_tokens = torch.randint(0, 1000, (bs, steps), generator=g, dtype=torch.int32)
        bonus = torch.empty(bs, dtype=torch.int32)
        ops().fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, steps)
        assert bonus.tolist() == [int(accept_tokens[b, int(accept_lens[b]) - 1]) for b in range(bs)]

        accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
        for b in range(bs):  # root first, then a few accepted nodes of request b, -1 after
            k = int(accept_lens[b])
            accept_index[b, :k] = (b * n + torch.sort(torch.randperm(n, generator=g)[:k]).values).int()
        out_cache_loc = torch.randperm(4096, generator=g)[: bs * n]
        got = torch.full((bs * steps,), -3, dtype=torch.int64)
        size = [bs * steps] if pass_size else []
        ops().fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, got, *size)
        kept = [int(out_cache_loc[a]) for a in accept_index.flatten().tolist() if a != -1]
        assert got.tolist() == kept + [-3] * (bs * steps - len(kept))


@SETTINGS
@given(st.lists(st.integers(0, 4), min_size=1, max_size=4), st.booleans(), st.integers(0, 2**31))
def test_rotate_input_ids(lens, with_select, seed):
    g = gen(seed)
    starts, pos = [], 0
    for length in lens:  # segments back to back, sometimes with a gap
        starts.append(pos)
        pos += length + int(torch.randint(0, 2, (1,), generator=g))
    ids0 = torch.arange(100, 100 + pos + 1)
    topk_index = torch.arange(900, 900 + len(lens))
    select = None
    if with_select:  # each request's new token lands somewhere inside its own segment
        select = torch.tensor(
            [s + int(torch.randint(0, max(length, 1), (1,), generator=g)) for s, length in zip(starts, lens)]
        )
    ids = ids0.clone()
    ops().rotate_input_ids_cpu(ids, torch.tensor(starts, dtype=torch.int32), torch.tensor(lens), topk_index, select)
    want = ids0.tolist()
    for b, (s, length) in enumerate(zip(starts, lens)):
        if length > 1:
            want[s : s + length - 1] = ids0[s + 1 : s + length].tolist()
        if length > 0:
            want[int(select[b]) if select is not None else s + length - 1] = 900 + b
    assert ids.tolist() == want


# ------------------------------------------------------------------------------------------ KV copy


@SETTINGS
@given(
    st.integers(0, 2**31),
    st.integers(1, 3),
    st.integers(0, 6),
    st.sampled_from([torch.int32, torch.int64]),
    st.sampled_from(["none", "some", "all"]),
)
def test_copy_all_layer_kv_cache(seed, layers, num_locs, loc_dtype, in_place):
    """Buffers shaped like MHATokenToKVPool's; overlapping source/target slots copy from the old values; pairs whose
    source is their target (``in_place``: none, some or all of them, the verify's already-compact paths) too."""
    g = gen(seed)
    slots = 12
    shapes = [(slots, 2, 4, torch.bfloat16), (slots, 1, 3, torch.float32), (slots, 3, 5, torch.uint8)]
    bufs = [torch.randint(0, 100, s[:3], generator=g).to(s[3]) for s in shapes[:layers]]
    bufs += [torch.randint(0, 100, (slots, 2, 2), generator=g).to(torch.float16) for _ in range(layers)]  # V
    tgt = torch.randperm(slots, generator=g)[:num_locs]
    src = torch.randint(0, slots, (num_locs,), generator=g)
    if in_place != "none":
        same = torch.ones(num_locs, dtype=torch.bool) if in_place == "all" else torch.rand(num_locs, generator=g) < 0.5
        src = torch.where(same, tgt, src)
    want = [b.clone() for b in bufs]
    for b in want:
        staged = [b[int(s)].clone() for s in src]
        for t, row in zip(tgt.tolist(), staged):
            b[t] = row
    data_ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in bufs])
    ops().copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt.to(loc_dtype), src.to(loc_dtype))
    for got, exp in zip(bufs, want):
        assert torch.equal(got, exp)


# ------------------------------------------------------------------------------------------ registration


def test_register_is_idempotent_and_complete():
    first = cpu_ops.register_cpu_ops(NS)
    assert first == list(CPU_OP_NAMES) == cpu_ops.register_cpu_ops(NS)
    for name in CPU_OP_NAMES:
        assert hasattr(getattr(torch.ops, NS), name)


def test_register_leaves_existing_kernels_alone():
    ns = NS + "_pre"
    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define("fill_bonus_tokens_cpu(Tensor a, Tensor b, Tensor(a!) c, int d) -> ()")

    def sentinel(a, b, c, d):
        c.fill_(42)

    lib.impl("fill_bonus_tokens_cpu", sentinel, "CPU")
    names = cpu_ops.register_cpu_ops(ns)
    assert "fill_bonus_tokens_cpu" not in names and len(names) == len(CPU_OP_NAMES) - 1
    out = torch.zeros(2, dtype=torch.int32)
    getattr(torch.ops, ns).fill_bonus_tokens_cpu(torch.zeros(2, 2), torch.ones(2), out, 2)
    assert out.tolist() == [42, 42]


def test_fake_kernels_and_schemas():
    op = ops()
    req_to_token = torch.randint(0, 50, (3, 16), dtype=torch.int32)
    args = (req_to_token, torch.tensor([2, 0]), torch.tensor([3, 5]), 2, 2, 16)
    torch.library.opcheck(op.build_draft_decode_metadata_cpu, args)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = op.build_draft_decode_metadata_cpu(
            *(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        )
    assert fake.shape == (4, 16) and fake.dtype == torch.int32
    # mutating ops: the schema's (a!) annotations must cover every tensor the kernel writes
    plist, sel = eagle_tree(0, 2, 2, 3, 6)
    retrieve = torch.full((3, 2, 6), -1, dtype=torch.int64)
    tree_args = (plist, sel, torch.tensor([3, 4]), torch.ones(72, dtype=torch.bool), torch.zeros(12, dtype=torch.int64))
    torch.library.opcheck(
        op.build_tree_kernel_efficient_cpu,
        (*tree_args, *[r.clone() for r in retrieve], 2, 3, 6, QLEN_ONLY),
        test_utils=("test_schema", "test_faketensor"),
    )
    bonus_args = (torch.randint(0, 9, (2, 3), dtype=torch.int32), torch.tensor([1, 3], dtype=torch.int32))
    torch.library.opcheck(
        op.fill_bonus_tokens_cpu, (*bonus_args, torch.zeros(2, dtype=torch.int32), 3), test_utils=("test_schema",)
    )


def _mutating_cases():
    rtt = torch.randint(0, 99, (4, 20), dtype=torch.int32)
    two = torch.tensor([1, 3])
    return {
        "assign_req_to_token_pool_cpu": (
            two,
            rtt.clone(),
            torch.tensor([2, 0]),
            torch.tensor([5, 3]),
            torch.arange(6),
            20,
        ),
        "assign_draft_cache_locs_contiguous_cpu": (
            two,
            rtt,
            torch.tensor([2, 4]),
            torch.zeros(8, dtype=torch.long),
            20,
            2,
            2,
        ),
        "assign_extend_cache_locs_cpu": (
            two,
            rtt,
            torch.tensor([2, 0]),
            torch.tensor([5, 3]),
            torch.zeros(6).long(),
            20,
        ),
        "verify_tree_greedy_cpu": (
            torch.full((4,), -1, dtype=torch.int32),
            torch.full((1, 4), -1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32),
            torch.tensor([[10, 3, 4, 5]]),
            torch.arange(4)[None],
            torch.tensor([[1, 2, 3, -1]]),
            torch.full((1, 4), -1),
            torch.tensor([3, 4, 9, 9]),
        ),
        "fill_accept_out_cache_loc_cpu": (
            torch.tensor([[0, 1, -1], [4, -1, -1]], dtype=torch.int32),
            torch.arange(100, 108),
            torch.zeros(6, dtype=torch.long),
            6,
        ),
        "rotate_input_ids_cpu": (
            torch.arange(8),
            torch.tensor([0, 4]),
            torch.tensor([4, 3]),
            torch.tensor([90, 91]),
            None,
        ),
        "reconstruct_indices_from_tree_mask_cpu": (
            torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool).flatten(),
            torch.tensor([5]),
            *torch.zeros(4, 1, 3, dtype=torch.long).clone().unbind(0),
            1,
            3,
        ),
    }


@pytest.mark.parametrize("name", sorted(_mutating_cases()))
def test_mutation_annotations(name):
    """opcheck: every tensor a kernel writes is declared (a!) in the schema, and the fake kernel traces."""
    args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in _mutating_cases()[name])
    torch.library.opcheck(getattr(ops(), name), args, test_utils=("test_schema", "test_faketensor"))


# ------------------------------------------------------------------------------------------ sampling verify


def ref_tree_sampling(cand, ri, nt, ns, coins, final, q, p, steps, predicts, accept, num, t_single=1.0, t_acc=1.0):
    """Loop transcription of the CUDA ``tree_speculative_sampling_target_only`` (host lists; p mutated)."""
    for b in range(len(cand)):
        node, mass, coin = 0, 0.0, coins[b][0]
        last = ri[b][0]
        accept[b][0] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = nt[b][cur]
            while cur != -1:
                tok = cand[b][cur]
                tp = q[b][node][tok]
                mass += tp
                if tp > 0 and (coin < mass / t_acc or tp >= t_single):
                    mass, node, coin = 0.0, cur, coins[b][cur]
                    predicts[last] = tok
                    accepted += 1
                    accept[b][accepted] = ri[b][cur]
                    last = ri[b][cur]
                    break
                p[b][node][tok] = tp
                cur = ns[b][cur]
            if cur == -1:
                break
        num[b] = accepted
        resid = q[b][node] if accepted == steps - 1 else [max(x - y, 0.0) for x, y in zip(q[b][node], p[b][node])]
        u, run, pick = final[b] * sum(resid), 0.0, None
        for i, r in enumerate(resid):
            run += r
            if run > u:
                pick = i
                break
        if pick is None:
            pick = max([i for i, r in enumerate(resid) if r > 0], default=len(resid) - 1)
        predicts[last] = pick


def _probs(g: torch.Generator, *shape: int, zeros: float = 0.2) -> torch.Tensor:
    logits = torch.randn(*shape, generator=g, dtype=torch.float64) * 2
    logits[torch.rand(*shape, generator=g) < zeros] = float("-inf")
    logits[..., 0] = logits[..., 0].clamp(min=-1.0)  # every row keeps some mass
    return torch.softmax(logits, -1)


@SETTINGS
@given(eagle_configs(max_batch=4), st.integers(2, 5), st.integers(0, 2), st.sampled_from([1.0, 0.6]))
def test_tree_sampling_matches_kernel_reference(cfg, vocab, extra_steps, threshold):
    from sage_plugin.runtimes.sglang.cpu_ops.sampling_ops import tree_speculative_sampling_target_only_cpu

    seed, bs, topk, steps, n, seq_lens = cfg
    g = gen(seed + 7)
    parent_list, selected = eagle_tree(seed, bs, topk, steps, n)
    _, _, idx, nxt, sib = ref_build_tree(parent_list, selected, seq_lens, topk, n, QLEN_ONLY)
    candidates = torch.randint(0, vocab, (bs, n), generator=g)
    q = _probs(g, bs, n, vocab)
    coins = torch.rand(bs, n, generator=g, dtype=torch.float64)
    final = torch.rand(bs, generator=g, dtype=torch.float64)
    num_steps = max(1, steps + 1 - extra_steps) if extra_steps < 2 else steps + 2
    predicts = torch.full((bs * n,), -1, dtype=torch.int32)
    accept = torch.full((bs, num_steps), -1, dtype=torch.int64)
    num = torch.full((bs,), 99, dtype=torch.int32)
    p = torch.zeros_like(q)
    tree_speculative_sampling_target_only_cpu(
        predicts=predicts, accept_index=accept, accept_token_num=num, candidates=candidates,
        retrive_index=torch.tensor(idx), retrive_next_token=torch.tensor(nxt), retrive_next_sibling=torch.tensor(sib),
        uniform_samples=coins, uniform_samples_for_final_sampling=final, target_probs=q, draft_probs=p,
        threshold_single=threshold, threshold_acc=threshold,
    )  # fmt: skip
    want = [[-1] * (bs * n), [[-1] * num_steps for _ in range(bs)], [99] * bs]
    p_ref = torch.zeros_like(q).tolist()
    ref_tree_sampling(candidates.tolist(), idx, nxt, sib, coins.tolist(), final.tolist(), q.tolist(), p_ref,
                      num_steps, *want, threshold, threshold)  # fmt: skip
    assert [predicts.tolist(), accept.tolist(), num.tolist()] == want
    assert torch.equal(p, torch.tensor(p_ref, dtype=p.dtype))


def test_tree_sampling_worked_example():
    """The module docstring's example: children a=0, b=1 of the root; q_root = [0.5, 0.3, 0.2]."""
    from sage_plugin.runtimes.sglang.cpu_ops.sampling_ops import tree_speculative_sampling_target_only_cpu

    def run(coin: float, final: float) -> tuple[list[int], list[int]]:
        predicts = torch.full((3,), -1, dtype=torch.int32)
        accept = torch.full((1, 2), -1, dtype=torch.int32)
        num = torch.zeros(1, dtype=torch.int32)
        q = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.0, 0.0, 1.0]]])
        tree_speculative_sampling_target_only_cpu(
            predicts, accept, num, torch.tensor([[9, 0, 1]]), torch.arange(3)[None], torch.tensor([[1, -1, -1]]),
            torch.tensor([[-1, 2, -1]]), torch.tensor([[coin, 0.5, 0.5]]), torch.tensor([final]), q,
            torch.zeros_like(q),
        )  # fmt: skip
        return predicts.tolist(), accept.tolist()[0]

    assert run(0.6, 0.0) == ([1, -1, 2], [0, 2])  # b accepted; bonus after b from q_b = [0, 0, 1]: token 2
    assert run(0.9, 0.5) == ([2, -1, -1], [0, -1])  # a, b rejected: bonus from [0, 0, 0.2] -> c


def test_tree_sampling_is_lossless():
    """Over many coins, the first two emitted tokens follow the target: q_root, then q at the chosen child."""
    from scipy.stats import chisquare

    from sage_plugin.runtimes.sglang.cpu_ops.sampling_ops import tree_speculative_sampling_target_only_cpu

    rows, vocab = 60_000, 5
    g = gen(3)
    # root (node 0) -> children 1 (token 0), 2 (token 3); node 1 -> child 3 (token 1)
    cand = torch.tensor([[9, 0, 3, 1]]).expand(rows, -1)
    ri = (torch.arange(rows)[:, None] * 4 + torch.arange(4)).contiguous()
    nt = torch.tensor([[1, 3, -1, -1]]).expand(rows, -1)
    ns = torch.tensor([[-1, 2, -1, -1]]).expand(rows, -1)
    q_nodes = _probs(g, 4, vocab, zeros=0.0)
    q = q_nodes[None].expand(rows, -1, -1).contiguous()
    predicts = torch.full((rows * 4,), -1, dtype=torch.int64)
    accept = torch.full((rows, 3), -1, dtype=torch.int64)
    num = torch.zeros(rows, dtype=torch.int64)
    tree_speculative_sampling_target_only_cpu(
        predicts, accept, num, cand, ri, nt, ns, torch.rand(rows, 4, generator=g, dtype=torch.float64),
        torch.rand(rows, generator=g, dtype=torch.float64), q, torch.zeros_like(q),
    )  # fmt: skip
    first = predicts.view(rows, 4)[:, 0]
    counts = torch.bincount(first, minlength=vocab).double()
    assert chisquare(counts.numpy(), (q_nodes[0] * rows).numpy()).pvalue > 0.01
    after_zero = first == 0  # token 0 = node 1 accepted; the next token follows q at node 1
    second = predicts.view(rows, 4)[after_zero, 1]
    counts = torch.bincount(second, minlength=vocab).double()
    assert chisquare(counts.numpy(), (q_nodes[1] * counts.sum()).numpy()).pvalue > 0.01


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 4), st.integers(2, 12))
def test_top_k_top_p_renorm_match_a_per_row_reference(seed, rows, vocab):
    """Top-k keeps ranks < k; top-p drops a token when the mass before it (descending) exceeds p."""
    from sage_plugin.runtimes.sglang.cpu_ops.sampling_ops import top_k_renorm_prob_cpu, top_p_renorm_prob_cpu

    g = gen(seed)
    probs = _probs(g, rows, vocab)
    ks = torch.randint(1, vocab + 1, (rows,), generator=g)
    ps = torch.rand(rows, generator=g, dtype=torch.float64)
    got_k, got_p = top_k_renorm_prob_cpu(probs, ks), top_p_renorm_prob_cpu(probs, ps)
    for r in range(rows):
        order = sorted(range(vocab), key=lambda i: (-float(probs[r, i]), i))
        keep_k = set(order[: int(ks[r])])
        mass, keep_p = 0.0, set()
        for i in order:
            if mass <= float(ps[r]):
                keep_p.add(i)
            mass += float(probs[r, i])
        for keep, got in ((keep_k, got_k), (keep_p, got_p)):
            want = torch.tensor([float(probs[r, i]) if i in keep else 0.0 for i in range(vocab)], dtype=probs.dtype)
            torch.testing.assert_close(got[r], want / want.sum())
    assert torch.equal(top_k_renorm_prob_cpu(probs, vocab), probs / probs.sum(-1, keepdim=True))


@pytest.mark.parametrize("name", sorted(cpu_ops.MODEL_ONLY_OPS))
def test_model_only_ops_exist_and_refuse_to_run(name):
    """The Qwen3.5 / Muse kernels SGLang's model modules look up at import time exist (so the Qwen-VL processors
    register) and raise, naming themselves, if anything calls them."""
    cpu_ops.register_cpu_ops(NS)
    op = getattr(getattr(torch.ops, NS), name)
    schema = op.default._schema
    args = [torch.zeros(2, 4) if a.type.kind() == "TensorType" else (1e-6 if "float" in str(a.type) else 2)
            for a in schema.arguments]  # fmt: skip
    with pytest.raises(NotImplementedError, match=name):
        op(*args)
