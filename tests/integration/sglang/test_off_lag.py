"""The off tier's skipped draft extends and their catch-up (``runtimes/sglang/off_lag.py``), without a server.

A naive token history per request stands in for SGLang's sequences: random prefills, drafted steps (a window of
verified tokens, the accepted ones first, junk after) and off steps (one token, extend skipped).  The catch-up must
hand upstream's ``_draft_extend_for_prefill`` exactly a chunked-prefill continuation over each request's skipped
positions: the tokens there, their KV slots, ``E = max(lag, 1)`` rows, and the root as the tail.  The served end of it
(a CPU server skipping and catching up, outputs equal to plain, the draft still accepted) is
``test_e2e_serving.py::test_tiers_cycle_and_equal_plain``.
"""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("sglang")

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from sage_plugin.runtimes.sglang.off_lag import DraftLag, TokenRing  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_token_ring_reads_what_was_last_written(data):
    length = data.draw(st.integers(4, 12))
    ring, naive = TokenRing(3, length, "cpu"), {}
    top = {0: 0, 1: 0, 2: 0}  # next position per slot (positions only move forward, as a sequence does)
    for _ in range(data.draw(st.integers(1, 30))):
        slot = data.draw(st.integers(0, 2))
        n = data.draw(st.integers(1, length))
        back = data.draw(st.integers(0, min(top[slot], 2)))  # a step rewrites its window's junk tail: a little back
        first = top[slot] - back
        toks = data.draw(st.lists(st.integers(0, 999), min_size=n, max_size=n))
        ring.write(torch.tensor([slot]), torch.tensor([first]), torch.tensor([toks]))
        for i, t in enumerate(toks):
            naive[(slot, first + i)] = t
        top[slot] = max(top[slot], first + n)
    for slot, end in top.items():
        positions = [p for p in range(max(0, end - length), end) if (slot, p) in naive]
        if positions:
            got = ring.read(torch.full((len(positions),), slot), torch.tensor(positions))
            assert got.tolist() == [naive[(slot, p)] for p in positions]


class _Req:
    def __init__(self, rid: str) -> None:
        self.rid = rid


class _Worker:
    """What the catch-up reads of the draft worker, recording the extend it would run."""

    def __init__(self, req_to_token: torch.Tensor) -> None:
        self.req_to_token_pool = types.SimpleNamespace(req_to_token=req_to_token)
        self.calls: list = []

    def sage_upstream_prefill_extend(self, batch, hidden, next_token_ids):
        self.calls.append((batch, hidden, next_token_ids))
        return types.SimpleNamespace(topk_p="fresh")


