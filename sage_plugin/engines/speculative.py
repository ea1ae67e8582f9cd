"""Reference speculative-decoding engine on HF transformers (CPU or CUDA), batched and ragged.

One round per batch (SAGE Algorithm 1 with the online topology, open point 8 of ``docs/design/algorithm.md``):

1. **Draft catch-up**: feed each request's pending tokens (accepted tokens the draft has not
   seen, then the root) in one ragged forward; the last row gives the root distribution.
2. **Tree expansion**: ``policy.plan`` picks per-request depth/width; then one batched draft
   forward per level over the frontier nodes, each attending to its committed prefix and its
   tree ancestors (their KV rows written by earlier levels of this round).
3. **Verification**: one target forward over ``[root, drafts...]`` at positions ``prefix + depth``
   under the ancestor mask, then greedy or lossless-sampling verification.
4. **Commit**: the accepted path's target KV rows are committed in place; the draft's rows of
   accepted nodes that it already processed are committed too, the rest become pending.
   ``policy.observe`` updates alpha (lag-1) and the history controller.

Overhead: the host time spent inside the policy's calls (plan, per-level step, keep_drafting, finalize, observe,
i.e. deciding the tree shape, the paper's "tree update" time) is summed in ``last_policy_s``.  On a CPU it is the policy's compute; on CUDA the launch time of its kernels, which
run asynchronously (a per-call synchronisation would distort the timing it reports).

A policy with ``wants_cost`` (SAGE, ``node_budget="auto"``) also gets the round cost measured on this device
(:func:`~sage_plugin.engines.profile.measure_cost_samples`, once per batch size, timed apart from prefill and decode
in ``last_profile_s``): it stops drafting levels that would not be verified and cuts the tree to the cost-optimal
size (:mod:`sage_plugin.core.cost`).  With ``cost_refresh`` the engine also times the forwards it runs and
re-prices the curve from their medians every ``cost_refresh`` rounds (:mod:`.cost_samples`).

Plain decoding (``policy=None``) runs through the same KV machinery, one token per forward.

An EAGLE-3 draft (:class:`~sage_plugin.engines.eagle3_draft.Eagle3Draft`, ``needs_target_features``) is fed
features instead of keeping its tree rows: the target captures its layers at prefill and verify, the catch-up
feeds every accepted token and the bonus with the target's features of the accepted path, and each tree level
feeds its nodes the draft's own output at their parents (see that module's worked example).
"""

from __future__ import annotations

import dataclasses
import time
import weakref

import torch
import torch.nn.functional as F

from ..core.cost import RoundCost
from ..core.level_expansion import Frontier, new_pool
from ..core.policies import TreePolicy
from ..core.tree import DraftTree, ancestor_mask
from ..core.verify import VerifyResult, greedy_verify, sample_verify
from ..kernels.beam_level import beam_ops
from . import rounds
from .cost_samples import CostSamples, TimedForwards
from .kv import SeqState
from .lm import EngineModel, GenRequest
from .profile import measure_cost_samples
from .records import GenOutput, RoundLog, SamplingParams
from .rounds import LevelClock, PolicyClock, SpecBatch, emit_tokens, rows_of

__all__ = ["SamplingParams", "GenOutput", "RoundLog", "SpecEngine"]


