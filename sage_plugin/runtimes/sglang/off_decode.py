"""The speculation-off tier's target forward as a DECODE forward (``tier_off_decode``).

At the off tier (``--sage-tiers`` ``[0, 1]``) SGLang's EAGLE v2 worker verifies a one-node tree rooted at the
previous bonus token (``EAGLEWorkerV2._build_trivial_verify_input``): a TARGET_VERIFY forward of one row per request,
then its verify bookkeeping.  That forward computes what a DECODE forward computes (the root's KV into the slot
``req_to_token[req, seq]`` and its next-token logits) but through the extend attention path with a tree mask, which on
CPU costs more than the DECODE forward plain SGLang runs (docs/design/sglang-internals.md, "The speculation-off
tier").

:class:`DecodeVerifyTarget` is the target worker the off step's verify sees: the one forward it is handed, a
TARGET_VERIFY batch of one token per request, runs in DECODE mode instead (sequence lengths counting the root, as a
decode batch's do); everything else (the verify's sampling, accept bookkeeping, logprobs, the draft extend) is
upstream's, unchanged.  Same inputs, same positions, same KV slot, same logits: the outputs cannot change.

Example: two requests at ``seq_lens = [40, 7]`` with roots ``[t0, t1]``: the verify forward has ``input_ids = [t0,
t1]``, ``positions = [40, 7]``, ``out_cache_loc = [req_to_token[r0, 40], req_to_token[r1, 7]]``; the DECODE forward
keeps those and attends over ``seq_lens = [41, 8]`` keys.

CPU only: on CUDA the verify's forward batch was loaded into the captured TARGET_VERIFY graph before it is handed over
(``eagle_prepare_for_verify``), so the mode cannot change there.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.model_executor.forward_batch_info import ForwardMode

__all__ = ["DecodeVerifyTarget", "as_decode"]


def as_decode(forward_batch: Any) -> Any:
    """Turn a one-token-per-request TARGET_VERIFY forward batch into the DECODE batch of the same tokens (in place).

    A verify batch's ``seq_lens`` exclude the verified tokens (the backend adds ``draft_token_num``); a decode
    batch's include the token being decoded.  Anything else (another mode, more than one token per request) is
    returned unchanged.
    """
    spec = forward_batch.spec_info
    if not forward_batch.forward_mode.is_target_verify() or getattr(spec, "draft_token_num", None) != 1:
        return forward_batch
    forward_batch.forward_mode = ForwardMode.DECODE
    forward_batch.seq_lens = forward_batch.seq_lens + 1
    if forward_batch.seq_lens_cpu is not None:
        forward_batch.seq_lens_cpu = forward_batch.seq_lens_cpu + 1
    if forward_batch.seq_lens_sum is not None:
        forward_batch.seq_lens_sum = forward_batch.seq_lens_sum + forward_batch.batch_size
    return forward_batch


class DecodeVerifyTarget:
    """The target worker as an off step's verify sees it: its forward runs in DECODE mode (:func:`as_decode`);
    every other attribute is the target worker's."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def forward_batch_generation(self, batch: Any = None, forward_batch: Any = None, **kwargs: Any) -> Any:
        if batch is None and forward_batch is not None:
            forward_batch = as_decode(forward_batch)
        return self._target.forward_batch_generation(batch, forward_batch=forward_batch, **kwargs)
