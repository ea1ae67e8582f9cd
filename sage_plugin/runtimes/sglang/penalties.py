"""Exact request parameters under SAGE on SGLang 0.5.23: per-node penalties, exact penalizer state, per-request opt-out.

SGLang's speculative verify (``eagle_utils.eagle_sample``) applies one penalty state per request to every node of its
tree, and its decode preparation feeds the penalizers one token per step (``ScheduleBatch.cumulate_penalty_output_tokens``
takes ``output_ids[-1]``), however many the step accepted; it applies no ``min_p`` and no custom logit processor in
the tree, and takes top-p of the top-k-renormalised distribution where plain sampling filters both jointly.  Under
SAGE this module makes each of them what plain decoding does (``docs/user-guide/serving-sglang.md``, "Request
parameters"), with three AROUND hooks (``patches/INDEX.md``), each a pass-through outside SAGE:

* :func:`cumulate_penalty_output_tokens`: the penalizers are fed every output token the request committed since they
  were last fed (:func:`advance_penalizers`), so after a step their state holds exactly the accepted tokens;
* :func:`copy_for_forward`: the forward copy of a SAGE decode batch's sampling info carries a snapshot of the
  penalizers as :mod:`sage_plugin.core.penalties` terms (:class:`PenaltySnapshot`, cloned on the forward's stream:
  the scheduler advances the originals in place while an overlapped forward may still read them);
* :func:`eagle_sample`: inside a SAGE verify (:data:`ACTIVE_VERIFY`), every node's logits get the penalties of its own
  path, after the request's output tokens the snapshot has not seen yet (the overlap scheduler prepares a step before
  the previous one's tokens reach ``output_ids``; :class:`.output_tail.OutputTail` has them on the device); requests
  that do not speculate (:func:`opt_out_reason`) verify their root only; top-k and top-p filter the target's tree
  distributions jointly where SGLang's plain sampler does (:func:`joint_filters`), ``min_p`` after them; a request's
  custom logit processor runs on its root row after the penalties, the grammar mask and ``logit_bias``, in plain
  decoding's order.

Nothing here reads a device tensor on the host: the snapshot and the per-node penalties are device ops, the opt-out
mask is built from host request fields.
"""

from __future__ import annotations

import sys
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable

import torch

from sage_plugin.config import OPT_OUT_PARAMS, opt_out_names
from sage_plugin.core.filters import min_p_keep, renormalise
from sage_plugin.core.penalties import MinTokens, TokenPenalty, advance, path_tokens, tree_parents, tree_penalties

from .cpu_ops.sampling_ops import EAGLE_UTILS, cpu_sampling_kernels_in_place
from .output_tail import OutputTail

__all__ = [
    "ACTIVE_VERIFY",
    "OPT_OUT_KEY",
    "USES_PARAM",
    "PenaltySnapshot",
    "VerifyContext",
    "advance_penalizers",
    "copy_for_forward",
    "cumulate_penalty_output_tokens",
    "eagle_sample",
    "is_sage",
    "joint_filters",
    "opt_out_reason",
    "penalty_terms",
    "prefilled",
    "sampling_backend",
    "verify_context",
]

#: ``custom_params`` key a request sets to ``true`` to run without speculation (the name of SGLang's RFC #30263)
OPT_OUT_KEY = "disable_speculative_decoding"
#: whether a request's sampling params use each parameter ``--sage-opt-out-params`` may list (config.OPT_OUT_PARAMS)
USES_PARAM: dict[str, Callable[[Any], bool]] = {
    "frequency_penalty": lambda sp: sp.frequency_penalty != 0.0,
    "presence_penalty": lambda sp: sp.presence_penalty != 0.0,
    "repetition_penalty": lambda sp: sp.repetition_penalty != 1.0,
    "min_new_tokens": lambda sp: sp.min_new_tokens > 0,
    "logit_bias": lambda sp: bool(sp.logit_bias),
    "json_schema": lambda sp: sp.json_schema is not None,
    "regex": lambda sp: sp.regex is not None,
    "ebnf": lambda sp: sp.ebnf is not None,
    "structural_tag": lambda sp: sp.structural_tag is not None,
    "sampling": lambda sp: sp.temperature > 0.0 and sp.top_k != 1,
}
assert tuple(USES_PARAM) == OPT_OUT_PARAMS, "one predicate per name of config.OPT_OUT_PARAMS"
SNAPSHOT_ATTR = "_sage_penalties"  # on a forward copy of SamplingBatchInfo
FED_ATTR = "_sage_fed"  # on a Req: how many of its output_ids its penalizers were fed
BASE_ATTR = "_sage_base"  # on a Req: len(output_ids) at its prefill (where its penalizer state started)
REASON_ATTR = "_sage_opt_out"  # on a Req: why it does not speculate ("" where it does)

