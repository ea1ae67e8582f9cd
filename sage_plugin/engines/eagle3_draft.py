"""The reference engine's EAGLE-3 draft: an :class:`~.eagle3.Eagle3Head` fed the target's captured hidden states.

What differs from a standalone draft (:class:`~.lm.TextModel`), as the engine drives it
(:mod:`sage_plugin.engines.speculative`):

* its rows pair token ``x[p + 1]`` with a feature of position ``p``: the target's captured layers (prefill, the
  accepted path of each verify) or, inside a draft tree, the head's own output at the node's parent;
* its prefill needs the target's prefill features, so the target runs with ``capture_layers`` set
  (:class:`~.lm.TextModel`); it covers rows ``0 .. n - 2`` and the first round's catch-up feeds the root with
  the feature of row ``n - 1``;
* after a verify, none of its tree rows is kept: every accepted token (and the bonus) is fed again with the
  target's features of the accepted path, as SGLang's draft extend does.

Worked example: prompt ``a b c``, the prefill's token ``d``.  Prefill rows: ``(b, f_a)`` at 0, ``(c, f_b)`` at 1.
Round 1 catch-up: ``(d, f_c)`` at 2 -> output ``o_d`` (logits = draft's guess for the token after ``d``).  Level 1
of the tree: children ``e`` of the root, fed ``(e, o_d)`` at 3.  The target accepts ``e`` and emits bonus ``g``:
the next catch-up feeds ``(e, f_d)`` at 3 and ``(g, f_e)`` at 4 with the target's features from the verify.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..models import check_eagle3_config
from .eagle3 import Eagle3Head, head_from_files, read_head_files
from .kv import PrefillResult, SeqState, append_kv
from .lm import GenRequest, store_linear_weights, use_fast_linears

__all__ = ["Eagle3Draft"]


class Eagle3Draft:
    """An EAGLE-3 head as a reference-engine draft (see module doc).

    ``forward`` returns full-vocabulary logits ``[B, Q, V]`` (``-inf`` outside the draft vocabulary) and keeps the
    rows' pre-norm outputs in ``last_hidden`` [B, Q, H] for their children.
    """

    needs_target_features = True

    def __init__(self, head: Eagle3Head, aux_layers: list[int], vocab_size: int) -> None:
        # every linear layer of the head (fc, attention, MLP, lm_head) under the CPU few-row rule, as the target's
        self.head = use_fast_linears(head.eval().requires_grad_(False))
        self.model = head
        self.aux_layers = list(aux_layers)
        self.vocab_size = vocab_size
        self.device = head.fc.weight.device
        self.last_hidden: torch.Tensor | None = None

    @classmethod
    def load(cls, path: str | Path, target_cfg: dict, embedding: torch.Tensor) -> Eagle3Draft:
        """Load an exported head over the target's ``embedding`` after :func:`check_eagle3_config`."""
        cfg, tensors = read_head_files(path)
        check_eagle3_config(cfg, target_cfg, tensors.get("d2t"), where=str(path))
        head = head_from_files(cfg, tensors, embedding)
        return cls(head, cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"], int(target_cfg["vocab_size"]))

    def store_weights(self, dtype: torch.dtype) -> None:
        """Store the head's linear weights in ``dtype`` (:func:`~.lm.store_linear_weights`)."""
        store_linear_weights(self.head, dtype)

    def _full(self, out: torch.Tensor) -> torch.Tensor:
        small = self.head.logits(out).float()
        full = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.head.hot_ids, small)

    @torch.inference_mode()
    def prefill(self, request: GenRequest, features: torch.Tensor | None = None) -> PrefillResult:
        """Rows ``(x[p + 1], f_p)`` for ``p < n - 1`` of the prompt; ``features`` [1, n, 3H] from the target."""
        ids = torch.tensor([request.prompt_ids], dtype=torch.int64, device=self.device)
        n = ids.shape[1]
        s = self.head.shape
        empty = torch.zeros(1, s.kv_heads, 0, s.head_dim, device=self.device)
        if n < 2:
            return PrefillResult([(empty, empty.clone())], torch.zeros(self.vocab_size, device=self.device), 0)
        if features is None:
            raise ValueError("an EAGLE-3 draft's prefill needs the target's prefill features")
        pos = torch.arange(n - 1, device=self.device)[None]
        mask = torch.ones(n - 1, n - 1, dtype=torch.bool, device=self.device).tril()[None, None]
        out, k, v = self.head.step(ids[:, 1:], features[:, : n - 1].float(), pos, (empty, empty), mask)
        return PrefillResult([(k, v)], self._full(out[0, -1]), n - 1)

    @torch.inference_mode()
    def forward(
        self,
        state: SeqState,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        features: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, Q, V] of ``Q`` new rows appended to ``state``; ``features`` [B, Q, 3H or H] (zeros if None,
        for cost profiling)."""
        bsz, q = input_ids.shape
        if features is None:
            features = torch.zeros(bsz, q, 3 * self.head.shape.hidden, device=self.device)
        layer = state.cache.layers[0]
        ids = input_ids.clamp(0, self.vocab_size - 1)
        out, k, v = self.head.step(ids, features.float(), positions, (layer.keys, layer.values), mask)
        append_kv(layer, k, v)
        state.appended(q)
        self.last_hidden = out
        return self._full(out)
