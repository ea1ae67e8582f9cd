"""Attention read in place from a paged K/V cache, for the few query rows of decoding and tree verification (CPU).

The custom op ``torch.ops.sage_plugin.paged_attention`` (``csrc/paged_attention.cpp``, built at first use by
:func:`~sage_plugin.kernels.native.cpu_ops`; its fake kernel writes nothing, as ``o`` is its only output).  Request
``b`` of a call is one row of ``meta`` ``[bs, 5]`` int64: ``(q_row, n_q, n_cached, n_keys, new_row)``: it owns query rows
``q_row .. q_row + n_q - 1`` of ``q`` ``[T, H, D]`` (the output goes to the same rows of ``o`` ``[T, H, Dv]``) and
keys ``j < n_keys``; key ``j`` is the cache row ``slots[b, j]`` of ``k_buf`` / ``v_buf`` ``[P, H_kv, D | Dv]`` when
``j < n_cached`` (multiplied by ``key_scale`` / ``value_scale``), else row ``new_row + j - n_cached`` of ``k_new`` /
``v_new`` ``[N, H_kv, D | Dv]`` (an extend's own keys, as given).  Query row ``i`` sees key ``j`` under ``mode`` 0
(all), 1 (causal: ``j <= n_keys - n_q + i``) or 2 (``visible[b, i, j]``, bool ``[bs, Lq, L]``).  Query head ``h``
reads KV head ``h // (H / H_kv)``; scores are ``q . k * sm_scale`` and the softmax runs over the visible keys only.

Worked example: a tree verify of one request with 300 cached tokens and 4 nodes (root, two children of the root, a
grandchild under the first) passes ``meta = [[start, 4, 300, 304, start]]``, ``slots[0, :300]`` the request's cache
slots, ``k_new`` the 4 nodes' keys and ``visible[0]`` ``[4, 304]``: every row sees keys 0..299, and node ``i`` also
sees ``300 + a`` for each ancestor-or-self ``a`` (row 3: keys 300, 301, 303).  A decode of 16 requests passes
``meta[r] = (r, 1, seq_r, seq_r, 0)``, mode 0, no ``k_new``.

Nothing is gathered: each (request, KV head) task reads its keys and values once, in place.  A row's result depends
only on its own query and visible keys (fixed summation orders, invisible keys skipped): a tree-verify row and the
decode row that later sees the same keys give the same bits.  Taken for float32 queries, outputs and caches and at
most a few query rows per request (:func:`kernel_takes`; a prefill's long extend keeps torch's flash-style SDPA).
"""

from __future__ import annotations

from typing import Any

import torch

from .native import NAMESPACE, cpu_ops

__all__ = ["ALWAYS_ROWS", "MAX_QUERY_ROWS", "SMALL_CALL_ROWS", "attention_kernel", "kernel_takes"]

#: query rows per request the kernel always takes (decode, a 2-token verify or draft extend), and the most it takes
#: in a call of at most :data:`SMALL_CALL_ROWS` query rows in all; above, torch's SDPA runs its products as matrix
#: products and wins (per call on the 2-core Xeon, 9 / 3 heads of 64, 300 cached tokens, torch / kernel us: decode of
#: 1 / 16 requests 196 / 119, 1,229 / 769; extend 1 x 2 275 / 128, 16 x 2 1,529 / 1,153, 1 x 8 325 / 266, 4 x 4
#: 556 / 468, 16 x 4 1,602 / 1,629, 1 x 16 390 / 400; 16 x 4 over 600 tokens 2,418 / 3,084)
ALWAYS_ROWS, MAX_QUERY_ROWS, SMALL_CALL_ROWS = 2, 8, 16


def attention_kernel() -> Any:
    """The ops holding the kernel (``.paged_attention(q, o, k_buf, v_buf, k_new, v_new, slots, meta, visible, mode,
    sm_scale, key_scale, value_scale)``: ``o`` written in place, an empty ``k_new`` / ``v_new`` / ``visible`` for "not
    given"), or None where it cannot be built."""
    return cpu_ops("paged_attention", "attention gathers the cache rows and runs torch's SDPA", _register_fakes)


def _register_fakes() -> None:
    @torch.library.register_fake(f"{NAMESPACE}::paged_attention")
    def _(q, o, k_buf, v_buf, k_new, v_new, slots, meta, visible, mode, sm_scale, key_scale, value_scale) -> None:
        return None


def kernel_takes(query_rows: int, requests: int, *tensors: torch.Tensor) -> bool:
    """Whether the kernel computes this call: ``tensors`` (queries, outputs, caches, an extend's own K / V) CPU float32
    with unit stride in the head dimension, and at most ``query_rows`` per request as above (a prefill's long extend
    keeps torch's flash-style SDPA)."""
    few = query_rows <= ALWAYS_ROWS or (query_rows <= MAX_QUERY_ROWS and query_rows * requests <= SMALL_CALL_ROWS)
    return few and all(t.device.type == "cpu" and t.dtype == torch.float32 and t.stride(-1) == 1 for t in tensors)
