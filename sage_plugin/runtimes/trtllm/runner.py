"""The draft model of the TensorRT-LLM drafter: any HF causal LM in PyTorch, with its own KV cache per request.

TensorRT-LLM's user-provided drafter path owns only the target; the draft model lives here.  :class:`HFDraftRunner`
keeps, per request key, a transformers ``DynamicCache`` and the token ids whose keys and values it holds.  Each
executor step:

* :meth:`HFDraftRunner.catch_up` compares the request's tokens with the cached ids, crops the cache to the common
  prefix (the accepted part of the last chain: rejected drafts are rolled back) and feeds the rest in one forward,
  returning the logits of the next token (the chain's root distribution);
* :meth:`HFDraftRunner.extend` feeds one drafted token and returns the logits after it;
* :meth:`HFDraftRunner.release` drops a finished request's cache.

Worked example (prompt ``[5, 6]``, chain drafted ``a b c``; the target accepts ``a`` and emits ``x``)::

    catch_up(r, [5, 6])           cache [5, 6]           -> root logits, draft a
    extend(r, a), extend(r, b)    cache [5, 6, a, b]     -> drafts b, c
    catch_up(r, [5, 6, a, x])     crop to [5, 6, a], feed [x] -> cache [5, 6, a, x], next root

A draft trained with a restricted head (``sage_draft.json``, :func:`sage_plugin.models.draft_head_ids`) gets
``-inf`` logits outside the head, as in the reference engine (its other tokens can never be its argmax).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Hashable, Protocol, Sequence

import torch

from ...models import draft_head_ids

__all__ = ["DraftRunner", "HFDraftRunner", "common_prefix"]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class DraftRunner(Protocol):
    """What the drafter needs of a draft model (tests drive the drafter with synthetic runners)."""

    vocab_size: int

    def catch_up(self, key: Hashable, tokens: Sequence[int]) -> torch.Tensor:
        """``[V]`` float32 logits of the token after ``tokens`` (the request's whole sequence so far)."""
        ...

    def extend(self, key: Hashable, token: int) -> torch.Tensor:
        """Feed one drafted token; ``[V]`` float32 logits of the token after it."""
        ...

    def release(self, key: Hashable) -> None:
        """Forget ``key`` (a finished request)."""
        ...


def common_prefix(a: Sequence[int], b: Sequence[int], hint: int = 0) -> int:
    """Length of the common prefix of ``a`` and ``b`` (``hint``: a length that usually agrees, compared at C speed).

    >>> common_prefix([1, 2, 3, 4], [1, 2, 9])
    2
    """
    n = min(len(a), len(b))
    i = min(hint, n)
    if list(a[:i]) != list(b[:i]):
        i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class _Sequence:
    """One request's draft state: the cache and the ids it holds (the first ``confirmed`` were the request's)."""

    cache: Any
    ids: list[int] = field(default_factory=list)
    confirmed: int = 0


class HFDraftRunner:
    """An HF causal LM with one KV cache per request key.

    Args:
        model: a transformers causal LM (eval mode; its device and dtype are used as they are).
        head_ids: optional ``[S]`` token ids of a restricted output head; other ids get ``-inf``.
    """

    def __init__(self, model: Any, head_ids: torch.Tensor | None = None) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.head_ids = None if head_ids is None else head_ids.to(self.device, torch.int64)
        self._seqs: dict[Hashable, _Sequence] = {}

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu", dtype: str = "float32") -> "HFDraftRunner":
        """Load a draft checkpoint (a local directory or a hub id) with transformers."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype])
        head = draft_head_ids(path) if Path(path).is_dir() else None
        return cls(model.to(device).eval().requires_grad_(False), head)

    def keys(self) -> list[Hashable]:
        return list(self._seqs)

    def cached_ids(self, key: Hashable) -> list[int]:
        """The ids whose KV the cache of ``key`` holds (a copy)."""
        return list(self._seqs[key].ids)

    @torch.inference_mode()
    def catch_up(self, key: Hashable, tokens: Sequence[int]) -> torch.Tensor:
        """Roll the cache back to its common prefix with ``tokens``, feed the rest; ``[V]`` next-token logits."""
        if not tokens:
            raise ValueError("catch_up needs at least one token")
        seq = self._seqs.get(key)
        if seq is None:
            seq = self._seqs[key] = _Sequence(self._new_cache())
        keep = min(common_prefix(seq.ids, tokens, seq.confirmed), len(tokens) - 1)  # feed >= 1 token
        self._crop(seq, keep)
        logits = self._forward(seq, list(tokens[keep:]))
        seq.confirmed = len(seq.ids)
        return logits

    @torch.inference_mode()
    def extend(self, key: Hashable, token: int) -> torch.Tensor:
        return self._forward(self._seqs[key], [int(token)])

    def release(self, key: Hashable) -> None:
        self._seqs.pop(key, None)

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache()

    def _crop(self, seq: _Sequence, keep: int) -> None:
        remove = len(seq.ids) - keep
        if remove <= 0:
            return
        if keep == 0:
            seq.cache = self._new_cache()
        else:
            seq.cache.crop(-remove)  # negative: remove that many (transformers 4.x and 5.x agree)
        del seq.ids[keep:]
        seq.confirmed = min(seq.confirmed, keep)

    def _forward(self, seq: _Sequence, new: list[int]) -> torch.Tensor:
        start = len(seq.ids)
        ids = torch.tensor([new], dtype=torch.int64, device=self.device)
        pos = torch.arange(start, start + len(new), device=self.device)[None]
        out = self.model(input_ids=ids, position_ids=pos, past_key_values=seq.cache, use_cache=True, logits_to_keep=1)
        seq.cache = out.past_key_values
        seq.ids.extend(new)
        logits = out.logits[0, -1].float()
        if self.head_ids is not None:
            logits = torch.full_like(logits, float("-inf")).index_copy_(0, self.head_ids, logits[self.head_ids])
        return logits