_FREQUENCY, _PRESENCE, _REPETITION, _MIN_NEW = (
    "BatchedFrequencyPenalizer",
    "BatchedPresencePenalizer",
    "BatchedRepetitionPenalizer",
    "BatchedMinNewTokensPenalizer",
)


@dataclass(frozen=True)
class PenaltySnapshot:
    """A decode batch's penalizers as core terms, and how many output tokens each request's state has seen.

    Attributes:
        additive: :class:`TokenPenalty` / :class:`MinTokens` terms in SGLang's order (its orchestrator's).
        scaling: the multiplicative :class:`TokenPenalty` terms.
        seen: ``[B]`` int64, output tokens fed to each request's state since its prefill.
    """

    additive: tuple[TokenPenalty | MinTokens, ...]
    scaling: tuple[TokenPenalty, ...]
    seen: torch.Tensor


@dataclass
class VerifyContext:
    """What a SAGE verify hands :func:`eagle_sample`: the workers' output tail and the requests that do not speculate
    (``opt_out [B]`` bool on the device, None when every request speculates)."""

    tail: OutputTail
    opt_out: torch.Tensor | None = None


#: set by the SAGE worker around its verify; None outside one
ACTIVE_VERIFY: ContextVar[VerifyContext | None] = ContextVar("sage_active_verify", default=None)


def is_sage(spec_algorithm: Any) -> bool:
    """Whether ``spec_algorithm`` (SGLang's ``SpeculativeAlgorithm``) is one of SAGE's: SAGE, SAGE_EAGLE,
    SAGE_EAGLE3."""
    return str(getattr(spec_algorithm, "name", "")).startswith("SAGE")


def opt_out_reason(req: Any, params: frozenset[str]) -> str:
    """Why ``req`` runs without speculation ("" when it speculates), kept on the request after the first call.

    A custom logit processor always opts out (it may read anything, so no tree of it can be exact); so does
    ``custom_params: {"disable_speculative_decoding": true}``; so does any parameter in ``params``
    (``--sage-opt-out-params``, names of :data:`USES_PARAM`).
    """
    reason = getattr(req, REASON_ATTR, None)
    if reason is not None:
        return reason
    sp = req.sampling_params
    reason = ""
    if getattr(req, "custom_logit_processor", None):
        reason = "custom_logit_processor"
    elif (sp.custom_params or {}).get(OPT_OUT_KEY) is True:
        reason = f"custom_params.{OPT_OUT_KEY}"
    else:
        reason = next((name for name in sorted(params) if USES_PARAM[name](sp)), "")
    setattr(req, REASON_ATTR, reason)
    return reason


def penalty_terms(orchestrator: Any) -> tuple[list[TokenPenalty | MinTokens], list[TokenPenalty]]:
    """SGLang's prepared penalizers as core terms, in the orchestrator's order; accumulators cloned.

    Raises:
        TypeError: a penalizer this module does not know (the penalizer set of SGLang 0.5.23 is four classes).
    """
    additive: list[TokenPenalty | MinTokens] = []
    scaling: list[TokenPenalty] = []
    for penalizer in orchestrator.penalizers.values():
        if not penalizer.is_prepared():
            continue
        name = type(penalizer).__name__
        if name == _FREQUENCY:
            additive.append(TokenPenalty(penalizer.frequency_penalties, penalizer.cumulated_frequency_penalties.clone(), True))  # fmt: skip
        elif name == _PRESENCE:
            additive.append(TokenPenalty(penalizer.presence_penalties, penalizer.cumulated_presence_penalties.clone(), False))  # fmt: skip
        elif name == _MIN_NEW:
            additive.append(MinTokens(penalizer.min_new_tokens, penalizer.stop_token_penalties, penalizer.len_output_tokens.clone()))  # fmt: skip
        elif name == _REPETITION:
            scaling.append(TokenPenalty(penalizer.repetition_penalties, penalizer.cumulated_repetition_penalties.clone(), False))  # fmt: skip
        else:
            raise TypeError(f"SAGE cannot apply SGLang penalizer {name} per tree node")
    return additive, scaling


