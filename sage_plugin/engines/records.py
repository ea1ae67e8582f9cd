"""What :meth:`~sage_plugin.engines.speculative.SpecEngine.generate` takes and returns: sampling parameters, one
output per request and its per-round statistics (re-exported by :mod:`.speculative`)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GenOutput", "RoundLog", "SamplingParams"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Target sampling: ``temperature == 0`` is greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass(slots=True)
class RoundLog:
    """Per-request statistics of one round."""

    tau: int  # accepted draft tokens (bonus excluded)
    nodes: int  # draft nodes in the tree (root excluded)
    depth_built: int  # deepest level in the tree
    alpha: float  # confidence used for the shape
    root_alpha: float  # confidence of this round's root distribution
    plan_depth: int
    plan_width: int
    draft_forwards: int  # catch-up + expansion forwards of this batch round


@dataclass(slots=True)
class GenOutput:
    request_id: str
    tokens: list[int]  # generated tokens (first one from the prefill), stop token included
    finish_reason: str  # "stop" | "length"
    rounds: list[RoundLog] = field(default_factory=list)
    target_forwards: int = 0