def _batch(reqs, slots, seq, **kw):
    return types.SimpleNamespace(reqs=reqs, req_pool_indices=torch.tensor(slots), seq_lens=torch.tensor(seq),
                                 seq_lens_cpu=torch.tensor(seq), forward_mode=ForwardMode.DECODE, **kw)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_catch_up_replays_each_requests_skipped_positions(data):
    max_lag, widest = 6, 4
    lag = DraftLag(max_lag, 8, widest, "cpu")
    req_to_token = torch.arange(8 * 200).reshape(8, 200)  # a distinct KV slot per (request slot, position)
    nreq = data.draw(st.integers(1, 3))
    reqs, slots = [_Req(f"r{i}") for i in range(nreq)], [1 + 2 * i for i in range(nreq)]
    hist = {i: data.draw(st.lists(st.integers(0, 500), min_size=2, max_size=12)) for i in range(nreq)}
    # the prefill: the prompt's tokens, and the sampled next token at position len(prompt)
    ids = torch.tensor([t for i in range(nreq) for t in hist[i]])
    nxt = [data.draw(st.integers(0, 500)) for _ in range(nreq)]
    lens = [len(hist[i]) for i in range(nreq)]
    lag.record_prefill(_batch(reqs, slots, lens, prefix_lens=[0] * nreq, extend_lens=lens, input_ids=ids),
                       torch.tensor(nxt))  # fmt: skip
    for i in range(nreq):
        hist[i].append(nxt[i])
    lags = dict.fromkeys(range(nreq), 0)
    for _ in range(data.draw(st.integers(0, max_lag - 1))):
        seq = [len(hist[i]) - 1 for i in range(nreq)]  # the root (last token) sits at position seq
        drafted = data.draw(st.booleans()) and not any(lags.values())
        n = widest if drafted else 1
        acc = [data.draw(st.integers(1, n)) for _ in range(nreq)]
        new = [[data.draw(st.integers(0, 500)) for _ in range(acc[i])] for i in range(nreq)]
        rows = [new[i] + [999] * (n - acc[i]) for i in range(nreq)]  # junk after the accepted tokens
        lag.record_step(_batch(reqs, slots, seq), torch.tensor(rows).reshape(-1), n)
        for i in range(nreq):
            hist[i] += new[i]
        if not drafted:
            assert lag.skip(reqs) == max(lags.values(), default=0) + 1
            lags = {i: lags[i] + 1 for i in range(nreq)}
    worker = _Worker(req_to_token)
    seq = [len(hist[i]) - 1 for i in range(nreq)]
    root = torch.tensor([hist[i][-1] for i in range(nreq)])
    batch = _batch(reqs, slots, seq)
    assert lag.catch_up(worker, batch, seq, root).topk_p == "fresh"
    ((sub, hidden, tail),) = worker.calls
    ext = [max(lags[i], 1) for i in range(nreq)]
    assert sub.forward_mode == ForwardMode.EXTEND and hidden is None and tail.tolist() == root.tolist()
    assert sub.extend_lens == ext and sub.prefix_lens == [s - e for s, e in zip(seq, ext)]
    assert sub.extend_num_tokens == sum(ext) and sub.seq_lens.tolist() == seq and not sub.return_logprob
    want_ids, want_loc = [], []
    for i in range(nreq):
        want_ids += hist[i][seq[i] - ext[i] : seq[i]]
        want_loc += req_to_token[slots[i], seq[i] - ext[i] : seq[i]].tolist()
    assert sub.input_ids.tolist() == want_ids and sub.out_cache_loc.tolist() == want_loc
    assert batch.forward_mode == ForwardMode.DECODE  # the step's own batch is untouched
    assert not lag.behind() and lag.catch_ups == 1


def test_the_chooser_sees_no_alpha_while_the_draft_is_behind():
    """The alpha that turned speculation off must not keep it off: while the draft is behind it is unknown (None),
    and the chooser ranks tiers by their estimates over every alpha; a caught-up draft's root gives it again."""
    from sage_plugin.config import SageConfig
    from sage_plugin.core.entropy import root_confidence
    from sage_plugin.runtimes.sglang.worker import SageWorkerMixin
    from sage_plugin.serving.clock import HostScalar

    lag = DraftLag(4, 4, 2, "cpu")
    worker = types.SimpleNamespace(
        _draft_worker=types.SimpleNamespace(sage_lag=lag),
        _sage_alpha=HostScalar("cpu"),
        sage_cfg=SageConfig(),
        _sage_tp=None,  # one rank: no tp_sync broadcast
    )
    topk_p = torch.tensor([[0.9, 0.05, 0.03, 0.02], [0.4, 0.3, 0.2, 0.1]])
    batch = types.SimpleNamespace(spec_info=types.SimpleNamespace(topk_p=topk_p))
    want = float(root_confidence(topk_p, SageConfig().algorithm.k).mean())
    assert SageWorkerMixin._batch_alpha(worker, batch) == pytest.approx(want)
    lag.skip([_Req("a")])
    assert SageWorkerMixin._batch_alpha(worker, batch) is None
    lag.lags = {}  # caught up
    assert SageWorkerMixin._batch_alpha(worker, batch) == pytest.approx(want)
