"""The standalone draft's decoder on CPU without SGLang's per-layer staging (``cpu_lean_draft``, default on).

A small draft's forward is bound by host work: in SGLang's model path the bundled 4-layer draft (hidden 256) costs
several times what the same layers cost in the reference engine's :class:`~sage_plugin.engines.lean.LeanDecoder`,
and most of the difference is Python around the arithmetic: each
layer's residual staging (``layer_boundary``: prepare / finish of two stages), the native RMSNorm's six small
operators, a rotary embedding that gathers its cos / sin rows again in every layer, and ``nn.Module`` dispatch.
:class:`LeanDraftDecoder` replaces the draft's ``LlamaModel.forward`` (on the instance; the target is never
touched) with the same layers over the same parameters: SGLang's own linear layers (so the plugin's CPU kernels
and ``cpu_draft_dtype`` weights apply as before), ``torch.nn.functional.rms_norm``, the rotary rows gathered once
per forward, and each layer's ``RadixAttention`` (the attention backend, its KV writes and tree masks unchanged).
Where every layer's products are plain float32 / bfloat16 weights the rows kernel takes (unquantized, not AMX-packed,
no biases) and the forward has at most ``kernels.linear.KERNEL_MAX_ROWS`` tokens, each layer is two calls of
``kernels/csrc/llama_decoder.cpp`` around its ``RadixAttention`` (``llama_layer_before``: RMSNorm, q/k/v product, rotary;
``llama_layer_after``: o product, residual, RMSNorm, gate/up product, SiLU gate, down product, residual) instead of about
twenty operators.  Its numbers may differ from SGLang's forward by float rounding: it drafts, the target verifies, so
no output token can change (the e2e tests compare with plain serving).

Shapes (SGLang's flattened batch): ``input_ids`` / ``positions`` ``[T]`` (T tokens of every request of the
forward), hidden states ``[T, H]``; ``q`` ``[T, heads * head_dim]``, ``k`` / ``v`` ``[T, kv_heads * head_dim]``.

Taken only where the draft is a Llama-family SGLang decoder this forward computes exactly (:func:`lean_reason`:
one rank, no pipeline stages, full neox-style rotary with 1-D positions, SiLU MLP, no captured layers); anything
else keeps SGLang's forward, as does any call with ``input_embeds`` or pipeline tensors.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...kernels import linear as _linear
from ...kernels.llama_decoder import decoder_kernel

__all__ = ["LeanDraftDecoder", "install_lean_draft", "lean_forwards", "lean_reason"]


def lean_reason(decoder: Any, tp_size: int, device: str) -> str | None:
    """Why :class:`LeanDraftDecoder` cannot run ``decoder`` (an SGLang ``LlamaModel``-like module), or None."""
    if torch.device(device).type != "cpu":
        return "not a CPU draft (CUDA graphs capture SGLang's own forward)"
    if tp_size != 1:
        return "tensor parallel (each rank holds a shard; SGLang's layers reduce across ranks)"
    pp = getattr(decoder, "pp_group", None)
    if pp is not None and getattr(pp, "world_size", 1) != 1:
        return "pipeline stages"
    layers = getattr(decoder, "layers", None)
    if not layers or not hasattr(decoder, "embed_tokens") or not hasattr(decoder, "norm"):
        return "no decoder layers / embedding / final norm"
    if getattr(decoder, "layers_to_capture", None):
        return "layers captured for an EAGLE head"
    norms = [decoder.norm, *(n for layer in layers for n in _norms(layer))]
    if any(type(n).__name__ != "RMSNorm" or getattr(n, "variance_size_override", None) is not None for n in norms):
        return "a norm other than a plain RMSNorm"
    first = getattr(getattr(layers[0], "self_attn", None), "rotary_emb", None)
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None or not all(hasattr(attn, n) for n in ("qkv_proj", "o_proj", "attn")):
            return "a layer without qkv_proj / o_proj / attn"
        if not all(hasattr(mlp, n) for n in ("gate_up_proj", "down_proj")) or type(mlp.act_fn).__name__ != "SiluAndMul":
            return "a layer whose MLP is not gate_up -> SiLU and mul -> down"
        rope = getattr(attn, "rotary_emb", None)
        if type(rope).__name__ != "RotaryEmbedding" or not rope.is_neox_style or rope.rotary_dim != attn.head_dim:
            return "a rotary embedding other than full neox-style RoPE"
        if rope is not first and not torch.equal(rope.cos_sin_cache, first.cos_sin_cache):
            return "layers whose rotary embeddings differ (the lean decoder gathers one cos / sin per forward)"
        if any(hasattr(attn, n) for n in ("q_norm", "k_norm")):
            return "per-head q / k norms"
    return None


class LeanDraftDecoder:
    """``decoder.forward`` as a plain function of (ids, positions, forward batch) (module docstring).

    Worked example, one request extending by 2 tokens at positions 7, 8 through a 4-layer draft: ``input_ids``
    ``[2]`` -> embeddings ``[2, 256]``; the rotary rows ``cos_sin_cache[[7, 8]]`` ``[2, 64]`` split into cos / sin
    ``[2, 1, 32]`` once; per layer RMSNorm -> ``qkv_proj`` ``[2, 384]`` -> q ``[2, 4, 64]`` / k ``[2, 1, 64]``
    rotated -> ``attn`` (writes the two K / V rows into the draft's pool, attends over the cached prefix) ->
    ``o_proj`` + residual -> RMSNorm -> ``gate_up_proj`` -> SiLU(gate) * up -> ``down_proj`` + residual; the
    final RMSNorm gives ``[2, 256]`` to SGLang's logits processor.
    """

    def __init__(self, decoder: Any) -> None:
        self.decoder = decoder
        self.original = decoder.forward  # SGLang's own (bound) forward, for the calls this one does not take
        first = decoder.layers[0].self_attn
        self.rope = first.rotary_emb
        self.q_size, self.kv_size, self.head_dim = first.q_size, first.kv_size, first.head_dim
        self.calls = 0  # forwards taken (GET /server_info: sage.lean_draft_forwards)
        self.kernel_calls = 0  # of which through the kernel (two calls a layer)
        self._weights: list[tuple] | None | bool = False  # per layer (norm, qkv, o, norm, gate_up, down); False: unread

    def kernel_weights(self) -> list[tuple] | None:
        """Each layer's weights for ``csrc/llama_decoder.cpp``, or None where a layer has what it does not compute
        (read at the first forward, after the loader and ``cpu_draft_dtype`` have stored the weights)."""
        if self._weights is False:
            self._weights = _kernel_weights(self.decoder) if decoder_kernel() is not None else None
        return self._weights

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any,
                 input_embeds: Any = None, pp_proxy_tensors: Any = None, **kwargs: Any) -> torch.Tensor:  # fmt: skip
        if input_embeds is not None or pp_proxy_tensors is not None or kwargs or positions.dim() != 1:
            return self.original(input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors, **kwargs)
        self.calls += 1
        dec, hd = self.decoder, self.head_dim
        x = F.embedding(input_ids, dec.embed_tokens.weight)
        weights = self.kernel_weights()
        if weights is not None and x.dtype == torch.float32 and x.shape[0] <= _linear.KERNEL_MAX_ROWS:
            return self._kernel_forward(x.contiguous(), positions, forward_batch, weights)
        cos, sin = self.rope.cos_sin_cache.index_select(0, positions).to(x.dtype).unsqueeze(1).chunk(2, dim=-1)
        for layer in dec.layers:
            attn, mlp = layer.self_attn, layer.mlp
            h = _rms(x, layer.input_layernorm)
            q, k, v = attn.qkv_proj(h)[0].split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q, k = _rotate(q, cos, sin, hd), _rotate(k, cos, sin, hd)
            x = x + attn.o_proj(attn.attn(q, k, v, forward_batch))[0]
            gu = mlp.gate_up_proj(_rms(x, layer.post_attention_layernorm))[0]
            half = gu.shape[-1] // 2
            x = x + mlp.down_proj(F.silu(gu[:, :half]) * gu[:, half:])[0]
        return _rms(x, dec.norm)

    def _kernel_forward(self, x: torch.Tensor, positions: torch.Tensor, forward_batch: Any, weights: list[tuple]):
        self.kernel_calls += 1
        kernel, dec, hd = decoder_kernel(), self.decoder, self.head_dim
        cos, sin = (t.contiguous() for t in self.rope.cos_sin_cache.index_select(0, positions).float().chunk(2, -1))
        rotated = (self.q_size + self.kv_size) // hd
        for layer, (n1, qkv, o, n2, gate_up, down, eps) in zip(dec.layers, weights):
            q, k, v = kernel.llama_layer_before(x, n1, qkv, cos, sin, rotated, hd, eps).split(
                [self.q_size, self.kv_size, self.kv_size], dim=-1
            )
            att = layer.self_attn.attn(q, k, v, forward_batch)
            kernel.llama_layer_after(x, att.reshape(x.shape[0], -1).contiguous(), o, n2, gate_up, down, eps)
        return _rms(x, dec.norm)


def _kernel_weights(decoder: Any) -> list[tuple] | None:
    """``LeanDraftDecoder.kernel_weights`` of ``decoder``: per layer ``(input norm, qkv, o, post-attention norm,
    gate_up, down, eps)``, or None."""
    out = []
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        norms = _norms(layer)
        plain = all(
            type(getattr(m, "quant_method", None)).__name__ == "UnquantizedLinearMethod"
            and not getattr(m, "use_intel_amx_backend", False)
            and getattr(m, "bias", None) is None
            and isinstance(getattr(m, "weight", None), torch.Tensor)
            and m.weight.device.type == "cpu"
            and _linear.kernel_streams(m.weight)
            for m in linears
        ) and all(n.weight.dtype == torch.float32 and n.weight.is_contiguous() for n in norms)
        if not plain or norms[0].variance_epsilon != norms[1].variance_epsilon:
            return None
        qkv, o, gate_up, down = (m.weight for m in linears)
        out.append((norms[0].weight, qkv, o, norms[1].weight, gate_up, down, float(norms[0].variance_epsilon)))
    return out


def _norms(layer: Any) -> tuple:
    return getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)


def _rms(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """SGLang's ``RMSNorm`` (float32 statistics, ``x / rms(x) * weight``) as one fused operator."""
    out = F.rms_norm(x.float(), (x.shape[-1],), norm.weight.float(), norm.variance_epsilon)
    return out.to(x.dtype)


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Neox-style rotary embedding of ``t`` ``[T, heads * head_dim]`` with ``cos`` / ``sin`` ``[T, 1, head_dim / 2]``."""
    x = t.view(t.shape[0], -1, head_dim)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).view(t.shape)


def install_lean_draft(model: Any, tp_size: int, device: str) -> str | None:
    """Give the SGLang draft ``model`` (a ``...ForCausalLM`` with ``.model``) the lean decoder; returns why not
    (and leaves the model as it is), or None once installed."""
    decoder = getattr(model, "model", None)
    reason = "no .model decoder" if decoder is None else lean_reason(decoder, tp_size, device)
    if reason is None:
        decoder.forward = LeanDraftDecoder(decoder)
    return reason


def lean_forwards(model: Any, kernel: bool = False) -> int | None:
    """Forwards the lean decoder of the SGLang draft ``model`` took (``kernel``: of them, those through
    ``csrc/llama_decoder.cpp``), or None where it has none."""
    forward = getattr(getattr(model, "model", None), "__dict__", {}).get("forward")
    if not isinstance(forward, LeanDraftDecoder):
        return None
    return forward.kernel_calls if kernel else forward.calls
