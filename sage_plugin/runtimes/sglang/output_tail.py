"""The last output tokens of each request slot, on the device: what a verify's penalties add to a lagging state.

SGLang feeds a request's penalizers from its host-side ``output_ids`` when it prepares a decode step.  With the
overlap scheduler that list lags one step behind the device (the previous step's result is processed after the next
step is prepared), so the penalizer state a verify reads may miss the tokens the previous step accepted.  The SAGE
worker writes every committed token here as it is produced (the prefill's token, each verify's accepted tokens), and
a verify adds to each request's state the tokens the state has not seen: the last ``committed - seen`` of them.
Without the overlap scheduler that difference is 0.

Example: slot 3 prefilled with token 11 (committed 1), then a verify accepted ``[12, 13]`` (committed 3); a state that
has seen 1 token is missing ``[12, 13]``::

    >>> tail = OutputTail(slots=4, width=6, device="cpu")
    >>> tail.reset(torch.tensor([3]), torch.tensor([11]))
    >>> tail.append(torch.tensor([3]), torch.tensor([[12, 13, -1]]), torch.tensor([2]))
    >>> tail.unseen(torch.tensor([3]), torch.tensor([1])).tolist()
    [[12, 13, -1, -1, -1, -1]]

Everything is a device op on ``[B]``-sized index tensors: no host read, so it runs inside an overlapped step.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["OutputTail"]


class OutputTail:
    """A ring of each slot's last ``width`` committed output tokens and its count since the slot's prefill.

    ``width`` bounds how far a state may lag: at least the tokens of one step plus one (the overlap scheduler lags
    one step).
    """

    def __init__(self, slots: int, width: int, device: Any) -> None:
        self.width = width
        self.tokens = torch.full((slots, width), -1, dtype=torch.int64, device=device)
        self.count = torch.zeros(slots, dtype=torch.int64, device=device)

    def reset(self, slots: torch.Tensor, first: torch.Tensor) -> None:
        """A prefill: ``slots [B]`` now hold one committed token each, ``first [B]``."""
        slots = slots.long()
        self.tokens[slots] = -1
        self.tokens[slots, 0] = first.long()
        self.count[slots] = 1

    def append(self, slots: torch.Tensor, tokens: torch.Tensor, lens: torch.Tensor) -> None:
        """A verify committed ``tokens [B, L]`` (the first ``lens [B]`` of each row) to ``slots [B]``."""
        slots = slots.long()
        if tokens.shape[1] == 0:
            return
        count = self.count[slots]
        offset = (torch.arange(self.width, device=count.device) - count.unsqueeze(1)) % self.width  # [B, width]
        new = tokens.long().gather(1, offset.clamp(max=tokens.shape[1] - 1))
        self.tokens[slots] = torch.where(offset < lens.long().unsqueeze(1), new, self.tokens[slots])
        self.count[slots] += lens.long()

    def unseen(self, slots: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """``[B, width]``: the committed tokens after the first ``seen [B]`` since the prefill, oldest first, -1 pad
        (at most ``width``)."""
        slots = slots.long()
        count = self.count[slots]
        missing = (count - seen.long()).clamp(0, self.width)
        steps = torch.arange(self.width, device=count.device)
        at = (count - missing).unsqueeze(1) + steps
        got = self.tokens[slots].gather(1, at % self.width)
        return torch.where(steps < missing.unsqueeze(1), got, -1)
