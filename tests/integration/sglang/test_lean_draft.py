"""``cpu_lean_draft`` (``runtimes/sglang/lean_draft.py``): the lean decoder against a naive oracle that runs SGLang's
own layer objects (``RMSNorm.forward_native``, the rotary embedding of ``get_rope``, ``SiluAndMul.forward_native``)
in the order of SGLang's ``LlamaDecoderLayer``, on random weights, ragged positions and a causal attention
stand-in for ``RadixAttention``; which decoders it refuses; and that it hands every call it does not take to the
forward it replaced.  The served path (the CPU config's e2e servers, outputs equal to plain serving, the draft's
forwards counted in ``GET /server_info``) is ``test_e2e_serving.py``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.layers.activation import SiluAndMul  # noqa: E402
from sglang.srt.layers.layernorm import RMSNorm  # noqa: E402
from sglang.srt.layers.rotary_embedding import get_rope  # noqa: E402

from sage_plugin.kernels.llama_decoder import decoder_kernel  # noqa: E402
from sage_plugin.runtimes.sglang.lean_draft import (  # noqa: E402
    LeanDraftDecoder,
    install_lean_draft,
    lean_forwards,
    lean_reason,
)

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 32, 4, 2, 8, 48, 50


class UnquantizedLinearMethod:
    """The name of SGLang's plain linear method: a layer carrying it may take the lean decoder's kernel."""


class Linear(torch.nn.Module):
    """SGLang's linear layers return ``(output, bias)``; ``plain``: they carry ``UnquantizedLinearMethod``."""

    def __init__(self, g: torch.Generator, out: int, inp: int, plain: bool = False) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out, inp, generator=g) / inp**0.5, requires_grad=False)
        self.bias = None
        if plain:
            self.quant_method = UnquantizedLinearMethod()

    def forward(self, x):
        return x @ self.weight.T, None


class CausalAttention(torch.nn.Module):
    """``RadixAttention(q, k, v, forward_batch)`` for one request: appends K / V to ``forward_batch.kv[layer]`` and
    attends each new query over the cached keys and the new ones up to its own position (GQA)."""

    def __init__(self, layer: int) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, q, k, v, forward_batch):
        t = q.shape[0]
        k, v = k.reshape(t, KV_HEADS, HEAD_DIM), v.reshape(t, KV_HEADS, HEAD_DIM)
        past_k, past_v = forward_batch.kv.get(self.layer, (k[:0], v[:0]))
        keys, values = torch.cat([past_k, k]), torch.cat([past_v, v])
        forward_batch.kv[self.layer] = (keys, values)
        g = HEADS // KV_HEADS
        qh = q.reshape(t, HEADS, HEAD_DIM).transpose(0, 1)  # [H, T, D]
        kh = keys.transpose(0, 1).repeat_interleave(g, 0)  # [H, L, D]
        vh = values.transpose(0, 1).repeat_interleave(g, 0)
        scores = qh @ kh.transpose(1, 2) * HEAD_DIM**-0.5
        p = keys.shape[0] - t
        visible = torch.arange(keys.shape[0])[None, :] <= (p + torch.arange(t))[:, None]
        out = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1) @ vh
        return out.transpose(0, 1).reshape(t, HEADS * HEAD_DIM)


class Batch:
    def __init__(self) -> None:
        self.kv: dict = {}


