"""VLM engine models: multimodal requests, :class:`VLMModel` (with SpecVLM pruning), text drafts.

Requests
--------
:func:`make_vlm_request` renders the processor's chat template with the image and keeps the full
token ids (image placeholders included) as ``GenRequest.prompt_ids``; ``GenRequest.mm`` is a
:class:`VLMInput` with the processor's tensors (``pixel_values``, ``image_grid_thw``,
``mm_token_type_ids``, ``image_sizes``, ...) and the ids of every vision-related special token.

Models
------
:class:`VLMModel` subclasses :class:`~sage_plugin.engines.lm.TextModel`: ``forward``
(decode / tree tokens) is inherited unchanged.  That is correct for all four families because
their ``ForConditionalGeneration.forward`` without pixel inputs only embeds ``input_ids`` and
hands ``position_ids`` / ``attention_mask`` untouched to the language model: Qwen2(.5)-VL skips
its own 3-D position computation when ``position_ids`` are given and broadcasts 2-D ids to the
three M-RoPE axes, and transformers uses a 4-D mask as-is (LLaVA-OV and SmolVLM build no mask of
their own).  Only the prefill differs:

* it runs the full multimodal forward of ONE request (``logits_to_keep=1``);
* ``next_pos`` is ``L + rope_delta`` for M-RoPE models (the model's ``rope_deltas`` after the
  prefill) and ``L`` otherwise, so decode tokens sit at text positions ``next_pos + offset``.

SpecVLM draft-side pruning (``role="draft"``, ``prune_ratio = r > 0``)
----------------------------------------------------------------------
``round(r * n_visual)`` visual placeholder tokens (image/video pad tokens, not the
start/end/row markers) are removed from the DRAFT's prefill only; the target always sees all.
A request with a video (``pixel_values_videos``) prunes at ``prune_ratio_video`` instead (SAGE's
defaults: 0.8 for images, 0.9 for videos; e.g. 48 video tokens at 0.9 keep 5).

* **Scores** (:mod:`.scores`).  The target model (``role="target"``,
  ``collect_visual_scores=True``) measures, during its normal prefill, the attention of the text
  queries that follow the last visual token (the question and the assistant header; at most
  ``score_queries`` of them) to every visual key and stores it in
  ``request.meta["visual_scores"]`` (``[n_visual]`` float32, CPU).  The engine prefills the
  target before the draft for the same ``GenRequest`` object, so the draft finds it there.  If
  the scores are absent (or were computed for a different number of visual tokens) the draft
  computes them the same way from its own unpruned prefill (``score_fallback="self"``, one extra
  draft prefill) or samples the kept tokens uniformly (``score_fallback="uniform"``).
* **Selection**: :func:`~.scores.select_visual_keep`.
* **Pruned prefill.** The draft runs its normal multimodal forward; a forward pre-hook on the
  language model removes the dropped rows from ``inputs_embeds`` (after the vision features were
  merged) and from the positions, and drops the 2-D padding mask (one request: pure causal).
  Positions: M-RoPE keeps the kept tokens' original 3-D positions and ``next_pos = L +
  rope_delta`` of the full layout (what the unpruned model uses, so draft and target agree on
  decode positions); 1-D RoPE (LLaVA-OV, SmolVLM) compacts positions to ``0..n_keep-1`` and
  ``next_pos = n_keep`` (as SpecVLM does).

:class:`TextDraftForVLM` is a text-only causal LM used as the draft of a VLM target that shares
its text vocabulary (SmolLM2 for SmolVLM): its prefill drops every vision special token (and any
id outside its vocabulary) from the prompt, with compacted positions.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal

import torch

from sage_plugin.data.prompts import multimodal_messages
from sage_plugin.engines.kv import PrefillResult

# absolute (not ``..``): sage_plugin/engines has no __init__.py, so pytest's importlib mode would
# collect this package as top-level ``vlm`` and a parent-relative import would fail
from sage_plugin.engines.lm import GenRequest, TextModel

from .scores import _collect_scores, _ScoreCollector, select_visual_keep

__all__ = ["VLMInput", "VLMModel", "TextDraftForVLM", "make_vlm_request"]

logger = logging.getLogger(__name__)

# vision-related special tokens of the supported processors (dropped by TextDraftForVLM)
_VISION_TOKENS = (
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<image>",
    "<video>",
    "<fake_token_around_image>",
    "<global-img>",
)
_ROW_COL = re.compile(r"^<row_\d+_col_\d+>$")


# ---------------------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------------------
@dataclass(slots=True)
class VLMInput:
    """Multimodal part of a :class:`GenRequest` (``GenRequest.mm``).

    Attributes:
        image: image path (None for a text-only prompt).
        messages: the multimodal chat messages that were rendered.
        tensors: processor outputs other than ``input_ids`` / ``attention_mask`` (batch of one).
        vision_token_ids: ids of every vision-related special token of the tokenizer (image/video
            placeholders, start/end markers, SmolVLM row/col and global-image tokens).
    """

    image: Path | None
    messages: list[dict]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    vision_token_ids: frozenset[int] = frozenset()


def _vision_token_ids(processor) -> frozenset[int]:
    tok = getattr(processor, "tokenizer", processor)
    added = tok.get_added_vocab()
    names = set(_VISION_TOKENS) | {
        getattr(processor, a, None) for a in ("image_token", "video_token", "fake_image_token", "global_image_token")
    }
    return frozenset(i for s, i in added.items() if s in names or _ROW_COL.match(s))


def make_vlm_request(processor, prompt, request_id: str | None = None) -> GenRequest:
    """Render ``prompt`` (a :class:`~sage_plugin.data.prompts.Prompt`, image optional) with the
    processor's chat template; ``prompt_ids`` are the full ids incl. image placeholders."""
    msgs = multimodal_messages(prompt)
    out = processor.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    ids = [int(t) for t in out["input_ids"][0].tolist()]
    tensors = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask") and isinstance(v, torch.Tensor)}
    mm = VLMInput(prompt.image, msgs, tensors, _vision_token_ids(processor))
    return GenRequest(ids, mm, request_id if request_id is not None else prompt.id)


