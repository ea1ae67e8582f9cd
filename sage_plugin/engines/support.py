"""The SageConfig fields the reference engine (``sage bench``, :class:`~sage_plugin.engines.speculative.SpecEngine`)
honours: all of them but the tier, overlap and tensor-parallel fields of the serving runtimes.  Checked by
``sage bench`` before any model loads (:meth:`sage_plugin.support.RuntimeSupport.check`)."""

from __future__ import annotations

from ..config import knob_fields
from ..support import Honoured, RuntimeSupport

__all__ = ["REFERENCE_SUPPORT"]

_NOTES = {
    "prune_ratio_image": "with a VLM draft (sage bench --draft-vlm); a text draft sees no visual tokens",
    "prune_ratio_video": "the same, on video prompts (sage bench --datasets vlm-video --draft-vlm)",
    "node_budget": "auto: the round cost is measured once per batch size on this device",
    "cpu_draft_dtype": "the run's draft (sage bench --set), where the CPU rows kernel builds; not per method",
    "cpu_lean_draft": "the run's draft (sage bench --set): engines/lean.py for Llama-family drafts; not per method",
}
_NO_TIERS = "one process, no captured graphs: node_budget auto sizes every round to the measured cost instead"
_NOT_READ = {
    "tiers": _NO_TIERS,
    "tier_probe_every": _NO_TIERS,
    "tier_probe_backoff": _NO_TIERS,
    "tier_probe_confidence": _NO_TIERS,
    "tier_bound_slack": _NO_TIERS,
    "tier_acceptance": _NO_TIERS,
    "tier_control": _NO_TIERS,
    "tier_request_gate": _NO_TIERS,
    "tier_request_prior": _NO_TIERS,
    "tier_median_request": _NO_TIERS,
    "tier_off_lag": _NO_TIERS,
    "tier_off_decode": _NO_TIERS,
    "ragged_verify": _NO_TIERS,
    "tier_alpha_bins": _NO_TIERS,
    "admission_hold_steps": "one process, no admission queue",
    "cpu_overlap": "one process, no scheduler to overlap",
    "tp_sync": "one process, no tensor-parallel ranks",
    "opt_out_params": "takes no per-request parameters",
}

REFERENCE_SUPPORT = RuntimeSupport(
    runtime="reference engine",
    honours={f.name: Honoured(note=_NOTES.get(f.name, "")) for f in knob_fields() if f.name not in _NOT_READ},
    not_read=_NOT_READ,
)
