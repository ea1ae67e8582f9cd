"""Ragged-batch KV bookkeeping on top of transformers' ``DynamicCache``.

Every forward appends ``Q`` slots to the cache for every request of the batch.  Rotary position
is applied to keys when they are written, so a slot's order in the cache does not matter: what a
query sees is decided only by the explicit attention mask.  We therefore keep, per request, a
``committed [B, S]`` bool over slots (tokens that belong to the sequence) and build each
forward's 4-D mask from it plus the tree structure of the new tokens.  Draft-tree rows that end
up on the accepted path are committed in place (their keys were computed with the right
position and the right context); the rest become garbage that :meth:`SeqState.compact` drops.

Worked example (one request, committed prefix of 3 slots, verify a 3-node tree root->a, root->b)::

    slots:      0 1 2 | 3(root) 4(a) 5(b)
    mask rows:  root: 1 1 1 | 1 0 0
                a:    1 1 1 | 1 1 0
                b:    1 1 1 | 1 0 1
    target accepts a: commit slots 3 and 4; slot 5 is garbage until the next compaction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SeqState", "PrefillResult", "append_kv", "kv_room"]


@dataclass(slots=True)
class PrefillResult:
    """One request's prefill: per-layer ``(keys, values)`` ``[1, H, L, Dh]``, last logits ``[V]``,
    the model position of the next token and, for a target feeding an EAGLE-3 draft, its captured hidden states
    ``features`` ``[1, L, 3H]``."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    last_logits: torch.Tensor
    next_pos: int
    features: torch.Tensor | None = None


@dataclass(slots=True)
class SeqState:
    """A batch of sequences in one model's KV cache.

    Attributes:
        cache: transformers ``DynamicCache`` holding ``S`` slots per request.
        committed: ``[B, S]`` bool, slots that belong to each request's sequence.
        next_pos: ``[B]`` int64 model position of the next token to feed.
    """

    cache: object
    committed: torch.Tensor
    next_pos: torch.Tensor

    @classmethod
    def from_prefills(cls, results: list[PrefillResult]) -> "SeqState":
        """Right-pad per-request prefills into one batch (padding slots uncommitted)."""
        from transformers import DynamicCache

        lens = [r.kv[0][0].shape[2] for r in results]
        s = max(lens)
        layers = []
        for layer in range(len(results[0].kv)):
            ks, vs = [], []
            for r in results:
                k, v = r.kv[layer]
                pad = s - k.shape[2]
                ks.append(torch.nn.functional.pad(k, (0, 0, 0, pad)))
                vs.append(torch.nn.functional.pad(v, (0, 0, 0, pad)))
            layers.append((torch.cat(ks), torch.cat(vs)))
        dev = layers[0][0].device
        committed = torch.arange(s, device=dev)[None] < torch.tensor(lens, device=dev)[:, None]
        next_pos = torch.tensor([r.next_pos for r in results], dtype=torch.int64, device=dev)
        return cls(DynamicCache(ddp_cache_data=layers), committed, next_pos)

    @property
    def num_slots(self) -> int:
        return self.committed.shape[1]

    def attention_mask(
        self, intra: torch.Tensor, query_valid: torch.Tensor, extra: torch.Tensor | None = None
    ) -> torch.Tensor:
        """4-D bool mask for ``Q`` new tokens appended after the current ``S`` slots.

        Args:
            intra: ``[B, Q, Q]`` bool, which new tokens each new token sees (itself included).
            query_valid: ``[B, Q]`` bool, False on padding queries (they see only themselves,
                which keeps every softmax row non-empty and the cache free of NaNs).
            extra: ``[B, Q, S]`` bool, uncommitted old slots a query may also see (draft-tree
                ancestors written by earlier levels of this round).

        Returns:
            ``[B, 1, Q, S + Q]`` bool, True = attend.
        """
        old = self.committed[:, None, :] & query_valid[:, :, None]
        if extra is not None:
            old = old | (extra & query_valid[:, :, None])
        eye = torch.eye(intra.shape[1], dtype=torch.bool, device=intra.device)
        new = (intra & query_valid[:, :, None] & query_valid[:, None, :]) | eye
        return torch.cat([old, new], dim=2)[:, None]

    def appended(self, q: int) -> None:
        """Record that a forward appended ``q`` (uncommitted) slots per request."""
        self.committed = torch.cat([self.committed, self.committed.new_zeros(self.committed.shape[0], q)], 1)

    def commit(self, slots: torch.Tensor) -> None:
        """Mark ``slots [B, M]`` (-1 = none) committed."""
        ok = slots >= 0
        self.committed.scatter_(1, torch.where(ok, slots, 0), ok | self.committed.gather(1, slots.clamp(min=0)))

    def select(self, rows: torch.Tensor) -> None:
        """Keep only batch rows ``rows`` (drop finished requests)."""
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, rows)
            layer.values = layer.values.index_select(0, rows)
        self.committed = self.committed.index_select(0, rows)
        self.next_pos = self.next_pos.index_select(0, rows)

    def compact(self, slack: float = 0.25) -> None:
        """Gather each request's committed slots to the front when more than ``slack`` is garbage."""
        if self.committed.shape[0] == 0:
            return
        count = self.committed.sum(1)
        s_new = int(count.max())
        if s_new >= self.num_slots * (1.0 - slack):
            return
        # committed slots first, in slot order (stable sort on "not committed")
        order = torch.sort((~self.committed).to(torch.int8), dim=1, stable=True).indices[:, :s_new]
        for layer in self.cache.layers:
            idx = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = layer.keys.gather(2, idx)
            layer.values = layer.values.gather(2, idx)
        self.committed = torch.arange(s_new, device=count.device)[None] < count[:, None]


def append_kv(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Grow one cache layer (``layer.keys`` / ``layer.values`` ``[B, H, S, D]``) by the ``[B, H, Q, D]`` slots given
    (:func:`kv_room`, then the ``Q`` rows written)."""
    s, q = layer.keys.shape[2], keys.shape[2]
    for buf, new in zip(kv_room(layer, q), (keys, values)):
        buf[:, :, s : s + q] = new


def kv_room(layer, q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The contiguous buffers ``[B, H, capacity, D]`` behind one cache layer, with room for ``q`` more rows; the
    layer's ``keys`` / ``values`` become views of their first ``S + q`` rows, whose last ``q`` the caller writes.

    The buffer has room to spare (its length doubles when it fills), so an append writes ``Q`` slots instead of
    copying all ``S + Q`` as ``torch.cat`` does: a small draft's forward spent about a fifth of its time in those
    copies.  A layer whose tensors were replaced since (:meth:`SeqState.select` / :meth:`SeqState.compact` gather new
    ones) gets a new buffer here.
    """
    bufs = []
    for name in ("keys", "values"):
        old = getattr(layer, name)
        buf = getattr(layer, "_sage_" + name, None)
        s = old.shape[2]
        if (
            buf is None
            or buf.data_ptr() != old.data_ptr()
            or buf.stride() != old.stride()
            or buf.shape[:2] != old.shape[:2]
            or buf.dtype != old.dtype
            or buf.shape[2] < s + q
        ):
            buf = old.new_empty(old.shape[0], old.shape[1], max(2 * (s + q), 64), old.shape[3])
            buf[:, :, :s] = old
            setattr(layer, "_sage_" + name, buf)
        setattr(layer, name, buf[:, :, : s + q])
        bufs.append(buf)
    return bufs[0], bufs[1]
