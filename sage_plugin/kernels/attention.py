"""Grouped-query attention with the query heads of each KV head folded into its query rows (torch only).

``g = H / H_kv`` query heads share a KV head (head ``h = j * g + i`` reads KV head ``j``, as ``repeat_kv`` does).
Instead of repeating every key / value head ``g`` times (what SDPA's GQA path does on CPU once a mask is given), the
queries are folded::

    query [B, H, Q, D] -> [B, H_kv, g * Q, D]    mask [B, 1, Q, S] -> [B, 1, g * Q, S] (the Q-row block g times)

and one ``torch.nn.functional.scaled_dot_product_attention`` runs: the same arithmetic per query row.  Used by the
reference engine's HF attention (``engines/attention.py``, ``engines/lean.py``) and, where the paged-attention kernel
does not take a call, SGLang's CPU attention ops (``runtimes/sglang/cpu_ops/attention_ops.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["folded_sdpa", "group_mask"]


def group_mask(mask: torch.Tensor, q: int, g: int) -> torch.Tensor:
    """``mask [B, 1, Q or 1, S]`` as the folded queries see it: ``[B, 1, g*Q, S]``, the Q-row block ``g`` times; a
    mask with one query row (the same for every query) is returned as it is and broadcasts over the folded rows."""
    if g == 1 or mask.shape[2] == 1:
        return mask
    return torch.cat([mask] * g, dim=2)  # repeat's copy cost 4x a cat's here


def folded_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """``query [B, H, Q, D]``, ``key [B, H_kv, S, D]``, ``value [B, H_kv, S, Dv]`` -> ``[B, H, Q, Dv]``; ``mask`` is
    already folded (:func:`group_mask`: ``[B, 1, g*Q or 1, S]``, bool or additive), None for every key visible."""
    b, h, q, d = query.shape
    kvh = key.shape[1]
    out = F.scaled_dot_product_attention(
        query.reshape(b, kvh, (h // kvh) * q, d), key, value, attn_mask=mask, dropout_p=dropout, scale=scale
    )
    return out.view(b, h, q, value.shape[-1])
