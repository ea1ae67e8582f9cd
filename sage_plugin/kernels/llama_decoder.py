"""A Llama-family draft's decoder over a few new tokens in one call on CPU: ``csrc/llama_decoder.cpp``.

Three custom ops in ``torch.ops.sage_plugin``, built at first use (:func:`~sage_plugin.kernels.native.cpu_ops`):

* ``llama_decoder(x [B, Q, H], cos, sin [B, Q, D / 2], mask [B, Q, S + Q], weights (6 a layer), final_norm [H],
  k_bufs, v_bufs (one [B, H_kv, capacity, D] a layer, rows S .. S + Q - 1 written), cached S, heads, kv_heads, eps,
  scale) -> [B, Q, H]``: the whole layer stack;
* ``llama_layer_before(x [T, H], norm, w_qkv, cos, sin [T, D / 2], rotated, head_dim, eps) -> qkv [T, (Hq + 2 Hkv) D]``
  and ``llama_layer_after(x [T, H] (updated in place), att [T, Hq D], w_o, norm, w_gate_up, w_down, eps)``: one
  layer's work either side of a runtime's own attention.

Its consumers are the reference engine's ``engines/lean.py`` (the whole stack, the K/V rows written into the cache
buffers) and SGLang's ``runtimes/sglang/lean_draft.py`` (one layer either side of SGLang's attention); each keeps its
runtime's own layers as the fallback (transformers' modules or SGLang's, operator by operator) and the tests' oracle.
The C++ source documents the shapes; the numbers are a draft's (float rounding may differ from transformers' or
SGLang's forward, which moves no verified token).
"""

from __future__ import annotations

from typing import Any

import torch

from .native import NAMESPACE, cpu_ops

__all__ = ["decoder_kernel"]


def decoder_kernel() -> Any:
    """The ops holding the kernel (``.llama_decoder``, ``.llama_layer_before``, ``.llama_layer_after``), or None where
    it cannot be built (one warning; the drafts then run operator by operator)."""
    return cpu_ops("llama_decoder", "a draft's decoder runs operator by operator", _register_fakes)


def _register_fakes() -> None:
    @torch.library.register_fake(f"{NAMESPACE}::llama_decoder")
    def _(x, cos, sin, mask, weights, final_norm, k_bufs, v_bufs, cached, heads, kv_heads, eps, scale):
        return torch.empty_like(x)

    @torch.library.register_fake(f"{NAMESPACE}::llama_layer_before")
    def _(x, norm, w_qkv, cos, sin, rotated, head_dim, eps):
        return x.new_empty(x.shape[0], w_qkv.shape[0])

    @torch.library.register_fake(f"{NAMESPACE}::llama_layer_after")
    def _(x, att, w_o, norm, w_gate_up, w_down, eps) -> None:
        return None
