"""Per-request SAGE state for serving runtimes, stored by request slot (sync-free).

A serving runtime runs a different batch every step, but each live request owns a fixed slot (SGLang: its
``req_pool_idx``).  :class:`SlotState` keeps the SAGE controller state of every slot in device tensors and
gathers/scatters the rows of the current batch by slot index, so planning a round and observing its
acceptance never leave the device:

* :meth:`SlotState.reset` when a request is prefilled (its slot may have served another request);
* :meth:`SlotState.plan` before drafting: alpha (Eq. 9) from the root's top-k draft probabilities (``fresh``) or
  the slot's previous root (``lag1``, the paper's), then D and W (Eq. 10-11) with the slot's history ``D_max``,
  and whether the slot is in its first round (``first_round_static``);
* :meth:`SlotState.observe` after verification: the acceptance lengths feed the history controller.

The rules are :mod:`sage_plugin.core.shape` and :func:`~sage_plugin.core.controller.observe_history`, as in the
online policy.

Worked example (one slot, d_min 3, d_max 8, w_min 2, w_max 10, k = topk = 4, alpha_source fresh)::

    root top-4 probs [0.97, 0.01, 0.01, 0.01]  -> alpha 0.88 -> D = round(3 + 0.88 * 5) = 7, W = round(2 + 0.12 * 8) = 3
    root top-4 probs [0.25, 0.25, 0.25, 0.25]  -> alpha 0.00 -> D = 3, W = 10, capped at topk = 4
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.controller import HistoryState, history_init, observe_history
from ..core.entropy import root_confidence
from ..core.params import SageParams
from ..core.shape import choose_alpha, plan_shape

__all__ = ["RoundShape", "SlotState"]


@dataclass(frozen=True, slots=True)
class RoundShape:
    """One round's plan for a batch, each ``[B]``: ``alpha``, ``depth``, ``width`` and ``first_round`` (bool: the
    slot has not finished a round since its reset; with ``first_round_static`` it drafts the static tree)."""

    alpha: torch.Tensor
    depth: torch.Tensor
    width: torch.Tensor
    first_round: torch.Tensor


class SlotState:
    """SAGE state of ``num_slots`` request slots on ``device``.

    Args:
        cfg: the SAGE config (``k``, ``d_min``/``d_max``/``d_cap``, ``w_min``/``w_max``, history settings,
            ``alpha_source`` in {lag1, fresh}, ``use_entropy``, ``alpha_init``).
        num_slots: number of slots (SGLang: ``req_to_token_pool.size``).
        device: where the state lives.
    """

    def __init__(self, cfg: SageParams, num_slots: int, device: torch.device | str = "cpu") -> None:
        if cfg.alpha_source == "path_mean":  # the runtime's launch check refuses it first (sage_plugin.support)
            raise ValueError("alpha_source path_mean needs the accepted path's draft distributions")
        self.cfg = cfg
        self.history = history_init(num_slots, cfg.history_window, cfg.d_max, device)
        self.alpha = torch.full((num_slots,), float(cfg.alpha_init), device=device)
        self.first_round = torch.ones(num_slots, dtype=torch.bool, device=device)

    def reset(self, slots: torch.Tensor) -> None:
        """Fresh state for the requests now in ``slots [B]`` (after their prefill)."""
        fresh = history_init(slots.shape[0], self.cfg.history_window, self.cfg.d_max, slots.device)
        self._scatter(slots, fresh)
        self.alpha.index_fill_(0, slots, float(self.cfg.alpha_init))
        self.first_round.index_fill_(0, slots, True)

    def plan(self, slots: torch.Tensor, root_probs: torch.Tensor) -> RoundShape:
        """Alpha, D and W for the requests in ``slots [B]`` given their root's top probabilities ``[B, t]``."""
        fresh = root_confidence(root_probs, self.cfg.k)
        alpha = choose_alpha(self.cfg, self.alpha.index_select(0, slots), fresh)
        self.alpha.index_copy_(0, slots, fresh)
        depth, width = plan_shape(self.cfg, alpha, self.history.d_max.index_select(0, slots))
        first = self.first_round.index_select(0, slots) & self.cfg.first_round_static
        return RoundShape(alpha, depth, width.clamp(max=root_probs.shape[1]), first)

    def observe(self, slots: torch.Tensor, accept_lens: torch.Tensor) -> None:
        """Feed one round's acceptance per request (``accept_lens [B]``: accepted drafts + the bonus)."""
        new = observe_history(self.cfg, self.history.index(slots), accept_lens - 1)
        self._scatter(slots, new)
        self.first_round.index_fill_(0, slots, False)

    def _scatter(self, slots: torch.Tensor, rows: HistoryState) -> None:
        for name in HistoryState.__slots__:
            getattr(self.history, name).index_copy_(0, slots, getattr(rows, name))
