"""EAGLE-3's training-time-test objective and the exact chain acceptance it implies.

:func:`ttt_loss`: for each unrolled draft step ``k`` (:meth:`Eagle3Head.unroll`), the soft cross-entropy of the
draft's distribution against the target's top-k distribution at position ``p + k + 1`` (renormalised over the
entries inside the draft vocabulary), on answer positions only, weighted ``decay ** k`` (EAGLE-3 uses 0.8).

:func:`step_matches`: along a target continuation, ``match[p, k]`` says whether step ``k`` of a chain started at row
``p`` drafts the target's greedy token (:func:`sage_plugin.train.evaluate.chain_accept` turns it into tau).  Because
step ``k`` reads step ``k - 1``'s own output, acceptance depends on where the round started, unlike a standalone
draft's teacher-forced matches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sage_plugin.engines.eagle3 import Eagle3Head

__all__ = ["target_to_draft", "ttt_loss", "step_matches"]


def target_to_draft(head: Eagle3Head) -> torch.Tensor:
    """[vocab] long map from target id to draft id (-1 outside the draft vocabulary)."""
    m = torch.full((head.t2d.numel(),), -1, dtype=torch.long, device=head.hot_ids.device)
    m[head.hot_ids] = torch.arange(head.hot_ids.numel(), device=m.device)
    return m


def ttt_loss(head: Eagle3Head, batch: dict, steps: int, decay: float = 0.8, t2d: torch.Tensor | None = None):
    """(weighted loss, per-step top-1 accuracy list) of one batch from :class:`FeatureStore.batch`."""
    t2d = target_to_draft(head) if t2d is None else t2d
    outs = head.unroll(batch["feats"], batch["tokens"], steps)
    total, weight, accs = 0.0, 0.0, []
    for k, o in enumerate(outs):
        rows = o.shape[1]
        sl = slice(k + 1, k + 1 + rows)
        mask = batch["mask"][:, sl]
        if not bool(mask.any()):
            break
        logq = F.log_softmax(head.logits(o[mask]).float(), dim=-1)
        ids = batch["topk_ids"][:, sl][mask]
        lp = batch["topk_logprobs"][:, sl][mask].float()
        did = t2d[ids]
        inside = did >= 0
        p = torch.softmax(lp.masked_fill(~inside, float("-inf")), dim=-1).nan_to_num(0.0)
        ce = -(p * logq.gather(-1, did.clamp(min=0))).sum(-1).mean()
        total = total + (decay**k) * ce
        weight += decay**k
        accs.append(float((head.hot_ids[logq.argmax(-1)] == ids[:, 0]).float().mean()))
    return total / max(weight, 1e-9), accs


@torch.no_grad()
def step_matches(head: Eagle3Head, feats: torch.Tensor, tokens: torch.Tensor, target_argmax: torch.Tensor, steps: int):
    """[T - 1, steps] bool: step ``k`` of a chain started at row ``p`` equals ``target_argmax[p + k + 1]``.

    ``feats`` [T, 3H], ``tokens`` [T], ``target_argmax`` [T] (one sequence); entries past the end are False.
    """
    outs = head.unroll(feats[None].float(), tokens[None], steps)
    T = tokens.shape[0]
    m = torch.zeros(T - 1, steps, dtype=torch.bool)
    for k, o in enumerate(outs):
        rows = o.shape[1]
        pred = head.hot_ids[head.logits(o[0]).argmax(-1)]
        m[:rows, k] = pred == target_argmax[k + 1 : k + 1 + rows]
    return m
