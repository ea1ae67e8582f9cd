"""The layout of an extend call of SGLang's CPU paged attention (:mod:`.attention_ops`), shared by its layers.

An extend forward calls ``extend_attention_cpu`` once per layer with the same lengths and mask; what depends on them
only (each padded query row's source row, which keys come from ``k_extend`` and which from the paged cache, the
``[bs, Lq, L]`` visibility, the paged-attention kernel's per-request metadata, the folded additive masks) is built
once (:func:`_extend_layout`) and reused while the metadata repeat, compared by value.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ....kernels.attention import group_mask

__all__: list[str] = []


def _additive(visible: torch.Tensor, group: int) -> torch.Tensor | None:
    """``visible [R, Lq, L]`` bool as ``kernels.attention.folded_sdpa``'s folded additive mask (0 / -inf), None if all
    visible."""
    if bool(visible.all()):
        return None
    add = torch.zeros(visible.shape, dtype=torch.float32).masked_fill_(~visible, float("-inf"))[:, None]
    return group_mask(add, visible.shape[1], group)


def _extend_visibility(
    op: str,
    custom_mask: torch.Tensor | None,
    is_causal: bool,
    prefix: torch.Tensor,
    ext: torch.Tensor,
    seq: torch.Tensor,
    lq: int,
    lk: int,
) -> torch.Tensor:
    """``[bs, Lq, L]`` bool: which key position each (padded) query row of each request may attend to."""
    i = torch.arange(lq)[None, :, None]
    j = torch.arange(lk)[None, None, :]
    rel = j - prefix[:, None, None]  # key index inside the extend part (< 0: prefix)
    valid = (i < ext[:, None, None]) & (j < seq[:, None, None])
    if custom_mask is None:
        return valid & (rel <= i) if is_causal else valid
    flat = custom_mask.reshape(-1)
    flat = flat if flat.dtype == torch.bool else flat != 0
    ext3, seq3 = ext[:, None, None], seq[:, None, None]
    qlen_sizes, full_sizes = ext * ext, ext * seq
    if flat.numel() == int(qlen_sizes.sum()):  # QLEN_ONLY: [E_b, E_b] blocks, prefix always visible
        idx = (torch.cumsum(qlen_sizes, 0) - qlen_sizes)[:, None, None] + i * ext3 + rel
        in_tree = rel >= 0
    elif flat.numel() == int(full_sizes.sum()):  # FULL_MASK: [E_b, seq_b] blocks
        idx = (torch.cumsum(full_sizes, 0) - full_sizes)[:, None, None] + i * seq3 + j
        in_tree = torch.ones_like(valid)
    else:
        raise RuntimeError(
            f"{op}: custom_mask has {flat.numel()} entries; expected sum(E*E)={int(qlen_sizes.sum())} (QLEN_ONLY) "
            f"or sum(E*seq_len)={int(full_sizes.sum())} (FULL_MASK)"
        )
    picked = flat[idx.clamp(0, flat.numel() - 1)]
    return valid & (picked | ~in_tree)


class _Layout(NamedTuple):
    """What every layer of one extend forward shares: it depends on the lengths and the mask only."""

    q_flat: torch.Tensor  # [bs * Lq] row of q_extend each padded query reads (0 for padding)
    valid_flat: torch.Tensor  # [T] the real query rows among the bs * Lq padded ones
    out_rows: torch.Tensor  # [T] their rows of o_extend
    cached: torch.Tensor  # [bs, L] bool: keys read from the paged cache
    fresh_keys: tuple  # (padded key row b * L + j, k_extend row) of each key taken from k_extend; () without
    visible: torch.Tensor  # [bs, Lq, L] bool, contiguous
    meta: torch.Tensor  # [bs, 5] int64: the paged-attention kernel's (q_row, n_q, n_cached, n_keys, new_row)
    masks: dict  # query heads per KV head -> the folded additive mask (``_additive``), made at first use

    def mask(self, group: int) -> torch.Tensor | None:
        if group not in self.masks:
            self.masks[group] = _additive(self.visible, group)
        return self.masks[group]


#: the last layout built and the metadata it was built from (compared by value: a forward's layers hit it, and a
#: new forward whose tensors happen to reuse the old objects or addresses never reads a stale one)
_LAST: list = [None, None]


def _extend_layout(op, seq, ext, start, custom_mask, is_causal: bool, fresh: bool) -> _Layout | None:
    """The shared :class:`_Layout` of an extend call (None: nothing to attend), reused while the metadata repeat."""
    mask = None if custom_mask is None else custom_mask.reshape(-1)
    key = (seq, ext, start, mask, is_causal, fresh)
    last_key, last = _LAST
    if last_key is not None and _same_metadata(last_key, key):
        return last
    prefix = seq - ext
    if bool((prefix < 0).any()) or bool((ext < 0).any()):
        raise RuntimeError(f"{op}: need 0 <= extend_seq_lens <= seq_lens")
    lq, lk = int(ext.max()), int(seq.max())
    lay = None
    if lq > 0:
        i, j = torch.arange(lq), torch.arange(lk)
        q_valid = i < ext[:, None]
        q_rows = torch.where(q_valid, start[:, None] + i, 0)
        fresh_keys: tuple = ()
        cached = j < (prefix if fresh else seq)[:, None]
        if fresh:
            new = (j >= prefix[:, None]) & (j < seq[:, None])  # [bs, L]: keys of this extend
            b_idx, j_idx = new.nonzero(as_tuple=True)
            fresh_keys = (b_idx * lk + j_idx, start[b_idx] + j_idx - prefix[b_idx])
        visible = _extend_visibility(op, custom_mask, is_causal, prefix, ext, seq, lq, lk).contiguous()
        valid_flat = q_valid.reshape(-1).nonzero().reshape(-1)
        meta = torch.stack((start, ext, prefix if fresh else seq, seq, start), 1)
        lay = _Layout(q_rows.reshape(-1), valid_flat, q_rows[q_valid], cached, fresh_keys, visible, meta, {})
    _LAST[:] = [tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in key), lay]
    return lay


def _same_metadata(a: tuple, b: tuple) -> bool:
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (
                isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
                and x.shape == y.shape and torch.equal(x, y)
            ):  # fmt: skip
                return False
        elif x != y:
            return False
    return True
