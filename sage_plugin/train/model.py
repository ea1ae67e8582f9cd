"""The draft model: a small tied-embedding Llama with a restricted-vocabulary output head.

The draft is a ``LlamaForCausalLM``-shaped model (``--layers/--hidden/--heads/--intermediate``) whose rope, norm
and special-token settings come from the target's ``config.json``; ``--init-embeddings pca`` starts its embedding
from the target's, projected on their top principal directions.

Restricted-vocabulary head (``--head-vocab N``, default 8192)
------------------------------------------------------------
The output layer is the tied embedding matrix; computing logits over all 49,152 tokens costs about six times the
rest of a 2-layer d=256 draft.  Training therefore keeps only the set S of the N most frequent *target labels*
(plus special tokens; the measured coverage is logged).  Every token outside S shares one embedding row

    u = 0.5 * mean_{s in S} E_s  +  0.5 * sum_{s in S} softmax(a)_s E_s        (a: learned logits over S)

which is used both as their input embedding (so rare input tokens read as "some rare token") and, tied, as their
output row in the exported full-vocabulary model.  Because u is a convex combination of rows of S, for every final
hidden state h the logit of any rare token is u.h = sum_s w_s (E_s.h) <= max_{s in S} E_s.h, and the gap is at least
0.5 * (max - mean of the S logits), which is large for any trained model, so **a token outside S can never be the
draft's argmax** (equality needs all 8k logits equal; fp16 rounding is far below the gap).  The exported model is
an ordinary tied-embedding Llama of the full vocabulary (no bias, no custom code); ``sage_draft.json`` lists S so
an engine may slice the head to S for a cheaper draft step.  ``--head-vocab 0`` trains the full softmax instead.
Positions whose target label lies outside S are excluded from the loss (they are counted as misses in the
reported agreement).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["target_config", "llama_config", "CompactDraft", "pca_embeddings", "select_head_vocab"]


def target_config(target_dir: Path) -> dict:
    """The target's HF ``config.json`` as a dict."""
    return json.loads((Path(target_dir) / "config.json").read_text())


def llama_config(target_cfg: dict, args, vocab_size: int):
    """The draft's ``LlamaConfig``: size from ``args``, rope/norm/special tokens from the target's config."""
    from transformers import LlamaConfig

    rope = target_cfg.get("rope_parameters") or {
        "rope_theta": target_cfg.get("rope_theta", 10000.0),
        "rope_type": "default",
    }
    heads = args.heads
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=args.kv_heads or heads,
        head_dim=args.hidden // heads,
        max_position_embeddings=target_cfg.get("max_position_embeddings", 8192),
        rope_parameters=dict(rope),
        rms_norm_eps=target_cfg.get("rms_norm_eps", 1e-5),
        tie_word_embeddings=True,
        bos_token_id=target_cfg.get("bos_token_id"),
        eos_token_id=target_cfg.get("eos_token_id"),
        pad_token_id=target_cfg.get("pad_token_id"),
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        initializer_range=0.02,
        dtype="float32",
    )


class CompactDraft(nn.Module):
    """Llama body + tied output head over the kept ids S; all other ids share one convex-combination row.

    ``body.embed_tokens.weight`` holds the rows of S (in ``keep_ids`` order).  Input ids outside S use
    ``u = 0.5 * mean(E_S) + 0.5 * softmax(rare_logits) @ E_S``.  Logits are over S only (a token outside S can
    never win the argmax in the exported full model: see the module docstring).
    """

    def __init__(self, config, keep_ids: torch.Tensor, full_vocab: int):
        super().__init__()
        from transformers import LlamaModel

        self.full_vocab = full_vocab
        self.restricted = keep_ids.numel() < full_vocab
        k = keep_ids.numel()
        config.vocab_size = k
        self.body = LlamaModel(config)
        self.register_buffer("keep_ids", keep_ids.clone().long())
        to_compact = torch.full((full_vocab,), k, dtype=torch.long)
        to_compact[keep_ids] = torch.arange(k)
        self.register_buffer("to_compact", to_compact)
        self.rare_logits = nn.Parameter(torch.zeros(k)) if self.restricted else None

    @property
    def head_weight(self) -> torch.Tensor:
        return self.body.embed_tokens.weight

    def rare_row(self) -> torch.Tensor | None:
        if not self.restricted:
            return None
        e = self.head_weight
        return 0.5 * e.mean(0) + 0.5 * (torch.softmax(self.rare_logits.float(), 0).to(e.dtype) @ e)

    def embedding_matrix(self) -> torch.Tensor:
        e = self.head_weight
        return torch.cat([e, self.rare_row()[None]]) if self.restricted else e

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = self.to_compact[input_ids.long()]
        x = F.embedding(ids, self.embedding_matrix())
        h = self.body(inputs_embeds=x, use_cache=False).last_hidden_state
        return h @ self.head_weight.t()

    def full_embedding(self) -> torch.Tensor:
        """The (full_vocab, hidden) tied embedding of the exported model."""
        with torch.no_grad():
            e = self.head_weight.detach().float()
            full = torch.empty(self.full_vocab, e.shape[1])
            if self.restricted:
                full[:] = self.rare_row().detach().float()
            full[self.keep_ids] = e
            return full


def pca_embeddings(target_dir: Path, hidden: int, std: float = 0.02) -> torch.Tensor | None:
    """Target token embeddings projected on their top ``hidden`` principal directions, rescaled to RMS ``std``."""
    from safetensors import safe_open

    path = Path(target_dir) / "model.safetensors"
    if not path.is_file():
        return None
    with safe_open(str(path), "pt") as f:
        names = [k for k in f.keys() if k.endswith("embed_tokens.weight")]
        if not names:
            return None
        e = f.get_tensor(names[0]).float()
    if hidden > e.shape[1]:
        return None
    cov = e.t() @ e
    _, vecs = torch.linalg.eigh(cov.double())
    proj = e @ vecs[:, -hidden:].flip(1).float()
    return proj * (std / proj.pow(2).mean().sqrt())


def select_head_vocab(counts: torch.Tensor, n: int, always: Iterable[int]) -> torch.Tensor:
    """Sorted ids of the ``n`` most frequent tokens (ties by id) plus ``always`` (special tokens)."""
    vocab = counts.numel()
    always = sorted({int(i) for i in always if 0 <= int(i) < vocab})
    if n <= 0 or n >= vocab:
        return torch.arange(vocab)
    score = counts.double() * vocab - torch.arange(vocab, dtype=torch.double)  # ties broken by lower id
    score[always] = float("inf")
    keep = torch.topk(score, max(n, len(always))).indices
    return torch.sort(keep).values
