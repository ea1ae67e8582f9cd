"""Per-request SAGE figures in ``/generate``'s ``meta_info["sage"]``, through SGLang 0.5.23's auxiliary-output contract.

SGLang carries extra per-request response fields this way (``managers/auxiliary_output.py``,
``sampling/sampling_observer.py``): a device-side object rides on the step's ``logits_output``
(``auxiliary_device_output``), the scheduler copies it to the host together with the step's tokens (one
asynchronous copy, no extra sync), then calls ``consume(batch, commits)`` with the batch's requests, after the
tokens are committed and before responses are streamed; values put in ``req.customized_info`` reach
``meta_info``.  A key the output streamer calls *request-level* is sent once per request (at the end of a
non-streaming request) instead of token by token; :func:`sage_streamer_class` makes ``"sage"`` such a key (hook
#5, ``patches/INDEX.md``).

Per decode round the SAGE worker attaches :class:`SageRoundDevice` (``[B, 4]``: alpha, D, W, shaped nodes of
each row's plan); :class:`SageRoundHost` folds each request's row into running means.  A finished request's
``meta_info["sage"]`` then reads (SGLang's request-level format is a list with one entry)::

    [{"rounds": 17, "off_steps": 3, "mean_alpha": 0.41, "mean_depth": 2.6, "mean_width": 2.8, "mean_shaped_nodes": 7.4}]

``rounds`` counts the request's drafted rounds and ``off_steps`` its steps at the speculation-off tier
(``--sage-tiers``), so ``rounds + off_steps`` equals SGLang's own ``spec_verify_ct`` for the request.  A request that
runs without speculation (``penalties.opt_out_reason``) counts every step as an off step and carries
``"opt_out"``, the reason (``"custom_params.disable_speculative_decoding"``, ``"custom_logit_processor"``, or the
parameter ``--sage-opt-out-params`` named).  Streaming requests carry no SAGE summary:
SGLang sends a request-level key only with a stream's first chunk, which comes before any round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .penalties import REASON_ATTR

__all__ = [
    "META_KEY", "ROUND_FIELDS", "SageRoundDevice", "SageRoundHost", "sage_streamer_class", "spec_totals", "update_summary",
]  # fmt: skip

#: the ``meta_info`` key
META_KEY = "sage"
#: columns of a round's per-row plan
ROUND_FIELDS = ("alpha", "depth", "width", "shaped_nodes")


def update_summary(summary: dict[str, float] | None, row: Sequence[float] | None) -> dict[str, float]:
    """Fold one round (``row`` in :data:`ROUND_FIELDS` order; None: a step at the off tier) into a request's means.

    >>> s = update_summary(None, [0.5, 4, 2, 7])
    >>> update_summary(update_summary(s, None), [0.3, 2, 4, 5])
    {'rounds': 2, 'off_steps': 1, 'mean_alpha': 0.4, 'mean_depth': 3.0, 'mean_width': 3.0, 'mean_shaped_nodes': 6.0}
    """
    off = (summary or {}).get("off_steps", 0)
    if row is None:
        return {**(summary or {"rounds": 0}), "off_steps": off + 1}
    n = (summary or {}).get("rounds", 0) + 1
    out: dict[str, float] = {"rounds": n, "off_steps": off}
    for name, value in zip(ROUND_FIELDS, row):
        key = f"mean_{name}"
        prev = (summary or {}).get(key, 0.0)
        out[key] = round(prev + (float(value) - prev) / n, 6)
    return out


@dataclass(frozen=True)
class SageRoundHost:
    """Host copy of one round's plan; SGLang calls :meth:`consume` once the copy is complete."""

    stats: torch.Tensor  # [B, len(ROUND_FIELDS)] on the host
    drafted: bool = True  # False: a step at the off tier (no plan; its rows are not read)

    def consume(self, batch: Any, commits: Sequence[Any]) -> None:
        """Fold each row into its request's ``customized_info["sage"]`` (rows with no committed token skip)."""
        rows = self.stats.tolist() if self.drafted else [None] * len(batch.reqs)  # a host tensor: no device sync
        for req, commit, row in zip(batch.reqs, commits, rows):
            if commit is None:
                continue
            info = req.customized_info
            if info is None:
                info = req.customized_info = {}
            prev = info.get(META_KEY)
            reason = getattr(req, REASON_ATTR, "")  # a request that does not speculate: every step an off step
            summary = update_summary(prev[0] if prev else None, None if reason else row)
            info[META_KEY] = [{**summary, "opt_out": reason} if reason else summary]


@dataclass(frozen=True)
class SageRoundDevice:
    """``DeviceAuxiliaryOutput`` of a SAGE decode step: ``stats [B, 4]`` (a fresh tensor, not a graph buffer);
    ``drafted`` False for a step at the off tier (``stats`` is then ``[B, 0]``)."""

    stats: torch.Tensor
    drafted: bool = True

    def copy_to_host(self, copy_tensor: Callable[[torch.Tensor], torch.Tensor]) -> SageRoundHost:
        return SageRoundHost(copy_tensor(self.stats), self.drafted)


def sage_streamer_class(base: type) -> type:
    """``base`` (SGLang's ``SchedulerOutputStreamer`` or a subclass) with ``"sage"`` as a request-level key."""

    class SageOutputStreamer(base):
        __slots__ = ()

        def is_request_level_customized_info_key(self, key: str) -> bool:
            return key == META_KEY or super().is_request_level_customized_info_key(key)

    SageOutputStreamer.__qualname__ = f"Sage{base.__qualname__}"
    return SageOutputStreamer


def spec_totals(scheduler: Any) -> dict[str, dict[str, int]]:
    """``{"spec_totals": {"accept_tokens": A, "forwards": F}}`` for ``GET /server_info`` under any speculative
    algorithm (empty otherwise): the counts behind SGLang's ``avg_spec_accept_length`` up to this moment (its lifetime
    totals move only at each decode log line, so the current interval's are added), so that a client can take the
    accept length of a window as the difference of two reads: ``(A1 - A0) / (F1 - F0)``."""
    reporter = getattr(scheduler, "metrics_reporter", None)
    if reporter is None or scheduler.spec_algorithm.is_none():
        return {}
    accepted = reporter.spec_total_num_accept_tokens + reporter.spec_num_accept_tokens
    return {
        "spec_totals": {
            "accept_tokens": accepted,
            "forwards": reporter.spec_total_num_forward_ct + reporter.spec_num_forward_ct,
        }
    }
