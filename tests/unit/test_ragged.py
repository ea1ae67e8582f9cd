"""The ragged verify's tree surgery (``sage_plugin/runtimes/sglang/ragged_verify.py``) against naive oracles on random trees
in SGLang's pointer format, and its forward wrapper on a recording stand-in target."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sage_plugin.runtimes.sglang.ragged_verify import RaggedVerifyTarget, compact_mask, live_rows, ragged_runs, unlink


def _pointers(parents: list[int]) -> tuple[list[int], list[int]]:
    """SGLang's first-child / next-sibling pointers of a tree given by ``parents`` (node 0 the root, -1)."""
    n = len(parents)
    first, sib = [-1] * n, [-1] * n
    for i in range(n - 1, 0, -1):  # children in index order
        p = parents[i]
        sib[i], first[p] = first[p], i
    return first, sib


def _oracle(parents: list[int], live: list[bool]) -> tuple[list[int], list[int], list[bool]]:
    """Recompute the pointers of the tree kept by ``live`` from the parents: a node is kept when it and all its
    ancestors are live; kept nodes point to their first kept child and next kept sibling, in index order."""
    n = len(parents)
    kept = [True] + [False] * (n - 1)
    for i in range(1, n):
        kept[i] = live[i] and kept[parents[i]]
    first, sib = [-1] * n, [-1] * n
    for i in range(n - 1, 0, -1):
        if kept[i]:
            p = parents[i]
            sib[i], first[p] = first[p], i
    return first, sib, kept


@st.composite
def _trees(draw):
    batch = draw(st.integers(1, 4))
    n = draw(st.integers(1, 12))
    rows = []
    for _ in range(batch):
        parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
        live = [True] + [draw(st.booleans()) for _ in range(1, n)]
        rows.append((parents, live))
    return rows


@settings(max_examples=200, deadline=None)
@given(_trees())
def test_unlink_equals_the_oracle_on_random_trees(rows):
    nt = torch.tensor([_pointers(p)[0] for p, _ in rows])
    ns = torch.tensor([_pointers(p)[1] for p, _ in rows])
    live = torch.tensor([lv for _, lv in rows])
    got_nt, got_ns, reach = unlink(nt, ns, live)
    for b, (parents, lv) in enumerate(rows):
        first, sib, kept = _oracle(parents, lv)
        assert reach[b].tolist() == kept
        assert got_nt[b].tolist() == first and got_ns[b].tolist() == sib


def test_live_rows_keep_the_root_and_the_nodes_at_the_threshold():
    scores = torch.tensor([[0.6, 0.4, 0.2], [0.25, 0.1, 0.05]])
    assert live_rows(scores, 0.3).tolist() == [[True, True, True, False], [True, False, False, False]]
    assert live_rows(scores, 0.25)[1].tolist() == [True, True, False, False]


def test_compact_mask_keeps_each_requests_live_block():
    torch.manual_seed(0)
    b, n = 3, 5
    mask = torch.rand(b, n, n) < 0.5
    live = torch.rand(b, n) < 0.6
    live[:, 0] = True
    got = compact_mask(mask.flatten(), live)
    want = torch.cat([mask[i][live[i]][:, live[i]].flatten() for i in range(b)])
    assert torch.equal(got, want)


class _Target:
    """Records the forward batch it is handed; logits are the input id and its position, per row."""

    def __init__(self):
        self.seen = None

    def forward_batch_generation(self, batch=None, forward_batch=None, **kwargs):
        self.seen = (forward_batch, forward_batch.spec_info.sage_ragged, kwargs)
        logits = torch.stack([forward_batch.input_ids, forward_batch.positions], dim=1).float()
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=None))


class _FB:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_forward_runs_on_the_live_rows_and_scatters_back():
    live = torch.tensor([[True, True, False, True], [True, False, False, False]])
    ids = torch.arange(10, 18)
    pos = torch.tensor([5, 6, 6, 7, 9, 10, 10, 11])
    mask = torch.ones(2 * 16, dtype=torch.bool)
    spec = SimpleNamespace(tree_topk=4, custom_mask=mask)
    mode = SimpleNamespace(is_target_verify=lambda: True)
    fb = _FB(input_ids=ids, positions=pos, out_cache_loc=ids + 100, mrope_positions=None, spec_info=spec,
             forward_mode=mode, seq_lens=torch.tensor([5, 9]))  # fmt: skip
    target = _Target()
    out = RaggedVerifyTarget(target, live).forward_batch_generation(None, forward_batch=fb, is_verify=True)
    sub, meta, kwargs = target.seen
    assert sub.input_ids.tolist() == [10, 11, 13, 14] and sub.out_cache_loc.tolist() == [110, 111, 113, 114]
    assert sub.positions.tolist() == [5, 6, 7, 9] and kwargs == {"is_verify": True}
    seq_lens, lens, start, compact = meta
    assert seq_lens.tolist() == [8, 10] and lens.tolist() == [3, 1] and start.tolist() == [0, 3]
    assert compact.numel() == 9 + 1
    # the batch and verify input upstream keeps are untouched
    assert fb.input_ids is ids and fb.spec_info is spec and not hasattr(spec, "sage_ragged")
    logits = out.logits_output.next_token_logits
    assert logits.shape == (8, 2)
    assert logits[:, 0].tolist() == [10, 11, 0, 13, 14, 0, 0, 0]


def test_a_ragged_verify_needs_the_flag_tiers_and_a_cpu():
    """Without the flag, without tiers (no off-tier price to set the threshold) or on CUDA a server verifies every
    node, and SGLang's tensor-parallel group is not consulted (the CPU, one-rank case runs in the e2e servers)."""
    from sage_plugin.config import ServingConfig

    tiers = ((0, 1), (1, 2))
    assert not ragged_runs(ServingConfig(tiers=tiers), "cpu")
    assert not ragged_runs(ServingConfig(ragged_verify=True), "cpu")
    assert not ragged_runs(ServingConfig(ragged_verify=True, tiers=tiers), "cuda")
