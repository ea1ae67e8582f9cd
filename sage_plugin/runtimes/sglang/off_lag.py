"""Speculation-off steps without the draft extend, and the catch-up that replays them (``tier_off_lag``).

At the off tier (``--sage-tiers`` ``[0, 1]``) SGLang's EAGLE v2 worker verifies the root alone and still runs the
draft extend over the new token, to keep the draft's KV cache current for when drafting resumes: a whole draft
forward per step (docs/design/sglang-internals.md, "The speculation-off tier").  With ``tier_off_lag = L > 0`` a standalone draft
skips it: the off step leaves the draft ``lag`` tokens behind, and before the next drafted step (or once a request is
``L`` tokens behind) one draft forward in EXTEND mode (a chunked-prefill continuation, through SGLang's own
``_draft_extend_for_prefill``) replays every request's missing tokens at their positions and KV slots.  Outputs do not
change (verification decides them); the catch-up writes the same tokens at the same positions and KV slots as the
skipped extends would have (``tests/integration/sglang/test_off_lag.py`` checks what it hands upstream against a naive
token history; the served check is ``test_e2e_serving.py::test_tiers_cycle_and_equal_plain``).

Which token the draft reads where: SGLang's draft runs one token ahead (its prefill reads ``prompt[1:] + [next]``;
the decode extend writes position ``p`` from the token at ``p + 1``), so :class:`TokenRing` keeps the *sequence's*
tokens by position, ``ring[slot, p % R]``, written by every prefill (its last tokens and the sampled one) and every
decode step (the accepted tokens at ``seq + 1 ..``); the catch-up hands ``_draft_extend_for_prefill`` the tokens at
positions ``[seq - E, seq)`` and the root (the token at ``seq``) as its tail, and upstream's rotation shifts them.

Example: a request at ``seq = 40`` (root at position 40) after 3 skipped steps has draft KV for positions ``< 37``;
the catch-up extends positions 37, 38, 39 (tokens at 38, 39, 40 after the rotation) into the slots
``req_to_token[slot, 37:40]`` and returns the root's top-k.  A request in the same batch that is not behind re-extends
its last position (``E = max(lag, 1)``: every request gets a row, so the top-k of every row is fresh).

Host data only: the lags are host counters per request, the window sizes come from ``batch.seq_lens_cpu``; the
tokens and slots are gathered on the device.  Only standalone drafts (an EAGLE head's extend needs the target's
hidden states of the skipped tokens) and CPU (on CUDA the extend is a captured graph) take it.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

__all__ = ["DraftLag", "TokenRing"]


class TokenRing:
    """The last ``length`` tokens of every request slot by sequence position: ``ring[slot, pos % length]``.

    Args:
        slots: request slots (``req_to_token_pool.size + 1``).
        length: positions kept; must exceed the longest catch-up plus the tokens one step writes.
        device: where SGLang keeps the batch's tensors.
    """

    def __init__(self, slots: int, length: int, device: torch.device | str) -> None:
        self.length = length
        self.ring = torch.zeros(slots, length, dtype=torch.int64, device=device)

    def write(self, slots: torch.Tensor, first: torch.Tensor, tokens: torch.Tensor) -> None:
        """``tokens [B, n]`` at positions ``first [B] + 0 .. n-1`` of ``slots [B]`` (``n <= length``)."""
        cols = (first.to(torch.int64)[:, None] + torch.arange(tokens.shape[1], device=tokens.device)) % self.length
        self.ring[slots.to(torch.int64)[:, None], cols] = tokens.to(torch.int64)

    def read(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Tokens at ``positions [T]`` of ``slots [T]``."""
        return self.ring[slots.to(torch.int64), positions.to(torch.int64) % self.length]


