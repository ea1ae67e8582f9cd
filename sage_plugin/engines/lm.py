"""Engine models: what the reference engine needs from an HF model (the engine's view of a target or draft).

An engine model prefills one request (returning its KV rows, last logits and the model position of the
next token) and runs batched forwards of new tokens at explicit positions under an explicit 4-D
mask.  Text LMs use 1-D rotary positions; M-RoPE VLMs (Qwen2-VL / Qwen2.5-VL) accept the same
2-D ``position_ids`` for text tokens and broadcast them to their three axes (text position +
the request's rope delta), so only their prefill differs (see :mod:`sage_plugin.engines.vlm`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from ..kernels.linear import linear, stored_as
from .attention import register as register_attention
from .kv import PrefillResult, SeqState
from .lean import LeanDecoder, lean_supported

__all__ = [
    "EngineModel",
    "GenRequest",
    "RowsLinear",
    "TextModel",
    "load_causal_lm",
    "store_draft_weights",
    "store_linear_weights",
    "use_fast_linears",
]


@dataclass(slots=True)
class GenRequest:
    """One generation request.

    Attributes:
        prompt_ids: token ids of the rendered prompt (chat template applied).
        mm: optional multimodal inputs understood by VLM engine models (e.g. an image path or
            processor outputs); text models ignore it.
        request_id: caller's identifier (kept in outputs).
    """

    prompt_ids: list[int]
    mm: Any = None
    request_id: str = ""
    meta: dict = field(default_factory=dict)


class EngineModel(Protocol):
    model: Any
    vocab_size: int

    def prefill(self, request: GenRequest) -> PrefillResult: ...

    def forward(
        self, state: SeqState, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor: ...


class TextModel:
    """Any HF causal LM with rotary positions (Llama, Qwen2, SmolLM2, ...).

    Args:
        model: the HF model.
        head_ids: optional ``[S]`` token ids; ``forward`` then computes logits only for these rows of the
            output layer and returns ``-inf`` for every other id (a *restricted head*, for drafts whose
            other tokens can never be the argmax, e.g. those written by ``sage train-draft``, which list
            the ids in ``sage_draft.json``).  The draft step costs ``S/V`` of the full head; the
            distribution is the model's renormalised over ``S``.  Drafts only propose tokens, so this
            cannot change what verification emits.  ``prefill`` keeps the full head (one row).

    ``capture_layers`` (set by the engine for a target feeding an EAGLE-3 draft): after every ``prefill`` /
    ``forward`` the residual stream entering layers ``l + 1`` for those ``l`` is kept, concatenated, in
    ``PrefillResult.features`` / ``last_features`` ``[B, Q, 3H]``.
    """

    def __init__(self, model: Any, head_ids: torch.Tensor | None = None) -> None:
        self.model = model
        self.capture_layers: list[int] | None = None
        self.last_features: torch.Tensor | None = None
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device
        self.lean: LeanDecoder | None = None  # set by use_lean (drafts)
        self.head_ids = None
        if head_ids is not None:
            self.head_ids = head_ids.to(self.device, torch.int64)
            self._head_w = model.get_output_embeddings().weight.detach().index_select(0, self.head_ids)

    @torch.inference_mode()
    def prefill(self, request: GenRequest) -> PrefillResult:
        ids = torch.tensor([request.prompt_ids], dtype=torch.int64, device=self.device).clamp(max=self.vocab_size - 1)
        cap = self.capture_layers is not None
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, output_hidden_states=cap)
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        return PrefillResult(kv, out.logits[0, -1].float(), ids.shape[1], self._features(out))

    def _features(self, out) -> torch.Tensor | None:
        if self.capture_layers is None:
            return None
        return torch.cat([out.hidden_states[i + 1] for i in self.capture_layers], dim=-1)

    @torch.inference_mode()
    def sequence_logits(self, ids: list[int]) -> torch.Tensor:
        """``[L, V]`` logits after every token of ``ids`` (teacher-forced, no cache), with the same head as
        :meth:`forward` (restricted to ``head_ids`` where set)."""
        x = torch.tensor([ids], dtype=torch.int64, device=self.device).clamp(max=self.vocab_size - 1)
        if self.head_ids is None:
            return self.model(input_ids=x).logits[0].float()
        small = linear(self.model.get_decoder()(input_ids=x).last_hidden_state[0], self._head_w).float()
        full = small.new_full((small.shape[0], self.vocab_size), float("-inf"))
        return full.index_copy_(1, self.head_ids, small)

    @torch.inference_mode()
    def forward(
        self, state: SeqState, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Logits ``[B, Q, V]`` of ``Q`` new tokens per request (appended to ``state``'s cache)."""
        if self.head_ids is None and self.lean is not None:
            hidden = self.lean(state, input_ids.clamp(0, self.vocab_size - 1), positions, mask)
            return self.model.get_output_embeddings()(hidden).float()
        if self.head_ids is None:
            ids = input_ids.clamp(0, self.vocab_size - 1)
            out = self.model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=mask,
                past_key_values=state.cache,
                use_cache=True,
                output_hidden_states=self.capture_layers is not None,
            )
            state.appended(ids.shape[1])
            self.last_features = self._features(out)
            return out.logits.float()
        small, head_ids = self.forward_head(state, input_ids, positions, mask)
        full = small.new_full((*small.shape[:2], self.vocab_size), float("-inf"))
        return full.index_copy_(2, head_ids, small)

    @torch.inference_mode()
    def forward_head(
        self, state: SeqState, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`forward` over the ids the head scores: ``(logits [B, Q, S], head_ids [S])``, or ``(logits [B, Q,
        V], None)`` without a restricted head.  Every other id's logit is ``-inf`` in :meth:`forward`, so a draft
        step reads the same distribution from an ``S``-column softmax (``S / V`` = 1/6 for the bundled draft)."""
        if self.head_ids is None:
            return self.forward(state, input_ids, positions, mask), None
        ids = input_ids.clamp(0, self.vocab_size - 1)
        if self.lean is not None:
            return linear(self.lean(state, ids, positions, mask), self._head_w).float(), self.head_ids
        hidden = self.model.get_decoder()(
            input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=state.cache, use_cache=True
        ).last_hidden_state
        state.appended(ids.shape[1])
        return linear(hidden, self._head_w).float(), self.head_ids

    def use_lean(self, on: bool = True) -> bool:
        """Run :meth:`forward` / :meth:`forward_head` through :class:`~.lean.LeanDecoder` where the model has its
        layer structure (a draft's forwards; a target keeps transformers' own); ``on=False``: transformers' forward
        again (``CpuConfig.cpu_lean_draft``).  Returns whether the lean decoder runs."""
        if not on:
            self.lean = None
        elif self.lean is None and self.capture_layers is None and lean_supported(self.model):
            self.lean = LeanDecoder(self.model)
        return self.lean is not None

    def linear_root(self) -> torch.nn.Module:
        """The module whose linear layers :meth:`store_weights` stores (the whole model here)."""
        return self.model

    def store_weights(self, dtype: torch.dtype) -> None:
        """Store the linear weights under :meth:`linear_root` (the restricted head's rows too) in ``dtype``:
        :func:`store_linear_weights`."""
        store_linear_weights(self.linear_root(), dtype)
        if self.head_ids is not None:
            self._head_w = self._head_w.to(dtype)
        if self.lean is not None:
            self.lean.rebuild()


def load_causal_lm(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """Load an HF causal LM for inference (eval mode, no grad) with grouped-query SDPA attention.

    ``sage_sdpa`` (:mod:`.attention`) is ``sdpa`` without the per-forward copy of the KV
    heads that transformers makes whenever a mask is passed (every tree verify, every padded batch).
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=register_attention())
    return use_fast_linears(model.to(device).eval().requires_grad_(False))


class RowsLinear(torch.nn.Linear):
    """``nn.Linear`` computed by :func:`~sage_plugin.kernels.linear.linear` (the rows kernel on CPU at a few rows)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def use_fast_linears(model: Any) -> Any:
    """``model`` with every ``nn.Linear`` (the output head included) re-classed to :class:`RowsLinear`, in place:
    the same parameters (a tied head stays tied), the same state dict, the rule of ``kernels/linear.py``."""
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = RowsLinear
    return model


def store_linear_weights(model: Any, dtype: torch.dtype) -> Any:
    """``model`` with the weight of every :class:`RowsLinear` stored in ``dtype``, in place (biases, norms and
    embeddings keep theirs).  A head tied to the input embedding gets its own copy (the embedding stays as it was).

    :func:`~sage_plugin.kernels.linear.linear` computes a bfloat16 weight under float32 activations in float32 (the rows
    kernel widens it as it streams it): a draft forward at a few rows streams half the bytes.
    """
    for module in model.modules():
        if isinstance(module, RowsLinear) and module.weight.dtype != dtype:
            module.weight = stored_as(module.weight, dtype)
    return model


def store_draft_weights(draft: Any, cpu_draft_dtype: str) -> str:
    """Apply ``CpuConfig.cpu_draft_dtype`` to a reference-engine draft (:class:`TextModel` or EAGLE-3 head):
    bfloat16 linear weights on CPU where the rows kernel runs (elsewhere a bfloat16 weight would be widened on every
    call: kept float32).  Returns the dtype the draft's linear weights now have, for reports."""
    from ..kernels.linear import rows_kernel

    if cpu_draft_dtype == "bfloat16" and draft.device.type == "cpu" and rows_kernel() is not None:
        draft.store_weights(torch.bfloat16)
        return "bfloat16"
    return "float32"
