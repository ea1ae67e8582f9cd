"""Per-request SAGE state for serving runtimes, stored by request slot (sync-free).

A serving runtime runs a different batch every step, but each live request owns a fixed slot (SGLang: its
``req_pool_idx``).  :class:`SlotState` keeps the SAGE controller state of every slot in device tensors and
gathers/scatters the rows of the current batch by slot index, so planning a round and observing its
acceptance never leave the device:

* :meth:`SlotState.reset` when a request is prefilled (its slot may have served another request);
* :meth:`SlotState.plan` before drafting: alpha (Eq. 9) from the root's top-k draft probabilities (``fresh``) or
  the slot's previous root (``lag1``, the paper's), then D and W (Eq. 10-11) with the slot's history ``D_max``;
* :meth:`SlotState.observe` after verification: the acceptance lengths feed the history controller.

Worked example (one slot, d_min 3, d_max 8, w_min 2, w_max 10, k = topk = 4, alpha_source fresh)::

    root top-4 probs [0.97, 0.01, 0.01, 0.01]  -> alpha 0.88 -> D = round(3 + 0.88 * 5) = 7, W = round(2 + 0.12 * 8) = 3
    root top-4 probs [0.25, 0.25, 0.25, 0.25]  -> alpha 0.00 -> D = 3, W = 10 (capped at k = 4 by the policy)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import SageConfig
from .controller import HistoryState, history_init, history_update
from .entropy import topk_confidence
from .policies import SagePolicy

__all__ = ["RoundShape", "SlotState"]


@dataclass(frozen=True, slots=True)
class RoundShape:
    """One round's plan for a batch: ``alpha``, ``depth`` and ``width``, each ``[B]``."""

    alpha: torch.Tensor
    depth: torch.Tensor
    width: torch.Tensor


class SlotState:
    """SAGE state of ``num_slots`` request slots on ``device``.

    Args:
        cfg: the SAGE config (``k``, ``d_min``/``d_max``/``d_cap``, ``w_min``/``w_max``, history settings,
            ``alpha_source`` in {lag1, fresh}, ``use_entropy``, ``alpha_init``).
        num_slots: number of slots (SGLang: ``req_to_token_pool.size``).
        device: where the state lives.
    """

    def __init__(self, cfg: SageConfig, num_slots: int, device: torch.device | str = "cpu") -> None:
        if cfg.alpha_source == "path_mean":
            raise ValueError("alpha_source path_mean needs the accepted path's draft distributions; "
                             "serving runtimes support lag1 and fresh")
        self.cfg = cfg
        self.policy = SagePolicy(cfg)
        self.history = history_init(num_slots, cfg.history_window, cfg.d_max, device)
        self.alpha = torch.full((num_slots,), float(cfg.alpha_init), device=device)

    def reset(self, slots: torch.Tensor) -> None:
        """Fresh state for the requests now in ``slots [B]`` (after their prefill)."""
        fresh = history_init(slots.shape[0], self.cfg.history_window, self.cfg.d_max, slots.device)
        self._scatter(slots, fresh)
        self.alpha.index_fill_(0, slots, float(self.cfg.alpha_init))

    def plan(self, slots: torch.Tensor, root_probs: torch.Tensor) -> RoundShape:
        """Alpha, D and W for the requests in ``slots [B]`` given their root's top probabilities ``[B, t]``."""
        cfg = self.cfg
        k = min(self.policy.k, root_probs.shape[1])
        fresh = topk_confidence(root_probs.float().clamp(min=1e-30).log(), k)
        if not cfg.use_entropy:
            alpha = torch.full_like(fresh, cfg.alpha_init)
        elif cfg.alpha_source == "fresh":
            alpha = fresh
        else:  # lag1: the previous round's root
            alpha = self.alpha.index_select(0, slots)
        self.alpha.index_copy_(0, slots, fresh)
        depth, width = self.policy.shape(alpha, self.history.index(slots))
        return RoundShape(alpha, depth, width.clamp(max=root_probs.shape[1]))

    def observe(self, slots: torch.Tensor, accept_lens: torch.Tensor) -> None:
        """Feed one round's acceptance per request (``accept_lens [B]``: accepted drafts + the bonus)."""
        cfg = self.cfg
        if not cfg.use_history:
            return
        tau = accept_lens.float() if cfg.history_tau == "drafts_plus_bonus" else accept_lens.float() - 1.0
        new = history_update(self.history.index(slots), tau, lo=cfg.history_lo, hi=cfg.history_hi,
                             step=cfg.history_step, d_min=cfg.d_min, d_cap=cfg.d_cap,
                             full_window_cooldown=cfg.history_cooldown == "full_window")
        self._scatter(slots, new)

    def _scatter(self, slots: torch.Tensor, rows: HistoryState) -> None:
        for name in HistoryState.__slots__:
            getattr(self.history, name).index_copy_(0, slots, getattr(rows, name))
