"""Grouped-query SDPA for HF models on CPU: no ``repeat_kv`` copy when an attention mask is given.

transformers' ``sdpa`` attention repeats every key/value head ``H / H_kv`` times whenever a mask is passed
(padding, tree masks), which on CPU costs more than the attention itself: for SmolLM2 (9 query heads, 3 KV heads)
a batch-64 decode step with a 600-slot cache copies ~5 GB.  This implementation instead folds the ``g = H / H_kv``
query heads that share a KV head into the query-length axis::

    query [B, H, Q, D] -> [B, H_kv, g*Q, D]     (head h = j*g + i uses KV head j, as repeat_kv does)
    mask  [B, 1, Q, S] -> [B, 1, g*Q, S]        (the Q-row block repeated g times)
    out   [B, H_kv, g*Q, D] -> [B, Q, H, D]

and calls ``torch.nn.functional.scaled_dot_product_attention`` once (``kernels.attention.folded_sdpa``, shared with
SGLang's CPU attention ops).  It is the same arithmetic as ``sdpa`` (tests
compare them).  Registered under the name ``"sage_sdpa"`` (with ``sdpa``'s mask builder) when this module is
imported; :func:`sage_plugin.engines.lm.load_causal_lm` selects it.
"""

from __future__ import annotations

import torch.nn.functional as F

from ..kernels.attention import folded_sdpa, group_mask

__all__ = ["ATTN_IMPLEMENTATION", "group_mask", "grouped_sdpa", "register"]

ATTN_IMPLEMENTATION = "sage_sdpa"


def grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """HF attention-interface function: ``query [B,H,Q,D]``, ``key/value [B,H_kv,S,D]`` -> (``[B,Q,H,D]``, None)."""
    b, h, q, d = query.shape
    kvh = key.shape[1]
    g = h // kvh
    if attention_mask is None and q > 1:
        # causal without an explicit mask: sdpa's own GQA path (no copy) is exact here
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        out = F.scaled_dot_product_attention(
            query, key, value, dropout_p=dropout, scale=scaling, is_causal=bool(causal), enable_gqa=g > 1
        )
        return out.transpose(1, 2).contiguous(), None
    mask = attention_mask
    if mask is not None:
        mask = group_mask(mask[:, :, :, : key.shape[-2]], q, g)
    out = folded_sdpa(query, key, value, mask, scaling, dropout)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register ``"sage_sdpa"`` with transformers (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, grouped_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION
