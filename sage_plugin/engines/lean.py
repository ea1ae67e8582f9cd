"""A draft's decode-time forward without transformers' per-module Python.

A small draft's forward at a few tokens is bound by host work, not arithmetic: for the bundled 4-layer draft (hidden
256) under half of a forward is operator time; the rest is transformers' module calls, decorators, cache and mask
bookkeeping.  :class:`LeanDecoder` runs the same layers over the same parameters and
cache with the operators alone: the model's own RMSNorm, rotary embedding and activation modules, one fused
q/k/v product and one fused gate/up product per layer (``kernels.linear.linear``, the rows kernel on CPU), and the
engine's grouped-query attention (``attention.grouped_sdpa``: query heads folded onto their KV head) with its mask
built once per forward instead of once per layer.  On CPU, where the model allows (float32 activations, SiLU gates, no
biases, widths the rows kernel takes, at most ``kernels.linear.KERNEL_MAX_ROWS`` new tokens in all), the whole layer stack
runs in one call of ``kernels/csrc/llama_decoder.cpp`` instead of about 150 operator calls in Python; the
operator-by-operator path stays the fallback and the tests' oracle for it.  Only drafts use it (the target's logits stay transformers' own: plain decoding and verification
must compute the same numbers); a draft's numbers may differ from transformers' by float rounding, which moves
no verified token.

Models: Llama-family decoders whose layers are ``input_layernorm -> self_attn (q/k/v/o_proj) -> residual ->
post_attention_layernorm -> mlp (gate/up/down_proj, gated activation) -> residual`` (``llama``, ``mistral`` without a
sliding window, ``qwen2``); anything else keeps transformers' forward (:func:`lean_supported`).

Shapes: ``input_ids`` / ``positions`` ``[B, Q]``, ``mask`` ``[B, 1, Q, S + Q]`` bool (``SeqState.attention_mask``),
cache layers ``[B, H_kv, S, D]`` grown by ``Q`` slots; returns the final hidden states ``[B, Q, H]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..kernels import linear as _linear
from ..kernels.linear import linear
from ..kernels.llama_decoder import decoder_kernel
from .attention import group_mask
from .kv import append_kv, kv_room

__all__ = ["LeanDecoder", "lean_supported"]

_FAMILIES = ("llama", "mistral", "qwen2")


def lean_supported(model: Any) -> bool:
    """Whether ``model`` (an HF causal LM) has the layer structure :class:`LeanDecoder` runs."""
    cfg = getattr(model, "config", None)
    decoder = getattr(model, "model", None)
    if cfg is None or getattr(cfg, "model_type", None) not in _FAMILIES or decoder is None:
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return False
    layers = getattr(decoder, "layers", None)
    if not layers or not hasattr(decoder, "rotary_emb") or not hasattr(decoder, "norm"):
        return False
    attn, mlp = layers[0].self_attn, layers[0].mlp
    needed = (
        all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        and all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn"))
        and not any(hasattr(attn, n) for n in ("q_norm", "k_norm"))  # qwen3-style per-head norms
    )
    return needed


def _cat_bias(*mods: Any) -> torch.Tensor | None:
    biases = [m.bias for m in mods]
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else m.weight.new_zeros(m.weight.shape[0]) for b, m in zip(biases, mods)])


@dataclass(slots=True)
class _Layer:
    norm1: Any
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: Any
    norm2: Any
    gate_up: torch.Tensor
    down: Any
    act: Any


class LeanDecoder:
    """The decoder of ``model`` as a plain function of (state, ids, positions, mask) (module docstring).

    The fused q/k/v and gate/up weights are copies made once, in the dtype the model's linears have then (call
    :meth:`rebuild` after changing it, as ``TextModel.store_weights`` does).  ``fused=False`` keeps the
    operator-by-operator path even where the one-call kernel applies (the tests' oracle).
    """

    def __init__(self, model: Any, fused: bool = True) -> None:
        if not lean_supported(model):
            raise ValueError(f"{type(model).__name__}: not a Llama-family decoder the lean forward runs")
        self.model = model
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scaling = self.head_dim**-0.5
        self.fused = fused
        self.layers: list[_Layer] = []
        self._flat: list[torch.Tensor] | None = None  # the kernel's weights, 6 a layer, where it applies
        self.rebuild()

    def rebuild(self) -> None:
        """(Re)make the fused weights from the model's current parameters."""
        self.layers = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(
                _Layer(
                    norm1=layer.input_layernorm,
                    qkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous(),
                    qkv_bias=_cat_bias(a.q_proj, a.k_proj, a.v_proj),
                    o=a.o_proj,
                    norm2=layer.post_attention_layernorm,
                    gate_up=torch.cat([m.gate_proj.weight, m.up_proj.weight]).contiguous(),
                    down=m.down_proj,
                    act=m.act_fn,
                )
            )
        self._flat = self._kernel_weights() if self.fused else None

    def _kernel_weights(self) -> list[torch.Tensor] | None:
        """The weights of ``csrc/llama_decoder.cpp`` (per layer: input norm, q/k/v, o, post-attention norm, gate/up,
        down), or None where the kernel does not apply to this model (it then never runs)."""
        cfg, decoder = self.model.config, self.model.model
        norms = [decoder.norm] + [m for layer in self.layers for m in (layer.norm1, layer.norm2)]
        products = [w for layer in self.layers for w in (layer.qkv, layer.o.weight, layer.gate_up, layer.down.weight)]
        applies = (
            getattr(cfg, "hidden_act", None) == "silu"
            and all(
                layer.qkv_bias is None and layer.o.bias is None and layer.down.bias is None for layer in self.layers
            )
            and all(n.weight.dtype == torch.float32 and n.weight.device.type == "cpu" for n in norms)
            and all(_linear.kernel_streams(w) for w in products)
            and len({getattr(n, "variance_epsilon", None) for n in norms}) == 1
            and self.head_dim % 2 == 0
            and decoder_kernel() is not None
        )
        if not applies:
            return None
        self.eps = float(decoder.norm.variance_epsilon)
        return [
            t
            for layer in self.layers
            for t in (
                layer.norm1.weight,
                layer.qkv,
                layer.o.weight,
                layer.norm2.weight,
                layer.gate_up,
                layer.down.weight,
            )
        ]

    def _kernel_takes(self, x: torch.Tensor, cos: torch.Tensor, state: Any) -> bool:
        rows = x.shape[0] * x.shape[1]
        return (
            self._flat is not None
            and x.dtype == torch.float32
            and cos.shape[-1] == self.head_dim  # full rotary (the kernel's)
            and rows <= _linear.KERNEL_MAX_ROWS
            and all(layer.keys.dtype == torch.float32 for layer in state.cache.layers)
        )

    @torch.inference_mode()
    def __call__(self, state: Any, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor):
        """Final hidden states ``[B, Q, H]`` of ``Q`` new tokens per request, appended to ``state``'s cache."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        decoder = self.model.model
        bsz, q = input_ids.shape
        x = decoder.embed_tokens(input_ids)
        cos, sin = decoder.rotary_emb(x, positions)
        if self._kernel_takes(x, cos, state):
            s = state.cache.layers[0].keys.shape[2]
            room = [kv_room(layer, q) for layer in state.cache.layers]
            half = self.head_dim // 2  # the angles' cos / sin (transformers repeats them for the two halves)
            angles = (cos[..., :half].contiguous(), sin[..., :half].contiguous())
            out = decoder_kernel().llama_decoder(
                x, *angles, mask[:, 0].contiguous(), self._flat, decoder.norm.weight, [k for k, _ in room],
                [v for _, v in room], s, self.heads, self.kv_heads, self.eps, self.scaling,
            )  # fmt: skip
            state.appended(q)
            return out
        nq, nkv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        g = self.heads // self.kv_heads
        # grouped_sdpa's mask, made once for every layer: the Q-row block repeated for the g query heads of a KV
        # head, as an additive float mask (what SDPA turns a bool mask into on every call)
        rows = group_mask(mask, q, g)
        additive = torch.zeros(rows.shape, dtype=x.dtype, device=x.device).masked_fill_(~rows, float("-inf"))
        for layer, cache in zip(self.layers, state.cache.layers):
            h = layer.norm1(x)
            qkv = linear(h, layer.qkv, layer.qkv_bias)
            qh = qkv[..., :nq].view(bsz, q, self.heads, self.head_dim).transpose(1, 2)
            kh = qkv[..., nq : nq + nkv].view(bsz, q, self.kv_heads, self.head_dim).transpose(1, 2)
            vh = qkv[..., nq + nkv :].view(bsz, q, self.kv_heads, self.head_dim).transpose(1, 2)
            qh, kh = apply_rotary_pos_emb(qh, kh, cos, sin)
            append_kv(cache, kh, vh)
            out = F.scaled_dot_product_attention(
                qh.reshape(bsz, self.kv_heads, g * q, self.head_dim), cache.keys, cache.values, attn_mask=additive,
                scale=self.scaling,
            )  # fmt: skip
            x = x + layer.o(out.reshape(bsz, self.heads, q, self.head_dim).transpose(1, 2).reshape(bsz, q, nq))
            gu = linear(layer.norm2(x), layer.gate_up)
            half = gu.shape[-1] // 2
            x = x + layer.down(layer.act(gu[..., :half]) * gu[..., half:])
        state.appended(q)
        return decoder.norm(x)