def advance_penalizers(orchestrator: Any, tokens: torch.Tensor, counts: torch.Tensor) -> None:
    """Feed ``tokens [B, L]`` (-1 pad; ``counts [B]`` real ones per row) to every prepared penalizer, in place:
    what SGLang's ``cumulate_output_tokens`` does for one token per request, for any number."""
    for penalizer in orchestrator.penalizers.values():
        if not penalizer.is_prepared():
            continue
        name = type(penalizer).__name__
        if name == _FREQUENCY:
            advance(penalizer.cumulated_frequency_penalties, tokens, penalizer.frequency_penalties, accumulate=True)
        elif name == _PRESENCE:
            advance(penalizer.cumulated_presence_penalties, tokens, penalizer.presence_penalties, accumulate=False)
        elif name == _REPETITION:
            advance(penalizer.cumulated_repetition_penalties, tokens, penalizer.repetition_penalties, accumulate=False)
        elif name == _MIN_NEW:
            penalizer.len_output_tokens += counts.to(penalizer.len_output_tokens.dtype).unsqueeze(1)
        else:
            raise TypeError(f"SAGE cannot feed SGLang penalizer {name}")


def _host_to(rows: list[list[int]], device: Any, width: int | None = None) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = torch.full((len(rows), width), -1, dtype=torch.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.int64)
    if torch.device(device).type == "cuda":
        return out.pin_memory().to(device, non_blocking=True)
    return out.to(device)


def cumulate_penalty_output_tokens(original: Callable[..., Any], self: Any) -> None:
    """AROUND ``ScheduleBatch.cumulate_penalty_output_tokens(self)``: under SAGE, every output token not fed yet."""
    if not is_sage(self.spec_algorithm):
        return original(self)
    rows = []
    for req in self.reqs:
        fed = getattr(req, FED_ATTR, None)
        if fed is None:  # no prefill seen by the SAGE worker (cannot happen in a SAGE server): start here
            fed = len(req.output_ids)
            setattr(req, BASE_ATTR, fed)
        rows.append(list(req.output_ids[fed:]))
        setattr(req, FED_ATTR, fed + len(rows[-1]))
    if any(rows):
        tokens = _host_to(rows, self.device)  # -1 pad after each row's tokens
        advance_penalizers(self.sampling_info.penalizer_orchestrator, tokens, (tokens >= 0).sum(dim=1))
    return None


def copy_for_forward(original: Callable[..., Any], self: Any) -> Any:
    """AROUND ``SamplingBatchInfo.copy_for_forward(self)``: a SAGE decode batch's copy carries a :class:`PenaltySnapshot`."""
    out = original(self)
    orchestrator = self.penalizer_orchestrator
    if orchestrator is None or not orchestrator.is_required:
        return out
    batch = orchestrator.batch
    if batch is None or not is_sage(batch.spec_algorithm) or batch.forward_mode.is_extend():
        return out
    additive, scaling = penalty_terms(orchestrator)
    seen = [getattr(r, FED_ATTR, 0) - getattr(r, BASE_ATTR, 0) for r in batch.reqs]
    setattr(out, SNAPSHOT_ATTR, PenaltySnapshot(tuple(additive), tuple(scaling), _host_to([seen], batch.device)[0]))
    return out


def _min_p_kernel(kernel: Callable[..., Any], min_ps: torch.Tensor) -> Callable[..., Any]:
    """``kernel`` (SGLang's ``tree_speculative_sampling_target_only``) on target distributions filtered by min-p after
    top-k / top-p, as SGLang's plain sampler filters them (:func:`~sage_plugin.core.filters.min_p_keep`),
    renormalised."""

    def sample(**kwargs: Any) -> Any:
        probs = kwargs["target_probs"]  # [B, N, V]
        kwargs["target_probs"] = renormalise(probs, min_p_keep(probs, min_ps.view(-1, 1, 1)))
        return kernel(**kwargs)

    return sample