def _decoder(seed: int = 0, plain: bool = False, **rope_kw) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    dec = torch.nn.Module()
    dec.embed_tokens = Linear(g, VOCAB, HIDDEN)  # [V, H] rows are the embeddings
    dec.layers = torch.nn.ModuleList()
    for i in range(3):
        layer = torch.nn.Module()
        attn = torch.nn.Module()
        attn.q_size, attn.kv_size, attn.head_dim = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, HEAD_DIM
        attn.qkv_proj = Linear(g, (HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, plain)
        attn.o_proj = Linear(g, HIDDEN, HEADS * HEAD_DIM, plain)
        kw = {"rotary_dim": HEAD_DIM, "max_position": 512, "base": 10000, "is_neox_style": True} | rope_kw
        attn.rotary_emb = get_rope(HEAD_DIM, **kw)
        attn.attn = CausalAttention(i)
        mlp = torch.nn.Module()
        mlp.gate_up_proj, mlp.down_proj, mlp.act_fn = (
            Linear(g, 2 * INTER, HIDDEN, plain),
            Linear(g, HIDDEN, INTER, plain),
            SiluAndMul(),
        )
        layer.self_attn, layer.mlp = attn, mlp
        layer.input_layernorm, layer.post_attention_layernorm = RMSNorm(HIDDEN, 1e-5), RMSNorm(HIDDEN, 1e-5)
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.data = 1 + 0.1 * torch.randn(HIDDEN, generator=g)
        dec.layers.append(layer)
    dec.norm = RMSNorm(HIDDEN, 1e-5)
    dec.forward = lambda *a, **k: ("sglang's forward", a, k)  # what the lean decoder replaces
    return dec


def _oracle(dec, ids: torch.Tensor, positions: torch.Tensor, batch: Batch) -> torch.Tensor:
    """SGLang's ``LlamaModel`` order with SGLang's own norm / rotary / activation objects (native forwards)."""
    x = dec.embed_tokens.weight[ids]
    for layer in dec.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = attn.qkv_proj(layer.input_layernorm.forward_native(x))[0]
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q, k = attn.rotary_emb.forward_native(positions, q, k)
        x = x + attn.o_proj(attn.attn(q, k, v, batch))[0]
        h = layer.post_attention_layernorm.forward_native(x)
        x = x + mlp.down_proj(mlp.act_fn.forward_native(mlp.gate_up_proj(h)[0]))[0]
    return dec.norm.forward_native(x)


@pytest.mark.parametrize("plain", [False, True], ids=["operators", "kernel"])
def test_lean_decoder_equals_sglangs_layers_over_prefill_extend_and_decode(plain):
    """A prefill of 7 tokens, a 2-token extend and a 1-token decode (positions continue): the lean decoder's hidden
    states match the oracle's at every step, and the cache both write is the same; ``plain`` layers (unquantized,
    no biases) run through ``csrc/llama_decoder.cpp`` where it builds, with bfloat16-stored products too."""
    dec = _decoder(plain=plain)
    assert lean_reason(dec, 1, "cpu") is None
    lean = LeanDraftDecoder(dec)
    kernel = plain and decoder_kernel() is not None
    assert (lean.kernel_weights() is not None) == kernel
    ref_batch, lean_batch = Batch(), Batch()
    g = torch.Generator().manual_seed(1)
    pos = 0
    for t in (7, 2, 1):
        ids = torch.randint(0, VOCAB, (t,), generator=g)
        positions = torch.arange(pos, pos + t)
        want = _oracle(dec, ids, positions, ref_batch)
        got = lean(ids, positions, lean_batch)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        pos += t
    for layer, (k, v) in ref_batch.kv.items():
        torch.testing.assert_close(lean_batch.kv[layer][0], k, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(lean_batch.kv[layer][1], v, atol=2e-5, rtol=2e-5)
    assert lean.calls == 3 and lean.kernel_calls == (3 if kernel else 0)
    if kernel:  # bfloat16 products (cpu_draft_dtype): the kernel widens them as the oracle's float32 copies compute
        for layer in dec.layers:
            for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
                m.weight = torch.nn.Parameter(m.weight.to(torch.bfloat16), requires_grad=False)
        lean = LeanDraftDecoder(dec)
        batch, ids, positions = Batch(), torch.randint(0, VOCAB, (5,), generator=g), torch.arange(5)
        got = lean(ids, positions, batch)
        for layer in dec.layers:
            for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
                m.weight = torch.nn.Parameter(m.weight.float(), requires_grad=False)
        torch.testing.assert_close(got, _oracle(dec, ids, positions, Batch()), atol=2e-5, rtol=2e-5)
        assert lean.kernel_calls == 1


def test_install_replaces_the_instances_forward_and_counts_its_calls():
    model = torch.nn.Module()
    model.model = _decoder()
    original = model.model.forward
    assert lean_forwards(model) is None
    assert install_lean_draft(model, 1, "cpu") is None
    assert isinstance(model.model.forward, LeanDraftDecoder) and model.model.forward.original is original
    model.model(torch.tensor([3, 4]), torch.tensor([0, 1]), Batch())  # nn.Module __call__ -> the lean forward
    assert lean_forwards(model) == 1


def test_calls_it_does_not_take_go_to_the_replaced_forward():
    """``input_embeds``, pipeline tensors, extra keywords or M-RoPE's ``[3, T]`` positions: SGLang's forward."""
    dec = _decoder()
    lean = LeanDraftDecoder(dec)
    ids, batch = torch.tensor([1, 2]), Batch()
    for args, kwargs in [
        ((ids, torch.arange(2), batch, torch.zeros(2, HIDDEN)), {}),
        ((ids, torch.arange(2), batch, None, object()), {}),
        ((ids, torch.arange(2), batch), {"get_embedding": True}),
        ((ids, torch.zeros(3, 2, dtype=torch.long), batch), {}),
    ]:
        assert lean(*args, **kwargs)[0] == "sglang's forward"
    assert lean.calls == 0


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"tp": 2}, "tensor parallel"),
        ({"device": "cuda"}, "not a CPU draft"),
        ({"rope": {"is_neox_style": False}}, "rotary"),
        ({"rope": {"rotary_dim": HEAD_DIM // 2}}, "rotary"),
        ({"capture": [1]}, "captured"),
        ({"act": torch.nn.SiLU()}, "MLP"),
        ({"qk_norm": True}, "q / k norms"),
        ({"layer_rope": {"base": 500000}}, "rotary embeddings differ"),
        ({"norm_override": 16}, "RMSNorm"),
    ],
)
def test_refuses_what_it_does_not_compute(change, reason):
    dec = _decoder(**change.get("rope", {}))
    if "capture" in change:
        dec.layers_to_capture = change["capture"]
    if "act" in change:
        dec.layers[1].mlp.act_fn = change["act"]
    if "qk_norm" in change:
        dec.layers[0].self_attn.q_norm = RMSNorm(HEAD_DIM)
    if "layer_rope" in change:
        kw = {"rotary_dim": HEAD_DIM, "max_position": 512, "base": 10000, "is_neox_style": True}
        dec.layers[2].self_attn.rotary_emb = get_rope(HEAD_DIM, **(kw | change["layer_rope"]))
    if "norm_override" in change:
        dec.layers[1].post_attention_layernorm.variance_size_override = change["norm_override"]
    why = lean_reason(dec, change.get("tp", 1), change.get("device", "cpu"))
    assert why is not None and reason in why, why
    model = torch.nn.Module()
    model.model = dec
    assert install_lean_draft(model, change.get("tp", 1), change.get("device", "cpu")) == why
    assert lean_forwards(model) is None  # left as it was
