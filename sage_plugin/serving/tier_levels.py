"""The level model of the tier chooser: how often a request's accepted path goes one draft level deeper.

Per group of tiers (one group per verify width, or one for every tier; :class:`~.tiers.TierChooser` decides) and per
level ``j``: ``h_j = P(accepted >= j | accepted >= j - 1)``, counted from every request of every step at a tier of
the group at least ``j`` deep (a step at ``s`` steps that accepted ``a`` drafts reached levels ``1 .. min(a + 1,
s)`` and passed levels ``1 .. a``).  Counts decay by ``1 - 1 / memory`` per step of the group, so they follow the
traffic.  A tier of ``s`` steps expects ``1 + sum_{j <= s} prod_{i <= j} h_i`` tokens per request.

Two ways to turn the counts into ``h`` (``prior_weight``):

* **measured** (``prior_weight == 0``): the counts of the step's alpha bin where it has reached level ``j``, else
  of every bin, with a prior of half a pass in one reach: ``h = (passed + 0.5) / (reached + 1)``;
* **calibrated** (``prior_weight > 0``): a chain of estimates from broad to narrow, each narrower one shrunk toward
  the broader by ``prior_weight`` pseudo-requests: every request of the group, with the draft's own confidence as
  the prior (the centre of the step's alpha bin, one pseudo-request: the draft's word counts for one request, the
  observed acceptance for all the others); then the step's batch-size class (SGLang's captured size, or the batch
  size: a ragged verify drops more nodes in larger batches); then the step's alpha bin inside that class::

      h_all  = (passed_all + prior) / (reached_all + 1)
      h_size = (passed_size + w h_all) / (reached_size + w)
      h_bin  = (passed_bin + w h_size) / (reached_bin + w)

  A narrow estimate with few requests stays near the broad one; with many it is its own.

**Change detection** (``change_z > 0``): the counts of the group's most recent whole steps holding at least
``window`` requests are kept apart (not decayed).  When their level-1 pass rate departs from the older requests'
(the slow counts less the window's) by more than ``change_z`` standard errors of the window's rate
(``sqrt(max(h (1 - h), 0.05) / reached_window)``, ``h`` the older rate), the slow counts of the group are replaced
by the window's: acceptance that collapses or recovers is followed within a step of a large batch or about
``window`` steps of one request, and a single probe of a tier that has recovered counts in full, while steady traffic
keeps the long memory's precision.

Worked example (measured, one step of a 3-step tier at batch 2 accepting 0 and 2 drafts): level 1 reached 2, passed
1; level 2 reached 1, passed 1; level 3 reached 1, passed 0: ``h = 0.5, 0.75, 0.25``; expected tokens ``1 + 0.5 +
0.375 + 0.094 = 1.97``.  Calibrated, alpha bin 3 of 4 (prior 0.875), every batch size one class, ``w = 4``: level 1
``h_all = (1 + 0.875) / 3 = 0.625``, ``h_size = (1 + 4 x 0.625) / 6 = 0.583``, ``h_bin = (1 + 4 x 0.583) / 6 =
0.556``.

Host-side (Python floats, no tensor): the same on every tensor-parallel rank when fed the same accept counts.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

__all__ = ["LevelModel"]

# (group, batch-size class or None for every size, alpha bin or None for every bin, level j) -> [reached, passed]
_Key = tuple[int | None, int | None, int | None, int]


class LevelModel:
    """Decaying per-level acceptance counts and the expected tokens they give (module docstring).

    Args:
        memory: steps of a group over which its counts decay by a factor ``e``.
        prior_weight: 0: measured estimates; > 0: calibrated, the pseudo-requests of each shrinkage step.
        change_z: standard errors of the recent level-1 rate that count as a change (0: no change detection).
        window: requests (in whole steps) of a group's recent counts (change detection only).
        alpha_bins: the chooser's alpha bins (the calibrated prior is a bin's centre; 0: prior 0.5).
    """

    def __init__(
        self,
        memory: int = 100,
        prior_weight: float = 0.0,
        change_z: float = 0.0,
        window: int = 16,
        alpha_bins: int = 0,
    ) -> None:
        if memory < 1 or window < 1 or prior_weight < 0 or change_z < 0:
            raise ValueError("memory >= 1, window >= 1, prior_weight >= 0, change_z >= 0")
        self._decay = 1.0 - 1.0 / memory
        self.window = window
        self.prior_weight = prior_weight
        self.change_z = change_z
        self.alpha_bins = alpha_bins
        # the decaying counts, kept unscaled: a group's true counts are these times its scale, which each step of the
        # group multiplies by the decay (one multiplication a step, however many keys the group has)
        self._slow: dict[_Key, list[float]] = {}
        self._scale: dict[int | None, float] = {}
        # per group: its latest steps (requests, counts), the fewest whole steps holding ``window`` requests
        self._recent: dict[int | None, deque[tuple[int, dict[_Key, list[float]]]]] = {}
        self.changes = 0  # change detections so far (the slow counts replaced by the recent ones)

    def has(self, group: int | None, b: int | None = None) -> bool:
        """Whether a request of ``group`` reached level 1 (in alpha bin ``b``, if given)."""
        return (group, None, b, 1) in self._slow

    def count(self, group: int | None, steps: int, accepted: Sequence[int], size: int | None, b: int | None) -> None:
        """One step's requests (accepted drafts each) at a tier of ``steps`` steps in ``group``, batch-size class
        ``size``, alpha bin ``b``; after decaying the group's counts by one step."""
        keys = [(None, None), (None, b)]
        if self.prior_weight:
            keys += [(size, None), (size, b)]
        hist: dict[int, int] = {}  # requests by accepted drafts
        for a in accepted:
            hist[a] = hist.get(a, 0) + 1
        step: dict[_Key, list[float]] = {}
        for s, bb in dict.fromkeys(keys):  # b None: one key less
            for a, n in hist.items():
                for j in range(1, min(a + 1, steps) + 1):
                    c = step.setdefault((group, s, bb, j), [0.0, 0.0])
                    c[0] += n
                    c[1] += n * float(a >= j)
        scale = self._scale.get(group, 1.0) * self._decay
        if scale < 1e-12:  # fold the scale back into the counts, rarely
            for key, c in self._slow.items():
                if key[0] == group:
                    c[0], c[1] = c[0] * scale, c[1] * scale
            scale = 1.0
        self._scale[group] = scale
        _add(self._slow, step, 1.0 / scale)
        if not self.change_z:
            return
        recent = self._recent.setdefault(group, deque())
        recent.append((len(accepted), step))
        while sum(n for n, _ in recent) - recent[0][0] >= self.window:
            recent.popleft()
        window: dict[_Key, list[float]] = {}
        for _, counts in recent:
            _add(window, counts)
        if self._changed(group, window):
            self._slow = {k: v for k, v in self._slow.items() if k[0] != group}
            self._scale[group] = 1.0
            _add(self._slow, window)
            self.changes += 1

    def _get(self, key: _Key) -> tuple[float, float] | None:
        """``(reached, passed)`` of ``key`` (decayed), None if no request counted there."""
        c = self._slow.get(key)
        if c is None:
            return None
        scale = self._scale.get(key[0], 1.0)
        return c[0] * scale, c[1] * scale

    def _changed(self, group: int | None, window: dict[_Key, list[float]]) -> bool:
        """Whether the window's level-1 rate departs from the older requests' (the slow counts less the window's) by
        ``change_z`` standard errors of the window's rate."""
        rs, ps = self._get((group, None, None, 1)) or (0.0, 0.0)
        rw, pw = window.get((group, None, None, 1), (0.0, 0.0))
        ro, po = rs - rw, ps - pw
        if rw < self.window or ro < self.window:
            return False
        ho, hw = min(max(po / ro, 0.0), 1.0), pw / rw
        return abs(hw - ho) > self.change_z * math.sqrt(max(ho * (1.0 - ho), 0.05) * (1.0 / rw + 1.0 / ro))

    def level(self, group: int | None, j: int, size: int | None, b: int | None) -> tuple[float, float]:
        """``(h_j, n)``: the pass rate at level ``j`` and the requests it rests on (module docstring)."""
        get = self._get
        if not self.prior_weight:
            reached, passed = get((group, None, b, j)) or get((group, None, None, j)) or (0.0, 0.0)
            return (passed + 0.5) / (reached + 1.0), reached + 1.0
        prior = 0.5 if b is None or not self.alpha_bins else (b + 0.5) / self.alpha_bins
        reached, passed = get((group, None, None, j)) or (0.0, 0.0)
        h, n = (passed + prior) / (reached + 1.0), reached + 1.0
        w = self.prior_weight
        for key in ([(size, None)] if size is not None else []) + ([(size, b)] if b is not None else []):
            reached, passed = get((group, *key, j)) or (0.0, 0.0)
            h, n = (passed + w * h) / (reached + w), reached + w
        return h, n

    def tokens(self, group: int | None, steps: int, size: int | None, b: int | None, z: float = 0.0) -> float | None:
        """Expected tokens per request of a ``steps``-step tier of ``group``: ``1 + sum_j prod_{i <= j} h_i``; None
        before any request of the group reached level 1.  ``z``: each ``h`` moved by ``z`` standard errors of a
        proportion, ``sqrt(h (1 - h) / n)``, kept in [0, 1] (``z > 0``: optimistic, ``z < 0``: pessimistic)."""
        if not self.has(group):
            return None
        expected = survive = 1.0
        for j in range(1, steps + 1):
            h, n = self.level(group, j, size, b)
            survive *= min(1.0, max(0.0, h + z * math.sqrt(h * (1.0 - h) / n)))
            expected += survive
        return expected


def _add(into: dict[_Key, list[float]], counts: dict[_Key, list[float]], times: float = 1.0) -> None:
    """Add ``counts`` (key -> [reached, passed]) into ``into``, ``times`` over."""
    for key, (reached, passed) in counts.items():
        c = into.setdefault(key, [0.0, 0.0])
        c[0] += reached * times
        c[1] += passed * times