class SpecEngine(TimedForwards):
    """Speculative decoding with a separate draft model, or plain decoding.

    Args:
        target: the target model (:class:`~.lm.EngineModel`).
        draft: the draft model (same tokenizer); None for plain decoding only.
    """

    def __init__(self, target: EngineModel, draft: EngineModel | None = None) -> None:
        self.target = target
        self.draft = draft
        #: the draft reads the target's hidden states (EAGLE-3): the target captures the layers it names
        self.eagle = bool(getattr(draft, "needs_target_features", False))
        if self.eagle:
            if not hasattr(target, "capture_layers"):
                raise ValueError("an EAGLE-3 draft needs a target that captures hidden states (a text model)")
            target.capture_layers = list(draft.aux_layers)
        #: the draft scores only some token ids (a text draft with a restricted head): its forwards return the logits
        #: of those ids and their ids, and the policy reads them as such (a fraction of a full-vocabulary softmax)
        self.draft_head = draft is not None and not self.eagle and callable(getattr(draft, "forward_head", None))
        self.use_lean_draft(True)
        self.device = target.device
        self.last_prefill_s = 0.0
        self.last_decode_s = 0.0
        self.last_profile_s = 0.0
        self.last_policy_s = 0.0
        #: measured round costs by :meth:`cost_key`; set an entry to pin one
        self.round_costs: dict[tuple[int, int, int, bool, int], RoundCost] = {}
        #: the timings behind each measured entry refined in the loop (``cost_refresh`` > 0; a pinned entry has none)
        self.cost_samples: dict[tuple[int, int, int, bool, int], CostSamples] = {}
        self._live: CostSamples | None = None  # the samples this decode's forwards are added to
        #: per policy object, its levels' host time (``price_level_host``; kept across calls like the cost curves)
        self.level_clocks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._levels = LevelClock(0)  # this decode's (window 0: kept nowhere)

    def use_lean_draft(self, on: bool) -> bool:
        """A small draft's forward is bound by host work: run it through :class:`~.lean.LeanDecoder` (``on``, the
        default) or transformers' modules (``CpuConfig.cpu_lean_draft``).  Returns whether the lean decoder runs."""
        return callable(getattr(self.draft, "use_lean", None)) and self.draft.use_lean(on)

    # ------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(
        self, requests: list[GenRequest], params: SamplingParams, policy: TreePolicy | None = None
    ) -> list[GenOutput]:
        """Generate for a batch; timings of the call are in ``last_prefill_s`` / ``last_decode_s``."""
        if policy is not None and self.draft is None:
            raise ValueError("speculative decoding needs a draft model")
        if policy is not None and getattr(policy, "fused_cost", False) and self.device.type == "cpu":
            beam_ops()  # registers SAGE's beam-level ops, which the policy calls by name (core/beam_level.py)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(params.seed if params.seed is not None else 0)
        t0 = time.perf_counter()
        prefills = [self.target.prefill(r) for r in requests]
        tstate = SeqState.from_prefills(prefills)
        outputs = [GenOutput(r.request_id, [], "length") for r in requests]
        roots = rounds.choose_tokens(torch.stack([p.last_logits for p in prefills])[:, None], params, gen)[:, 0]
        dstate = None
        if policy is not None and self.eagle:
            dstate = SeqState.from_prefills([self.draft.prefill(r, p.features) for r, p in zip(requests, prefills)])
            feats = torch.stack([p.features[0, -1] for p in prefills])[:, None]  # the root's feature row
        elif policy is not None:
            dstate = SeqState.from_prefills([self.draft.prefill(r) for r in requests])
        self._sync()
        t_prefill = time.perf_counter() - t0
        key, t_profile = self._round_cost(policy, tstate, dstate) if policy is not None else (None, 0.0)
        t1 = time.perf_counter()
        active = emit_tokens(outputs, list(range(len(requests))), roots[:, None], torch.ones_like(roots), params)
        rows = rows_of(active, self.device)
        tstate.select(rows)
        roots = roots[rows]
        ids = [i for i, a in enumerate(active) if a]
        clock = PolicyClock(policy) if policy is not None else None
        if clock is None:
            self._decode_plain(tstate, roots, ids, outputs, params, gen)
        else:
            dstate.select(rows)
            first = feats[rows] if self.eagle else None
            self._live = self.cost_samples.get(key)
            if key is not None and policy.cfg.price_level_host:
                self._levels = self.level_clocks.setdefault(policy, LevelClock())
            try:
                self._decode_spec(clock, tstate, dstate, roots, ids, outputs, params, gen, key, first)
            finally:
                self._live, self._levels = None, LevelClock(0)
        self._sync()
        t2 = time.perf_counter()
        self.last_prefill_s, self.last_decode_s, self.last_profile_s = t_prefill, t2 - t1, t_profile
        self.last_policy_s = clock.seconds if clock is not None else 0.0
        return outputs

    def _round_cost(self, policy: TreePolicy, tstate: SeqState, dstate: SeqState) -> tuple[tuple | None, float]:
        """The :attr:`round_costs` key of this batch size and tree size (measured on first use, then kept) and the
        seconds spent measuring it now; ``(None, 0.0)`` for a policy that does not use it."""
        if not policy.wants_cost:
            return None, 0.0
        key = self.cost_key(policy, tstate.next_pos.shape[0])
        if key in self.round_costs:
            return key, 0.0
        t0 = time.perf_counter()
        width = min(policy.frontier_capacity, 4)  # a typical level: SAGE narrows from W (2-10) with depth
        samples = measure_cost_samples(
            self.target, self.draft_forward, tstate, dstate, policy.tree_capacity - 1, width, sync=self._sync,
            pad=policy.pad_forwards, max_width=policy.frontier_capacity, refresh=policy.cfg.cost_refresh,
        )  # fmt: skip
        self.round_costs[key] = samples.cost()
        if samples.refresh:
            self.cost_samples[key] = samples
        return key, time.perf_counter() - t0

    @staticmethod
    def cost_key(policy: TreePolicy, batch: int) -> tuple[int, int, int, bool, int]:
        """``(batch, max tree nodes, frontier capacity, padded, cost_refresh)``: a curve per shape and refresh (the
        verified tree's capacity: a pooled policy's pool holds more candidates than it verifies)."""
        return batch, policy.tree_capacity - 1, policy.frontier_capacity, policy.pad_forwards, policy.cfg.cost_refresh

    @property
    def draft_forward(self):
        """The draft forward the decode loop runs: a restricted head's ``forward_head`` (:attr:`draft_head`), else the
        draft's ``forward``."""
        return self.draft.forward_head if self.draft_head else self.draft.forward

    def _draft_forward(self, size: int, *args) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A draft forward (timed as :meth:`_timed_forward`): ``(logits [B, Q, S], vocab)``, ``vocab [S]`` the token
        ids of the columns for a draft with a restricted head (:attr:`draft_head`), else ``None`` and ``S = V``."""
        out = self._timed(self.draft_forward, "draft", size, *args)
        return out if self.draft_head else (out, None)

    # ------------------------------------------------------------------------------------------
    # ------------------------------------------------------------------------------------------
    def _decode_plain(self, tstate: SeqState, roots, ids, outputs, params, gen) -> None:
        while ids:
            bsz = len(ids)
            one = torch.ones(bsz, 1, 1, dtype=torch.bool, device=self.device)
            qv = torch.ones(bsz, 1, dtype=torch.bool, device=self.device)
            s0 = tstate.num_slots
            logits = self.target.forward(
                tstate, roots[:, None], tstate.next_pos[:, None], tstate.attention_mask(one, qv)
            )
            tstate.commit(torch.full((bsz, 1), s0, dtype=torch.int64, device=self.device))
            tstate.next_pos += 1
            for rid in ids:
                outputs[rid].target_forwards += 1
            nxt = rounds.choose_tokens(logits, params, gen)[:, 0]
            active = emit_tokens(outputs, ids, nxt[:, None], torch.ones_like(nxt), params)
            roots = nxt
            if not all(active):
                rows = rows_of(active, self.device)
                tstate.select(rows)
                roots, ids = roots[rows], [rid for rid, a in zip(ids, active) if a]
            tstate.compact()

    # ------------------------------------------------------------------------------------------
    def _decode_spec(
        self, policy: TreePolicy, tstate, dstate, roots, ids, outputs, params, gen, key=None, feats=None
    ) -> None:
        """Speculative rounds until every request stops: catch-up, expansion, verification, commit.

        ``key``: the :attr:`round_costs` entry priced (None: no cost); ``feats`` [B, 1, 3H]: an EAGLE-3 draft's
        feature for the first root (the target prefill's last row).
        """
        batch = SpecBatch.start(policy, roots, ids, params, self.device, feats)
        while batch.ids:
            cost = self.round_costs[key] if key is not None else None
            if cost is not None:
                cost = dataclasses.replace(cost, level_ms=self._levels.price())
            pad = cost if policy.pad_forwards else None
            root_logprobs, root_slot, root_hidden, vocab = self._catch_up(dstate, batch, pad)
            plan = policy.plan(batch.pstate, root_logprobs)
            pool, slot_of, forwards = self._expand(
                policy, plan, batch.roots, root_logprobs, root_slot, dstate, cost, root_hidden, vocab
            )
            n_nodes = policy.pool_capacity - 1
            tree = policy.finalize(plan, pool, cost.round_ms(forwards, n_nodes) if cost is not None else None)
            tree = tree.narrow(tree.width, forwards)  # level l's nodes come from forward l: no deeper than that
            tree, res, t0 = self._verify(tree, tstate, batch, params, gen, pad)
            self._commit(tstate, dstate, batch, tree, res, slot_of, t0)
            batch.pstate = policy.observe(batch.pstate, plan, tree, res.accepted_nodes, res.num_accepted, pool)
            rounds.log_round(outputs, batch.ids, plan, tree, res, forwards)
            if self._live is not None and self._live.end_round():
                self.round_costs[key] = self._live.cost()
            active = emit_tokens(outputs, batch.ids, res.emitted, res.num_accepted + 1, params)
            batch.roots = res.bonus
            if not all(active):
                rows = rows_of(active, self.device)
                tstate.select(rows)
                dstate.select(rows)
                batch.select(rows, active)
            tstate.compact()
            dstate.compact()

    def _catch_up(self, dstate: SeqState, batch: SpecBatch, pad=None):
        """Phase 1: one ragged draft forward over each request's pending tokens (root last), at ``pad``'s padded
        width where given (a :class:`RoundCost`).

        Returns ``(root_logprobs [B, V], root_slot [B], root_hidden, vocab)``: the draft's distribution after the
        root, the root's draft KV slot, (EAGLE-3 draft) its output at the root [B, H] (None otherwise) and the token
        ids of the distribution's columns (:meth:`_draft_forward`; None: the whole vocabulary).
        """
        dev, bsz = self.device, len(batch.ids)
        q = int(batch.pend_len.max())
        if pad is not None:
            q = min(pad.draft_width(q), batch.pending.shape[1])
        ar = torch.arange(q, device=dev)
        qv = ar[None] < batch.pend_len[:, None]
        s0 = dstate.num_slots
        causal = torch.ones(q, q, dtype=torch.bool, device=dev).tril().expand(bsz, q, q)
        args = (dstate, batch.pending[:, :q], dstate.next_pos[:, None] + ar, dstate.attention_mask(causal, qv))
        feats = (batch.pend_feats[:, :q],) if self.eagle else ()
        logits, vocab = self._draft_forward(q, *args, *feats)
        dstate.commit(torch.where(qv, s0 + ar, -1))
        dstate.next_pos += batch.pend_len
        last = (batch.pend_len - 1)[:, None, None]
        hidden = None
        if self.eagle:
            h = self.draft.last_hidden
            hidden = h.gather(1, last.expand(-1, 1, h.shape[-1]))[:, 0]
        lp = torch.log_softmax(logits.gather(1, last.expand(-1, 1, logits.shape[-1]))[:, 0], -1)
        return lp, s0 + batch.pend_len - 1, hidden, vocab

    def _expand(
        self, policy, plan, roots, root_logprobs, root_slot, dstate: SeqState, cost: RoundCost | None, root_hidden=None,
        vocab=None,
    ):  # fmt: skip
        """Phase 2: the policy's levels, one batched draft forward per level over the frontier (an EAGLE-3 draft
        feeds each node its parent's output, ``root_hidden`` [B, H] for the root's children; ``vocab``: the token ids
        of the draft distributions' columns, :meth:`_draft_forward`).

        Returns ``(pool, slot_of [B, P+1], forwards)``: the round's pool, each pool node's draft KV slot (-1 if the
        draft never processed it) and the draft forwards of the round (catch-up included).
        """
        dev, bsz = self.device, roots.shape[0]
        n_nodes = policy.pool_capacity - 1
        pool, frontier = new_pool(roots, policy.pool_capacity, policy.k)
        slot_of = torch.full((bsz, policy.pool_capacity + 1), -1, dtype=torch.int64, device=dev)
        slot_of[:, 0] = root_slot
        logprobs = root_logprobs[:, None]
        forwards = 1
        hid = None
        if self.eagle:  # each pool node's draft output, for its children
            hid = root_hidden.new_zeros(bsz, policy.pool_capacity + 1, root_hidden.shape[-1])
            hid[:, 0] = root_hidden
        clock = self._levels
        for level in range(1, policy.max_depth + 1):
            clock.start()
            frontier = policy.step(plan, pool, frontier, logprobs, level, vocab=vocab)
            if level == policy.max_depth:
                break
            if cost is not None and not bool(
                policy.keep_drafting(
                    pool, level, cost.round_ms(forwards, n_nodes), cost.round_ms(forwards + 1, n_nodes)
                )
            ):
                break
            width = int((frontier.idx >= 0).sum(1).max())
            if width == 0:
                break
            if policy.pad_forwards:  # padding columns are -1 (invalid): masked like a ragged batch's
                width = min(cost.draft_width(width), frontier.idx.shape[1])
            frontier = Frontier(frontier.idx[:, :width])  # drop all-padding columns
            fidx, fvalid = frontier.idx, frontier.valid
            extra = rounds.ancestor_slots(pool, slot_of, fidx, level, dstate.num_slots)
            s1 = dstate.num_slots
            eye = torch.eye(width, dtype=torch.bool, device=dev).expand(bsz, width, width)
            args = (
                dstate,
                pool.tokens.gather(1, fidx.clamp(min=0)),
                (dstate.next_pos - 1 + level)[:, None].expand(-1, width),
                dstate.attention_mask(eye, fvalid, extra),
            )
            clock.pause()
            if hid is None:
                logits, vocab = self._draft_forward(width, *args)
            else:
                par = pool.parents.gather(1, fidx.clamp(min=0)).clamp(min=0)
                parent_out = hid.gather(1, par[..., None].expand(-1, -1, hid.shape[-1]))
                logits = self._timed_forward(self.draft, "draft", width, *args, parent_out)
                dst = torch.where(fvalid, fidx, policy.pool_capacity)[..., None].expand(-1, -1, hid.shape[-1])
                hid.scatter_(1, dst, self.draft.last_hidden)
            slot_of.scatter_(
                1,
                torch.where(fvalid, fidx, policy.pool_capacity),
                torch.where(fvalid, s1 + torch.arange(width, device=dev), -1),
            )
            clock.resume()
            logprobs = torch.log_softmax(logits, -1)
            forwards += 1
            clock.end()
        return pool, slot_of, forwards

    def _verify(self, tree: DraftTree, tstate: SeqState, batch: SpecBatch, params: SamplingParams, gen, pad=None):
        """Phase 3: one target forward over ``[root, drafts...]`` at ``prefix + depth`` under the ancestor mask.

        ``pad``: a :class:`RoundCost` whose padded sizes the forward runs at (the extra columns are the tree's own
        padding: masked, never committed).  Returns ``(tree trimmed to its widest request, VerifyResult, first
        target KV slot of the tree)``.
        """
        n = int(tree.num_nodes.max())
        run = n if pad is None else min(pad.verify_nodes(n - 1) + 1, tree.width)
        tokens, parents, depths = tree.tokens[:, :run], tree.parents[:, :run], tree.depths[:, :run]
        t0 = tstate.num_slots
        mask = tstate.attention_mask(ancestor_mask(parents, tree.max_depth), tree.valid()[:, :run])
        pos = tstate.next_pos[:, None] + depths.clamp(min=0)
        logits = self._timed_forward(self.target, "verify", run - 1, tstate, tokens, pos, mask)[:, :n]
        if self.eagle:
            batch.tree_feats = self.target.last_features[:, :n]
        trimmed = tree.narrow(n)
        if params.temperature <= 0:
            return trimmed, greedy_verify(trimmed, logits), t0
        top_k, top_p = rounds.sampling_filters(params, len(batch.ids), self.device)
        return trimmed, sample_verify(trimmed, logits, batch.temperature, top_k, top_p, gen), t0

    def _commit(self, tstate, dstate, batch: SpecBatch, tree: DraftTree, res: VerifyResult, slot_of, t0: int) -> None:
        """Phase 4: commit the accepted path's target KV rows and the draft rows of accepted nodes it already
        processed; the accepted tokens it did not process, then the bonus, become its pending tokens."""
        dev = self.device
        acc, emitted = res.accepted_nodes, res.emitted  # [B, D+1] root-first, D the round's tree depth
        if acc.shape[1] < batch.pend_width:  # the pending buffer keeps its width (-1: no node, no token)
            acc, emitted = (F.pad(t, (0, batch.pend_width - t.shape[1]), value=-1) for t in (acc, emitted))
        tstate.commit(torch.where(acc >= 0, t0 + acc, -1))
        tstate.next_pos += res.num_accepted + 1
        dslot = slot_of.gather(1, tree.source.gather(1, acc.clamp(min=0)))
        dslot = torch.where(acc >= 0, dslot, -1)
        fed = (dslot >= 0) & (torch.arange(acc.shape[1], device=dev)[None] >= 1)
        if self.eagle:  # re-feed the accepted path with the target's features, as SGLang's draft extend does
            fed = torch.zeros_like(fed)
            f = batch.tree_feats
            batch.pend_feats = f.gather(1, acc.clamp(min=0)[..., None].expand(-1, -1, f.shape[-1]))
        dstate.commit(torch.where(fed, dslot, -1))
        n_fed = fed.sum(1)
        dstate.next_pos += n_fed
        d1 = acc.shape[1]
        src = (n_fed[:, None] + torch.arange(d1, device=dev)[None]).clamp(max=d1 - 1)
        batch.pend_len = res.num_accepted - n_fed + 1
        keep = torch.arange(d1, device=dev)[None] < batch.pend_len[:, None]
        batch.pending = torch.where(keep, emitted.gather(1, src), -1)