class DraftLag:
    """Per-request count of skipped draft extends, and the catch-up forward (module docstring).

    Args:
        max_lag: the most steps a request may fall behind before it is caught up at an off step.
        slots: request slots of the draft worker's ``req_to_token_pool``.
        max_step_tokens: the most tokens one step verifies (the largest tier's ``draft_tokens``).
        device: the draft worker's device.
    """

    def __init__(self, max_lag: int, slots: int, max_step_tokens: int, device: torch.device | str) -> None:
        self.max_lag = max_lag
        self.tokens = TokenRing(slots, max_lag + max_step_tokens + 2, device)
        self.lags: dict[str, int] = {}  # rid -> skipped extends
        self.catch_ups = 0
        self.skipped = 0

    def behind(self) -> bool:
        return bool(self.lags)

    def record_prefill(self, batch: Any, next_token_ids: torch.Tensor) -> None:
        """A prefill's tokens (its last positions) and its next token; the batch's requests start level."""
        prefix = [int(x) for x in torch.as_tensor(batch.prefix_lens).tolist()]  # host lists on a prefill batch
        ext = [int(x) for x in torch.as_tensor(batch.extend_lens).tolist()]
        keep = self.tokens.length - 1
        start = 0
        for i, (p, e) in enumerate(zip(prefix, ext)):
            n = min(e, keep)
            rows = batch.input_ids[start + e - n : start + e]
            slot = batch.req_pool_indices[i : i + 1]
            self.tokens.write(slot, torch.tensor([p + e - n], device=rows.device), rows[None])
            start += e
        self.tokens.write(batch.req_pool_indices, batch.seq_lens, next_token_ids.reshape(-1, 1))
        for r in batch.reqs:
            self.lags.pop(r.rid, None)

    def record_step(self, batch: Any, next_token_ids: torch.Tensor, draft_tokens: int) -> None:
        """A decode step's tokens: ``next_token_ids [B * draft_tokens]`` (accepted ones first) at ``seq + 1 ..``."""
        self.tokens.write(batch.req_pool_indices, batch.seq_lens + 1, next_token_ids.reshape(-1, draft_tokens))

    def skip(self, reqs: list) -> int:
        """An off step skipped its extend: every request in it is one more behind; returns the largest lag."""
        self.lags = {r.rid: self.lags.get(r.rid, 0) + 1 for r in reqs}
        self.skipped += 1
        return max(self.lags.values(), default=0)

    def catch_up(self, worker: Any, batch: Any, seq_cpu: list[int], root: torch.Tensor) -> Any:
        """Extend every request of ``batch`` over its skipped positions up to ``seq_cpu`` (host ints, the root's
        position); ``root [B]`` the tokens at ``seq``.  Returns the ``EagleDraftInput`` of upstream's
        ``_draft_extend_for_prefill`` (the roots' top-k); the lags are cleared."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        ext = [min(max(self.lags.get(r.rid, 0), 1), s) for r, s in zip(batch.reqs, seq_cpu)]
        prefix = [s - e for s, e in zip(seq_cpu, ext)]
        device = batch.seq_lens.device
        counts = torch.tensor(ext, device=device)
        rows = torch.repeat_interleave(torch.arange(len(ext), device=device), counts)
        first = torch.tensor(prefix, device=device)
        starts = torch.cumsum(counts, 0) - counts
        positions = first[rows] + torch.arange(int(counts.sum()), device=device) - starts[rows]
        slots = batch.req_pool_indices.to(torch.int64)[rows]
        sub = copy.copy(batch)  # upstream's extend path rebinds the batch's fields: a shallow copy keeps the step's
        sub.forward_mode = ForwardMode.EXTEND
        sub.input_ids = self.tokens.read(slots, positions)
        sub.out_cache_loc = worker.req_to_token_pool.req_to_token[slots, positions].to(torch.int64)
        sub.prefix_lens, sub.extend_lens, sub.extend_num_tokens = prefix, ext, sum(ext)
        sub.seq_lens = torch.tensor(seq_cpu, dtype=batch.seq_lens.dtype, device=device)
        sub.seq_lens_cpu = torch.tensor(seq_cpu, dtype=torch.int64)
        sub.seq_lens_sum = sum(seq_cpu)
        sub.extend_logprob_start_lens = list(ext)
        sub.return_logprob = False
        sub.multimodal_inputs = [None] * len(ext)
        sub.chunked_req, sub.chunked_req_next_prompt_token = None, None
        sub.spec_info = None
        self.lags = {}
        self.catch_ups += 1
        return worker.sage_upstream_prefill_extend(sub, None, root.reshape(-1))