# ---------------------------------------------------------------------------------------------
# engine models
# ---------------------------------------------------------------------------------------------
def _language_model(model) -> torch.nn.Module:
    inner = getattr(model, "model", model)
    for name in ("language_model", "text_model"):
        if hasattr(inner, name):
            return getattr(inner, name)
    return model.get_decoder()


class VLMModel(TextModel):
    """Engine model for a HF VLM (Qwen2-VL, Qwen2.5-VL, LLaVA-OneVision, SmolVLM).

    Args:
        model: ``...ForConditionalGeneration`` loaded with SDPA attention.
        processor: its processor (kept for callers; the prefill uses ``request.mm``).
        prune_ratio: fraction of visual tokens removed from the prefill (``role="draft"`` only).
        prune_ratio_video: the same for a request with a video (None: ``prune_ratio``).
        role: ``"target"`` collects visual scores for the draft; ``"draft"`` prunes.
        attn_mass: SpecVLM stage-I attention share (see :func:`select_visual_keep`).
        score_fallback: ``"self"`` or ``"uniform"`` when the target left no scores.
        score_queries: at most this many text queries (the last ones) are scored.
        collect_visual_scores: target only; False skips the score pass.
    """

    def __init__(
        self,
        model: Any,
        processor: Any = None,
        prune_ratio: float = 0.0,
        role: Literal["target", "draft"] = "target",
        attn_mass: float = 0.4,
        score_fallback: Literal["self", "uniform"] = "self",
        score_queries: int = 128,
        collect_visual_scores: bool = True,
        prune_ratio_video: float | None = None,
    ) -> None:
        super().__init__(model)
        if role not in ("target", "draft"):
            raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
        video_ratio = prune_ratio if prune_ratio_video is None else prune_ratio_video
        for name, value in (("prune_ratio", prune_ratio), ("prune_ratio_video", video_ratio)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
            if value > 0 and role != "draft":
                raise ValueError("visual-token pruning applies to the draft only")
        if score_fallback not in ("self", "uniform"):
            raise ValueError(f"score_fallback must be 'self' or 'uniform', got {score_fallback!r}")
        self.processor = processor
        self.prune_ratio = float(prune_ratio)
        self.prune_ratio_video = float(video_ratio)
        self.role = role
        self.attn_mass = float(attn_mass)
        self.score_fallback = score_fallback
        self.score_queries = int(score_queries)
        self.collect_visual_scores = collect_visual_scores
        cfg = model.config
        vis = set()
        for name in ("image_token_id", "image_token_index", "video_token_id", "video_token_index"):
            val = getattr(cfg, name, None)
            if isinstance(val, int) and val >= 0:
                vis.add(val)
        self.visual_token_ids = frozenset(vis)
        self.language_model = _language_model(model)
        self.mrope = hasattr(getattr(model, "model", None), "get_rope_index")
        self.last_prefill_info: dict = {}
        self._score_layers = 0

    def linear_root(self) -> torch.nn.Module:
        """A VLM draft's ``cpu_draft_dtype`` covers its language model only (the vision tower runs at prefill, at
        row counts the rows kernel does not take, where a bfloat16 weight would be widened on every call)."""
        return self.language_model

    # ------------------------------------------------------------------------------------------
    def _model_inputs(self, request: GenRequest) -> dict:
        ids = torch.tensor([request.prompt_ids], dtype=torch.int64, device=self.device)
        kw: dict = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        mm = request.mm
        if isinstance(mm, VLMInput):
            kw.update({k: v.to(self.device) for k, v in mm.tensors.items()})
        elif isinstance(mm, dict):
            kw.update({k: v.to(self.device) for k, v in mm.items() if isinstance(v, torch.Tensor) and k not in kw})
        return kw

    def _scored_forward(self, kw: dict, vis_pos: torch.Tensor, **extra):
        """Model forward that also returns per-visual-token attention scores."""
        seq = kw["input_ids"].shape[1]
        after = torch.arange(int(vis_pos.max()) + 1, seq)
        rows = after[-self.score_queries :] if after.numel() else torch.tensor([seq - 1])
        col = _ScoreCollector(rows, vis_pos.cpu())
        with _collect_scores(self.language_model, col):
            out = self.model(**kw, **extra)
        self._score_layers = col.layers
        if col.layers == 0:  # the language model did not route through SCORE_ATTN
            logger.warning("no attention layer reported visual scores; falling back to uniform selection")
            return out, None
        return out, col.scores()

    @torch.inference_mode()
    def prefill(self, request: GenRequest) -> PrefillResult:
        kw = self._model_inputs(request)
        ids = kw["input_ids"]
        seq = ids.shape[1]
        is_vis = torch.zeros(seq, dtype=torch.bool)
        if self.visual_token_ids:
            is_vis = torch.isin(ids[0].cpu(), torch.tensor(sorted(self.visual_token_ids)))
        vis_pos = is_vis.nonzero().flatten()
        n_vis = vis_pos.numel()
        has_pixels = any(k.startswith("pixel_values") for k in kw)
        ratio = self.prune_ratio_video if "pixel_values_videos" in kw else self.prune_ratio
        n_drop = int(round(ratio * n_vis)) if self.role == "draft" and has_pixels else 0
        info: dict = {"n_visual": n_vis, "n_dropped": n_drop, "score_source": None}
        keep = None
        if n_drop > 0:
            scores = request.meta.get("visual_scores") if isinstance(request.meta, dict) else None
            if isinstance(scores, torch.Tensor) and scores.numel() == n_vis:
                info["score_source"] = "target"
            elif self.score_fallback == "self":
                _, scores = self._scored_forward(kw, vis_pos, use_cache=False, logits_to_keep=1)
                info["score_source"] = "self" if scores is not None else "uniform"
                info["score_layers"] = self._score_layers
            else:
                scores = None
                info["score_source"] = "uniform"
            kept_vis = vis_pos[select_visual_keep(scores, n_vis, n_vis - n_drop, self.attn_mass)]
            keep = torch.sort(torch.cat([(~is_vis).nonzero().flatten(), kept_vis])).values.to(self.device)
            out = self._pruned_forward(kw, keep)
        elif self.role == "target" and self.collect_visual_scores and n_vis > 0 and has_pixels:
            out, scores = self._scored_forward(kw, vis_pos, use_cache=True, logits_to_keep=1)
            info["score_layers"] = self._score_layers
            if scores is not None:
                request.meta["visual_scores"] = scores
        else:
            out = self.model(**kw, use_cache=True, logits_to_keep=1)
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        if self.mrope:
            deltas = getattr(self.model.model, "rope_deltas", None)
            delta = int(deltas.reshape(-1)[0]) if isinstance(deltas, torch.Tensor) and has_pixels else 0
            next_pos = seq + delta
        else:
            next_pos = seq if keep is None else int(keep.numel())
        info["cache_slots"] = int(kv[0][0].shape[2])
        info["next_pos"] = next_pos
        self.last_prefill_info = info
        return PrefillResult(kv, out.logits[0, -1].float(), next_pos)

    def _pruned_forward(self, kw: dict, keep: torch.Tensor):
        """Full multimodal forward with rows outside ``keep`` removed before the language model."""
        n_keep = int(keep.numel())

        def hook(module, args, kwargs):
            emb = kwargs["inputs_embeds"]
            kwargs["inputs_embeds"] = emb.index_select(1, keep)
            pos = kwargs.get("position_ids")
            if pos is not None and self.mrope:
                kwargs["position_ids"] = pos.index_select(pos.ndim - 1, keep)
            else:
                kwargs["position_ids"] = torch.arange(n_keep, device=emb.device)[None]
            kwargs["attention_mask"] = None
            return args, kwargs

        handle = self.language_model.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            return self.model(**kw, use_cache=True, logits_to_keep=1)
        finally:
            handle.remove()


class TextDraftForVLM(TextModel):
    """Text-only causal LM as the draft of a VLM target with the same text vocabulary.

    The prefill drops every vision special token (``request.mm.vision_token_ids``, the extra
    ``drop_token_ids`` and any id outside the draft's vocabulary) from the prompt; positions are
    compacted (``next_pos`` = number of remaining tokens).  ``forward`` is TextModel's.
    """

    def __init__(self, model: Any, drop_token_ids: Iterable[int] = (), head_ids: torch.Tensor | None = None) -> None:
        super().__init__(model, head_ids)
        self.drop_token_ids = frozenset(int(i) for i in drop_token_ids)

    def text_ids(self, request: GenRequest) -> list[int]:
        drop = set(self.drop_token_ids)
        mm = request.mm
        if isinstance(mm, VLMInput):
            drop |= mm.vision_token_ids
        return [t for t in request.prompt_ids if t not in drop and 0 <= t < self.vocab_size]

    def prefill(self, request: GenRequest) -> PrefillResult:
        return super().prefill(GenRequest(self.text_ids(request), None, request.request_id))