def joint_filters(top_k: Callable[..., Any], top_p: Callable[..., Any]) -> dict[str, Callable[..., Any]]:
    """``eagle_utils``' ``top_k_renorm_prob`` / ``top_p_renorm_prob`` (``top_k``, ``top_p``) made SGLang's plain joint
    filter: the nucleus taken on the distribution *before* top-k, intersected with the top-k set, renormalised.

    SGLang's plain samplers filter both on the softmax (the torch sampler's ``probs_sum`` is summed before top-k zeroes
    anything; the fused GPU sampler runs ``filter_apply_order="joint"``), while its speculative verify takes the nucleus
    of the top-k-renormalised distribution, a smaller set whenever the top k hold less than all the mass (top-k 2,
    top-p 0.5 over ``[0.4, 0.3, 0.3]``: plain samples from ``{0.4, 0.3}``, the renormalised nucleus is the first token
    alone).  The verify calls top-k then top-p on the same rows; the first call's input is kept for the second.
    """
    before: list[torch.Tensor] = []

    def top_k_renorm_prob(probs: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
        before[:] = [probs]
        return top_k(probs, top_ks)

    def top_p_renorm_prob(probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
        if not before:  # no top-k before it: the nucleus of the softmax itself
            return top_p(probs, top_ps)
        return renormalise(probs, top_p(before.pop(), top_ps) > 0)

    return {"top_k_renorm_prob": top_k_renorm_prob, "top_p_renorm_prob": top_p_renorm_prob}


def sampling_backend() -> str:
    """The server's ``--sampling-backend`` (SGLang's runtime context: published once the server runs)."""
    from sglang.srt.runtime_context import get_exec

    return get_exec().kernel.sampling_backend


def _joint_plain(info: Any) -> bool:
    """Whether SGLang's plain sampler filters ``info``'s batch jointly (:func:`joint_filters`): always with the torch
    sampler; the fused GPU samplers renormalise top-k before top-p when the batch needs min-p."""
    if not (info.need_top_k_sampling and info.need_top_p_sampling):
        return False
    return not (info.need_min_p_sampling and sampling_backend() in ("flashinfer", "intel_xpu"))


def _root_processors(logits: torch.Tensor, info: Any, n: int) -> None:
    """Each custom logit processor on its requests' root rows (row ``b * n``), in place (SGLang's
    ``apply_custom_logit_processor`` for one token per request)."""
    for entry in info.custom_logit_processor.values():
        rows = entry.indices.long() * n
        picked = logits.index_select(0, rows)
        result = entry.processor(picked, [info.custom_params[i] for i in entry.rows])
        logits.index_copy_(0, rows, result.to(logits.dtype))


def eagle_sample(original: Callable[..., Any], verify_input: Any, batch: Any, logits_output: Any, *args: Any,
                 **kwargs: Any) -> Any:  # fmt: skip
    """AROUND ``eagle_utils.eagle_sample(verify_input, batch, logits_output, grammar_mask=None, ...)`` (module
    docstring); SGLang's own outside a SAGE verify."""
    ctx = ACTIVE_VERIFY.get()
    if ctx is None or batch.forward_mode.is_idle():
        return original(verify_input, batch, logits_output, *args, **kwargs)
    info = batch.sampling_info
    n = int(verify_input.draft_token_num)
    bs = len(batch.seq_lens)
    logits = logits_output.next_token_logits
    slots = batch.req_pool_indices
    if ctx.opt_out is not None:  # the root gets no children: the verify accepts nothing and samples at the root
        first = verify_input.retrieve_next_token
        first[:, 0] = torch.where(ctx.opt_out, -1, first[:, 0])
    snapshot: PenaltySnapshot | None = getattr(info, SNAPSHOT_ATTR, None)
    saved = {name: getattr(info, name) for name in ("acc_additive_penalties", "acc_scaling_penalties", "logit_bias")}
    if args:
        grammar_mask, args = args[0], args[1:]
    else:
        grammar_mask = kwargs.pop("grammar_mask", None)
    module = sys.modules[EAGLE_UTILS]
    if not info.is_all_greedy and logits.device.type == "cpu":
        cpu_sampling_kernels_in_place()  # on CPU the tree sampling kernel is the plugin's, installed on first use
    kernel = module.tree_speculative_sampling_target_only
    filters: dict[str, Callable[..., Any]] = {}  # eagle_utils' kernels this call wraps, each put back after it
    if not info.is_all_greedy and kernel is not None:
        if info.need_min_p_sampling:
            filters["tree_speculative_sampling_target_only"] = _min_p_kernel(kernel, info.min_ps)
        if _joint_plain(info):
            filters.update(joint_filters(module.top_k_renorm_prob, module.top_p_renorm_prob))
    wrapped = {name: getattr(module, name) for name in filters}
    try:
        if snapshot is not None:
            parent = tree_parents(verify_input.retrieve_next_token, verify_input.retrieve_next_sibling)
            path = path_tokens(parent, verify_input.draft_token.view(bs, n), int(verify_input.max_tree_depth))
            unseen = ctx.tail.unseen(slots, snapshot.seen)  # [B, R] the output the state has not seen
            tokens = torch.cat([unseen.unsqueeze(1).expand(bs, n, unseen.shape[1]), path], dim=2)
            tree_penalties(logits, tokens, additive=snapshot.additive, scaling=snapshot.scaling)
            info.acc_additive_penalties = info.acc_scaling_penalties = None
        if info.has_custom_logit_processor:  # plain order: penalties, grammar, logit_bias, then the processor
            if info.logit_bias is not None:
                logits.add_(torch.repeat_interleave(info.logit_bias, n, dim=0))
                info.logit_bias = None
            if grammar_mask is not None:
                grammar_mask.apply(logits)
                grammar_mask = None
            _root_processors(logits, info, n)
        for name, fn in filters.items():
            setattr(module, name, fn)
        predict, accept_lens, accept_index = original(verify_input, batch, logits_output, grammar_mask, *args, **kwargs)
    finally:
        for name, fn in wrapped.items():  # only the kernels this call replaced: one installed meanwhile stays
            setattr(module, name, fn)
        for name, value in saved.items():
            setattr(info, name, value)
    if snapshot is not None:  # the accepted tokens, for the next step's unseen output
        accepted = torch.where(accept_index >= 0, predict[accept_index.clamp(min=0).long()], -1)
        ctx.tail.append(slots, accepted, accept_lens)
    return predict, accept_lens, accept_index


def _tail(worker: Any, batch: Any) -> OutputTail:
    tail = getattr(worker, "_sage_tail", None)
    if tail is None:  # the deepest step's tokens plus one, twice: the overlap scheduler lags one step
        width = 2 * (max(int(worker.speculative_num_steps), 1) + 2)
        tail = worker._sage_tail = OutputTail(int(batch.req_to_token_pool.size) + 1, width, batch.seq_lens.device)
    return tail


def verify_context(worker: Any, batch: Any) -> VerifyContext:
    """The :class:`VerifyContext` of a SAGE worker's verify of ``batch`` (a ScheduleBatch): its output tail, and the
    requests that verify their root only: each request's :func:`opt_out_reason` under the worker's ``opt_out_params``,
    and those the tier control's per-request gate stops (``tier_request_gate``, ``SageTierController.mask``)."""
    params = frozenset(opt_out_names(worker.sage_cfg.runtime.opt_out_params))
    off = [bool(opt_out_reason(req, params)) for req in batch.reqs]
    tiers = getattr(worker, "sage_tiers", None)
    gate = None if tiers is None else tiers.mask  # the tier control's per-request gate: host bools, True speculates
    if gate is not None and len(gate) == len(off):
        off = [o or not g for o, g in zip(off, gate)]
    mask = _host_to([off], batch.seq_lens.device)[0].bool() if any(off) else None
    return VerifyContext(_tail(worker, batch), mask)


def prefilled(worker: Any, batch: Any, next_token_ids: torch.Tensor) -> None:
    """A prefill of ``batch``'s requests sampled ``next_token_ids [B]``: their penalizer state starts here (SGLang
    builds it anew for a prefill), and their output tail holds that one token."""
    for req in batch.reqs:
        setattr(req, BASE_ATTR, len(req.output_ids))
        setattr(req, FED_ATTR, len(req.output_ids))
    _tail(worker, batch).reset(batch.req_pool_indices, next_token_ids)
