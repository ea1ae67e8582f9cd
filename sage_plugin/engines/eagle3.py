"""An EAGLE-3 draft head in plain torch, with the weight names SGLang 0.5.23's ``LlamaForCausalLMEagle3`` loads.

Trained by ``sage train-draft --kind eagle3`` (:meth:`Eagle3Head.unroll`); the reference engine drafts with it
through :class:`sage_plugin.engines.eagle3_draft.Eagle3Draft` (:meth:`Eagle3Head.step`).

The head reads three of the target's hidden states (the residual stream entering decoder layers ``l + 1`` for each
``l`` of ``eagle_aux_hidden_state_layer_ids``, i.e. ``output_hidden_states[l + 1]`` of an HF forward), fused by
``fc``.  One decoder layer (``midlayer``) attends over ``[input_layernorm(embed(token)), hidden_norm(h)]`` (2H wide);
its pre-norm output is both the next draft step's ``h`` and, after ``norm``, the input of its own ``lm_head`` over
``draft_vocab`` tokens (``d2t[i] + i`` = the target id of draft id ``i``).  The token embedding is the target's,
frozen (SGLang hands the target's embedding to the head).

Shapes: ``feats`` [B, T, 3H] (the three captured states, concatenated low/mid/high), ``tokens`` [B, T].  Row ``p``
of draft step 0 pairs token ``x[p + 1]`` with ``fc(feats[p])`` at position ``p`` and predicts the target's
distribution for ``x[p + 2]``; step ``k`` pairs ``x[p + k + 1]`` with step ``k - 1``'s output at row ``p``, at
position ``p + k``, attending to step 0's keys at rows ``<= p`` and to its own chain (steps ``1..k`` at row ``p``):
exactly the cache a chain of draft steps sees after a draft extend (training-time test, EAGLE-3 section 3).

Worked example, T = 4, step 1, row 1: query at position 2 (token x[3], fed step 0's output of row 1) attends to
step-0 keys of rows 0 and 1 (positions 0, 1) and step-1's key of row 1 (position 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "Eagle3Shape",
    "Eagle3Head",
    "default_aux_layers",
    "rope_tables",
    "eagle3_shape",
    "read_head_files",
    "head_from_files",
]


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """SGLang's default EAGLE-3 layer ids for a ``num_layers`` target: captures before layers 2, L/2, L-3."""
    return (1, num_layers // 2 - 1, num_layers - 4)


@dataclass(frozen=True)
class Eagle3Shape:
    """Head geometry: the target's width/heads, the head's MLP width and draft vocabulary."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    draft_vocab: int
    rope_theta: float
    eps: float


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [..., head_dim] of Llama's rotary embedding (halves layout) at integer ``positions``."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ang = positions.to(torch.float32)[..., None] * inv
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


class _RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class _MidLayer(nn.Module):
    def __init__(self, s: Eagle3Shape):
        super().__init__()
        h2 = 2 * s.hidden
        self.s = s
        self.input_layernorm = _RMSNorm(s.hidden, s.eps)
        self.hidden_norm = _RMSNorm(s.hidden, s.eps)
        self.post_attention_layernorm = _RMSNorm(s.hidden, s.eps)
        attn = nn.Module()
        attn.q_proj = nn.Linear(h2, s.heads * s.head_dim, bias=False)
        attn.k_proj = nn.Linear(h2, s.kv_heads * s.head_dim, bias=False)
        attn.v_proj = nn.Linear(h2, s.kv_heads * s.head_dim, bias=False)
        attn.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)
        self.self_attn = attn
        mlp = nn.Module()
        mlp.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        mlp.up_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        mlp.down_proj = nn.Linear(s.intermediate, s.hidden, bias=False)
        self.mlp = mlp


class Eagle3Head(nn.Module):
    """EAGLE-3 head (``fc``, ``midlayer``, ``norm``, ``lm_head``, buffers ``d2t``/``t2d``) over a frozen embedding.

    ``hot_ids`` [draft_vocab] are the target ids of the draft vocabulary, ascending.
    """

    def __init__(self, shape: Eagle3Shape, embedding: torch.Tensor, hot_ids: torch.Tensor):
        super().__init__()
        s = self.shape = shape
        self.fc = nn.Linear(3 * s.hidden, s.hidden, bias=False)
        self.midlayer = _MidLayer(s)
        self.norm = _RMSNorm(s.hidden, s.eps)
        self.lm_head = nn.Linear(s.hidden, s.draft_vocab, bias=False)
        self.register_buffer("embed", embedding.detach().clone(), persistent=False)
        hot = hot_ids.to(torch.long)
        self.register_buffer("hot_ids", hot, persistent=False)
        self.register_buffer("d2t", hot - torch.arange(hot.numel()))
        t2d = torch.zeros(embedding.shape[0], dtype=torch.bool)
        t2d[hot] = True
        self.register_buffer("t2d", t2d)
        for _name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    # ----- one draft step over all rows ---------------------------------------------------------------------------
    def _qkv(self, tokens: torch.Tensor, h: torch.Tensor, pos: torch.Tensor):
        s, m = self.shape, self.midlayer
        x = torch.cat([m.input_layernorm(F.embedding(tokens, self.embed)), m.hidden_norm(h)], dim=-1)
        B, T, _ = x.shape
        q = m.self_attn.q_proj(x).view(B, T, s.heads, s.head_dim).transpose(1, 2)
        k = m.self_attn.k_proj(x).view(B, T, s.kv_heads, s.head_dim).transpose(1, 2)
        v = m.self_attn.v_proj(x).view(B, T, s.kv_heads, s.head_dim).transpose(1, 2)
        cos, sin = rope_tables(pos, s.head_dim, s.rope_theta)
        cos, sin = cos[:, None], sin[:, None]
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def _finish(self, attn: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        m = self.midlayer
        B, _, T, _ = attn.shape
        o = m.self_attn.o_proj(attn.transpose(1, 2).reshape(B, T, -1))
        resid = o + h
        x = m.post_attention_layernorm(resid)
        return m.mlp.down_proj(F.silu(m.mlp.gate_proj(x)) * m.mlp.up_proj(x)) + resid

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., draft_vocab] of a step's pre-norm output [..., H]."""
        return self.lm_head(self.norm(out))

    def unroll(self, feats: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Pre-norm outputs [B, T - k - 1, H] of draft steps ``k = 0..steps-1`` (training-time test, see module doc).

        ``feats`` [B, T, 3H], ``tokens`` [B, T] (``tokens[:, p + k + 1]`` is step ``k``'s input at row ``p``).
        """
        s = self.shape
        B, T = tokens.shape
        rep = s.heads // s.kv_heads
        rows = T - 1
        pos = torch.arange(rows, device=tokens.device).expand(B, rows)
        h = self.fc(feats[:, :rows])
        q, k0, v0 = self._qkv(tokens[:, 1:], h, pos)
        k0r, v0r = k0.repeat_interleave(rep, 1), v0.repeat_interleave(rep, 1)
        scale = s.head_dim**-0.5
        causal = torch.ones(rows, rows, dtype=torch.bool, device=tokens.device).tril()
        outs, diag_k, diag_v = [], [], []
        for step in range(steps):
            n = rows - step  # rows whose step input token exists
            if n <= 0:
                break
            if step > 0:
                q, kk, vv = self._qkv(tokens[:, step + 1 : step + 1 + n], h[:, :n], pos[:, :n] + step)
                diag_k.append(kk.repeat_interleave(rep, 1))
                diag_v.append(vv.repeat_interleave(rep, 1))
            scores = (q @ k0r[:, :, :n].transpose(-1, -2)) * scale
            scores = scores.masked_fill(~causal[:n, :n], float("-inf"))
            extra = [(q * dk[:, :, :n]).sum(-1, keepdim=True) * scale for dk in diag_k]
            probs = torch.softmax(torch.cat([scores, *extra], dim=-1), dim=-1)
            attn = probs[..., :n] @ v0r[:, :, :n]
            for i, dv in enumerate(diag_v):
                attn = attn + probs[..., n + i : n + i + 1] * dv[:, :, :n]
            h = self._finish(attn, h[:, :n])
            outs.append(h)
            diag_k = [d[:, :, : n - 1] for d in diag_k]
            diag_v = [d[:, :, : n - 1] for d in diag_v]
        return outs

    def step(
        self,
        tokens: torch.Tensor,
        h: torch.Tensor,
        positions: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One draft forward over ``Q`` new rows per request with an explicit cache.

        ``tokens`` [B, Q]; ``h`` [B, Q, 3H] (target features, fused by ``fc``) or [B, Q, H] (the head's own output
        for the row's parent); ``positions`` [B, Q]; ``past`` = (keys, values) [B, kv_heads, S, head_dim] with
        rotary applied; ``mask`` [B, 1, Q, S + Q] bool (True = attend).  Returns (pre-norm outputs [B, Q, H],
        new keys, new values) [B, kv_heads, Q, head_dim].
        """
        s = self.shape
        if h.shape[-1] != s.hidden:
            h = self.fc(h)
        q, k, v = self._qkv(tokens, h, positions)
        rep = s.heads // s.kv_heads
        keys = torch.cat([past[0], k], dim=2).repeat_interleave(rep, 1)
        vals = torch.cat([past[1], v], dim=2).repeat_interleave(rep, 1)
        attn = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)
        return self._finish(attn, h), k, v

    # ----- export ---------------------------------------------------------------------------------------------
    def sglang_state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors under the names ``LlamaForCausalLMEagle3.load_weights`` maps (``midlayer.*``, ``d2t``, ``t2d``)."""
        return {k: v.detach().clone() for k, v in self.state_dict().items()}


def eagle3_shape(cfg: dict, intermediate: int, draft_vocab: int) -> Eagle3Shape:
    """The head geometry of a Llama ``config.json`` (a target's, or a head's own: same width, heads, rope, eps)."""
    nh = cfg["num_attention_heads"]
    rope = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    return Eagle3Shape(
        hidden=cfg["hidden_size"],
        heads=nh,
        kv_heads=cfg.get("num_key_value_heads", nh),
        head_dim=cfg.get("head_dim", cfg["hidden_size"] // nh),
        intermediate=intermediate,
        draft_vocab=draft_vocab,
        rope_theta=float(rope),
        eps=float(cfg.get("rms_norm_eps", 1e-6)),
    )


def read_head_files(path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(``config.json``, ``model.safetensors`` tensors) of an exported head directory."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    path = Path(path)
    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))


def head_from_files(cfg: dict, tensors: dict[str, torch.Tensor], embedding: torch.Tensor) -> Eagle3Head:
    """An fp32 :class:`Eagle3Head` from :func:`read_head_files` over the target's ``embedding`` (on its device)."""
    d2t = tensors["d2t"].long()
    shape = eagle3_shape(cfg, cfg["intermediate_size"], cfg["draft_vocab_size"])
    head = Eagle3Head(shape, embedding.detach().float().cpu(), d2t + torch.arange(d2t.numel()))
    head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()})
    return head.to(embedding.device)
