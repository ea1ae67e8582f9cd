"""Visual-attention scores and SpecVLM visual-token selection (draft-side pruning).

* **Scores.** During a prefill, the attention of selected text query rows (in practice the ones
  that follow the last visual token) to every visual key, averaged over heads, queries and
  layers (``[n_visual]`` float32, CPU).  How: a registered attention function
  (:data:`SCORE_ATTN`) that calls transformers' SDPA kernel with the very same arguments (so the
  prefill's output is bitwise that of plain SDPA) and additionally recomputes ``softmax(q k^T)``
  for the selected query rows only (``n_q x L`` per head and layer, cheap); the language model's
  config points to it only for the duration of the prefill (:func:`_collect_scores`).
* **Selection** (SpecVLM's two stages, Ji et al. 2025, :func:`select_visual_keep`): keep
  the highest-scoring tokens until their cumulative share reaches ``attn_mass`` (0.4) of the
  total, capped at the number to keep; fill the rest of the quota by ``linspace`` over the
  remaining tokens in prompt order.  ``attn_mass=1.0`` keeps purely the top-scoring tokens.
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import torch

__all__ = ["SCORE_ATTN", "select_visual_keep"]

SCORE_ATTN = "sage_sdpa_visual_scores"
"""Name of the registered attention function that is SDPA plus visual-score collection."""


class _ScoreCollector:
    """Accumulates, per layer, the mean attention of selected query rows to the visual keys."""

    def __init__(self, query_rows: torch.Tensor, visual_cols: torch.Tensor) -> None:
        self.query_rows = query_rows
        self.visual_cols = visual_cols
        self.total = torch.zeros(visual_cols.numel(), dtype=torch.float32)
        self.layers = 0

    def add(self, module, query: torch.Tensor, key: torch.Tensor, attention_mask, scaling) -> None:
        rows = self.query_rows.to(query.device)
        q = query[0, :, rows].float()  # [H, n, D]
        k = key[0].float()  # [Hkv, K, D]
        if k.shape[0] != q.shape[0]:
            k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
        scale = scaling if scaling is not None else 1.0 / math.sqrt(q.shape[-1])
        logits = torch.matmul(q, k.transpose(-1, -2)) * scale  # [H, n, K]
        offset = k.shape[1] - query.shape[2]  # cached keys before this forward's queries
        if attention_mask is None:
            allowed = torch.arange(k.shape[1], device=q.device)[None] <= (rows + offset)[:, None]
            logits = logits.masked_fill(~allowed, float("-inf"))
        else:
            m = (
                attention_mask[0, 0, rows.clamp(max=attention_mask.shape[2] - 1)]
                if attention_mask.shape[2] > 1
                else attention_mask[0, 0]
            )
            logits = logits.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else logits + m.float()
        probs = torch.softmax(logits, dim=-1)[..., self.visual_cols.to(q.device)]  # [H, n, n_vis]
        self.total += probs.mean(dim=(0, 1)).cpu()
        self.layers += 1

    def scores(self) -> torch.Tensor:
        return self.total / max(self.layers, 1)


_COLLECTOR: contextvars.ContextVar[_ScoreCollector | None] = contextvars.ContextVar("sage_visual_scores", default=None)


def _scoring_sdpa(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    col = _COLLECTOR.get()
    if col is not None:
        col.add(module, query, key, attention_mask, kwargs.get("scaling"))
    return out


_REGISTERED = False


def _register_score_attention() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SCORE_ATTN, _scoring_sdpa)
    AttentionMaskInterface.register(SCORE_ATTN, sdpa_mask)
    _REGISTERED = True


@contextlib.contextmanager
def _collect_scores(language_model, collector: _ScoreCollector):
    """Route ``language_model``'s attention through :func:`_scoring_sdpa` for one forward."""
    _register_score_attention()
    cfg = language_model.config
    old = cfg._attn_implementation
    if old != "sdpa":
        raise ValueError(f"visual scores need attn_implementation='sdpa', model uses {old!r}")
    token = _COLLECTOR.set(collector)
    cfg._attn_implementation = SCORE_ATTN
    try:
        yield collector
    finally:
        cfg._attn_implementation = old
        _COLLECTOR.reset(token)


def select_visual_keep(scores: torch.Tensor | None, n_visual: int, n_keep: int, attn_mass: float = 0.4) -> torch.Tensor:
    """Indices (ascending) of the ``n_keep`` of ``n_visual`` visual tokens to keep (SpecVLM).

    Stage I keeps the highest-scoring tokens until their cumulative share of the total score
    reaches ``attn_mass`` (at most ``n_keep`` tokens); stage II fills the rest of the quota by
    ``linspace`` over the remaining tokens in prompt order.  ``scores=None`` is pure ``linspace``.

    >>> select_visual_keep(torch.tensor([.05, .5, .05, .1, .1, .2]), 6, 3).tolist()
    [0, 1, 5]
    >>> select_visual_keep(torch.tensor([.05, .5, .05, .1, .1, .2]), 6, 3, attn_mass=1.0).tolist()
    [1, 3, 5]
    >>> select_visual_keep(None, 6, 2).tolist()
    [0, 5]
    """
    n_keep = max(0, min(int(n_keep), n_visual))
    chosen = torch.zeros(n_visual, dtype=torch.bool)
    if scores is not None and n_keep > 0:
        s = scores.float().clamp(min=0)
        order = torch.argsort(s, descending=True, stable=True)
        total = float(s.sum())
        if total > 0:
            cum = torch.cumsum(s[order], 0) / total
            # smallest prefix whose share reaches attn_mass
            n1 = int((cum < attn_mass - 1e-9).sum()) + 1
        else:
            n1 = 0
        chosen[order[: min(n1, n_keep)]] = True
    rest = (~chosen).nonzero().flatten()
    need = n_keep - int(chosen.sum())
    if need > 0:
        pick = (
            torch.linspace(0, rest.numel() - 1, need).round().long() if need > 1 else torch.zeros(1, dtype=torch.long)
        )
        chosen[rest[pick]] = True
    return chosen.nonzero().flatten()
