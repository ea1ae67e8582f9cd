"""The only place SAGE patches SGLang: nineteen ``HookRegistry`` AROUND hooks (flags, node choice, metrics, CPU sampling,
CPU linear layers, CPU tensor parallelism, CPU overlap scheduling, the CPU ragged verify's lengths, exact request
parameters, LLaVA-OV's sub-configs, dtypes and verify forwards: :mod:`.llava_compat`; the admission delayer's hold:
:mod:`.admission_hold`).

SGLang 0.5.23 has no API for plugin-owned command-line flags (``docs/design/sglang-internals.md``, "Flags"),
so the plugin wraps the two functions of its parse path.  Each hook has an entry in ``patches/INDEX.md``;
``tests/integration/sglang/test_hook_targets.py`` checks that the targets still exist.

* :func:`add_cli_args` (AROUND ``ServerArgs.add_cli_args``, a staticmethod): after SGLang's own flags,
  adds the SAGE argument group (:func:`.args.add_sage_arguments`).  ``launch_server --help`` lists it,
  and SGLang's ``--config`` YAML accepts the same keys (``sage-w-max: 6``).
* :func:`from_cli_args` (AROUND ``ServerArgs.from_cli_args``, a classmethod): after SGLang builds its
  record, stores the SAGE flags on it as ``_sage_cli`` (a :class:`.args.SageCliArgs`).  ``ServerArgs``
  accepts underscore non-field attributes as bookkeeping, pickles them, and restores them in the
  spawned scheduler processes, so the record carries the flags everywhere SGLang sends it
  (``validate_server_args``, ``handle_server_args``, the worker factory).  Read them back with
  :func:`.args.sage_cli_of`.

* :func:`organize_draft_results` (AROUND ``sglang.srt.speculative.eagle_utils.organize_draft_results``): when a
  SAGE draft worker is drafting (:data:`ACTIVE_SELECTION` is set), the verified nodes are SAGE's choice
  (:class:`.selection.BeamSelection`); otherwise SGLang's own top-N.  ``HookRegistry`` also rebinds the copy
  ``eagle_worker_v2`` imported, which is the one the draft step calls.

* :func:`add_speculative_state` (AROUND ``SchedulerInternalStateController._add_speculative``): adds to each
  scheduler's state in ``GET /server_info`` (``internal_states``) SGLang's accept counts so far (``spec_totals``, any
  algorithm: :func:`.request_meta.spec_totals`) and a ``"sage"`` section: the SAGE worker's counters (mean alpha / D / W /
  shaped nodes / accept length, lagged one step) and the KV pool's free and evictable token counts.

* :func:`output_streamer_class` (AROUND ``Scheduler.get_output_streamer_class``, the subclass point SGLang documents
  for auxiliary response fields): under a SAGE algorithm, the streamer treats ``"sage"`` as a request-level
  ``customized_info`` key, so a request's SAGE summary (:mod:`.request_meta`) reaches ``meta_info`` once, at its end.

* :func:`verify_uses_greedy` (AROUND ``sglang.srt.speculative.eagle_utils._verify_uses_greedy``): SGLang 0.5.23
  verifies every CPU request greedily, even at ``temperature > 0`` (it has no CPU sampling-verify kernel), so
  sampled output would silently be argmax output.  On CPU this hook puts the plugin's pure-torch kernels
  (:mod:`.cpu_ops.sampling_ops`: lossless tree sampling, top-k / top-p renormalisation) where ``eagle_utils``
  has ``None`` for them, and answers as if not on CPU, so sampling requests take SGLang's own lossless sampling
  verify (for every tree algorithm on CPU: SAGE, EAGLE, STANDALONE).  Greedy batches and the rejection-sampling
  path (Triton only) keep SGLang's answer.

* :func:`report_decode_stats` (AROUND ``SchedulerMetricsReporter.report_decode_stats``): with ``--enable-metrics``,
  at SGLang's own metrics interval (``--decode-log-interval`` decode steps), sets the SAGE Prometheus gauges
  (:data:`PROMETHEUS_GAUGES`, ``sglang:sage_*``, labelled like SGLang's scheduler gauges) from the SAGE worker's
  counters.

* :func:`compute_lm_head` (AROUND ``LogitsProcessor._compute_lm_head``) and :func:`unquantized_linear`
  (AROUND ``UnquantizedLinearMethod.apply``): on CPU, a float32 unquantized head (without bias, LoRA, the AMX packed
  layout) or linear layer (not AMX-packed) is computed by :func:`sage_plugin.kernels.linear.linear` (the rows kernel at
  1-32 rows on AVX-512 and weight-major above up to 64, 1-64 on AVX2: kernels/linear.py has the figures by CPU), the rule the reference engine uses.  Plain and speculative serving alike (target and draft); every other case
  keeps SGLang's product.

* :func:`init_model_parallel_group` (AROUND ``sglang.srt.distributed.parallel_state.init_model_parallel_group``):
  without CUDA no group builds a PyNccl communicator (upstream builds one on CPU too, which stops every
  ``--tp-size`` > 1 CPU launch); the groups' collectives take their gloo group as upstream's CPU branches do.
* :func:`gather_spec_extras` (AROUND ``sglang.kernels.ops.speculative.gather_spec_extras.gather_spec_extras``): the
  overlap scheduler's row gather of the speculative relay buffers, a Triton kernel upstream, runs in torch for CPU
  tensors, so speculative serving on CPU can keep SGLang's overlap scheduler.

* :func:`amx_extend_metadata` (AROUND ``IntelAMXAttnBackend._build_extend_metadata``): a ragged verify's target
  forward (``ragged_verify.py``, ``ragged_verify``) runs its live rows with per-request extend lengths and the live blocks of
  the tree mask, which it carries on the forward batch; upstream's uniform TARGET_VERIFY lengths otherwise.

* :func:`.penalties.eagle_sample` (AROUND ``eagle_utils.eagle_sample``), :func:`.penalties.copy_for_forward` (AROUND
  ``SamplingBatchInfo.copy_for_forward``) and :func:`.penalties.cumulate_penalty_output_tokens` (AROUND
  ``ScheduleBatch.cumulate_penalty_output_tokens``): under SAGE, penalties, ``min_tokens``, ``min_p`` and custom logit
  processors give plain decoding's output, and requests may opt out of speculation (:mod:`.penalties`).

Hooks are registered by :func:`install_hooks` (from ``register()``) and applied by SGLang's
``load_plugins()`` after every plugin ran.  Hook functions here import nothing from SGLang.
"""

from __future__ import annotations

import argparse
import logging
from contextvars import ContextVar
from typing import Any, Callable

from .admission_hold import ADMISSION_HOOKS, hold_section
from .args import STASH_ATTR, SageCliArgs, add_sage_arguments
from .cpu_ops.sampling_ops import cpu_sampling_kernels_in_place
from .llava_compat import LLAVA_HOOKS
from .penalties import copy_for_forward, cumulate_penalty_output_tokens, eagle_sample, is_sage
from .request_meta import spec_totals

__all__ = [
    "ACTIVE_SELECTION",
    "HOOK_TARGETS",
    "add_cli_args",
    "from_cli_args",
    "install_hooks",
    "organize_draft_results",
    "add_speculative_state",
    "compute_lm_head",
    "unquantized_linear",
    "output_streamer_class",
    "report_decode_stats",
    "verify_uses_greedy",
    "init_model_parallel_group",
    "gather_spec_extras",
    "amx_extend_metadata",
]

logger = logging.getLogger(__name__)

ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"
ORGANIZE_DRAFT_RESULTS = "sglang.srt.speculative.eagle_utils.organize_draft_results"
ADD_SPECULATIVE_STATE = (
    "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController._add_speculative"
)
OUTPUT_STREAMER_CLASS = "sglang.srt.managers.scheduler.Scheduler.get_output_streamer_class"
EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
VERIFY_USES_GREEDY = f"{EAGLE_UTILS}._verify_uses_greedy"
REPORT_DECODE_STATS = (
    "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter.report_decode_stats"
)
COMPUTE_LM_HEAD = "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head"
AMX_EXTEND_METADATA = "sglang.srt.layers.attention.intel_amx_backend.IntelAMXAttnBackend._build_extend_metadata"
UNQUANTIZED_LINEAR = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply"
INIT_MODEL_PARALLEL_GROUP = "sglang.srt.distributed.parallel_state.init_model_parallel_group"
GATHER_SPEC_EXTRAS = "sglang.kernels.ops.speculative.gather_spec_extras.gather_spec_extras"
EAGLE_SAMPLE = f"{EAGLE_UTILS}.eagle_sample"
COPY_FOR_FORWARD = "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.copy_for_forward"
CUMULATE_PENALTY = "sglang.srt.managers.schedule_batch.ScheduleBatch.cumulate_penalty_output_tokens"
#: Prometheus gauge -> (key of the SAGE worker's ``sage_stats()``, help text)
PROMETHEUS_GAUGES = {
    "sglang:sage_rounds": ("sage_rounds", "SAGE: drafted request-rounds since start."),
    "sglang:sage_mean_alpha": ("sage_mean_alpha", "SAGE: mean draft confidence alpha per request-round."),
    "sglang:sage_mean_depth": ("sage_mean_depth", "SAGE: mean planned tree depth D per request-round."),
    "sglang:sage_mean_width": ("sage_mean_width", "SAGE: mean planned tree width W per request-round."),
    "sglang:sage_mean_shaped_nodes": ("sage_mean_shaped_nodes", "SAGE: mean SAGE-shaped verified nodes."),
    "sglang:sage_mean_accept_length": ("sage_mean_accept_length", "SAGE: mean accept length (drafts + bonus)."),
}
_gauges: dict[str, Any] = {}  # created once per process, on first use

#: The SAGE selection of the draft step in progress (set by ``SageDraftWorker.draft``), else None.
ACTIVE_SELECTION: ContextVar[Callable[..., Any] | None] = ContextVar("sage_active_selection", default=None)


def add_cli_args(original: Callable[[argparse.ArgumentParser], None], parser: argparse.ArgumentParser) -> None:
    """AROUND ``ServerArgs.add_cli_args(parser)``: SGLang's flags, then the ``--sage-*`` group."""
    original(parser)
    add_sage_arguments(parser)


def from_cli_args(original: Callable[..., Any], cls: type, args: argparse.Namespace) -> Any:
    """AROUND ``ServerArgs.from_cli_args(cls, args)``: SGLang's record, with the SAGE flags stored on it."""
    record = original(cls, args)
    cli = SageCliArgs.from_namespace(args)
    setattr(record, STASH_ATTR, cli)
    algorithm = getattr(args, "speculative_algorithm", None)
    if cli.given and (algorithm or "").upper() != "SAGE":
        logger.warning("--sage-* flags are ignored: --speculative-algorithm is %s, not sage", algorithm)
    return record


def organize_draft_results(original: Callable[..., Any], score_list, token_list, parents_list, num_draft_token):
    """AROUND ``organize_draft_results``: SAGE's verified nodes while a SAGE draft worker drafts, else SGLang's."""
    selection = ACTIVE_SELECTION.get()
    if selection is None:
        return original(score_list, token_list, parents_list, num_draft_token)
    return selection(score_list, token_list, parents_list, num_draft_token)


def add_speculative_state(original: Callable[..., Any], self: Any, state: dict) -> None:
    """AROUND ``_add_speculative(self, state)``: SGLang's speculative fields, then ``state["sage"]``."""
    original(self, state)
    scheduler = self.scheduler
    state.update(spec_totals(scheduler))  # every speculative algorithm (request_meta.py)
    draft = _sage_draft_worker(scheduler)
    if draft is None:
        return
    section = {**draft.sage_stats(), **hold_section(scheduler)}  # --sage-admission-hold-steps (admission_hold.py)
    section["kv_available_tokens"] = int(scheduler.token_to_kv_pool_allocator.available_size())
    section["kv_evictable_tokens"] = int(scheduler.tree_cache.evictable_size())
    worker = getattr(scheduler, "draft_worker", None)
    tiers = getattr(worker, "sage_tiers", None)
    if tiers is not None:  # --sage-tiers: per tier its steps run, expected tokens and measured cost
        section["tiers"] = tiers.chooser.summary()
        section["tier_switches"] = tiers.switches
        if tiers.acceptance is not None:  # --sage-tier-request-prior: each request's own rate (request_acceptance.py)
            offs = tiers.chooser.median_offs  # --sage-tier-median-request: steps off for the median request
            section["request_acceptance"] = {**tiers.acceptance.summary(), "median_off_steps": offs}
        section["off_decode_steps"] = worker.sage_off_decode_steps  # --sage-tier-off-decode (off_decode.py)
        steps, rows, drafted = worker.sage_ragged_rows  # --sage-ragged-verify (ragged_verify.py)
        section["ragged_verify"] = {"steps": steps, "rows": rows, "rows_drafted": drafted}
    from .lean_draft import lean_forwards

    lean = lean_forwards(draft.draft_runner.model)
    if lean is not None:  # cpu_lean_draft: draft forwards that ran the lean decoder (lean_draft.py)
        section["lean_draft_forwards"] = lean
        section["lean_draft_kernel_forwards"] = lean_forwards(draft.draft_runner.model, kernel=True)
    if getattr(draft, "sage_tp", None) is not None:  # --tp-size > 1: steps whose tree came from rank 0 (tp_sync)
        section["tp_tree_syncs"] = draft.sage_tp_syncs
    lag = getattr(draft, "sage_lag", None)
    if lag is not None:  # --sage-tier-off-lag: off steps that skipped the draft extend, and the catch-ups (off_lag.py)
        section["off_lag"] = {"skipped_extends": lag.skipped, "catch_ups": lag.catch_ups}
    state["sage"] = section


def output_streamer_class(original: Callable[..., Any], self: Any) -> type:
    """AROUND ``Scheduler.get_output_streamer_class(self)``: SGLang's class, with ``"sage"`` request-level under SAGE."""
    cls = original(self)
    if not is_sage(self.spec_algorithm):
        return cls
    from .request_meta import sage_streamer_class

    return sage_streamer_class(cls)


def verify_uses_greedy(original: Callable[..., Any], **kwargs: Any) -> bool:
    """AROUND ``_verify_uses_greedy(*, is_all_greedy, is_cpu, is_hip, is_xpu, use_rejection_sampling)``.

    On CPU, a batch with sampling requests takes SGLang's sampling verify once the CPU kernels are in place.
    """
    if (
        kwargs.get("is_cpu")
        and not kwargs.get("is_all_greedy")
        and not kwargs.get("use_rejection_sampling")
        and cpu_sampling_kernels_in_place()
    ):
        kwargs = {**kwargs, "is_cpu": False}
    return original(**kwargs)


def _cpu_float32_weight(layer: Any, x: Any) -> Any:
    """``layer.weight`` when ``x`` is a float32 CPU tensor, the weight float32 (or bfloat16: a SAGE draft's layers
    under ``cpu_draft_dtype``, ``draft_weights.py``) and the layer not AMX-packed (the case whose product upstream
    leaves to ``F.linear``), else None."""
    import torch

    weight = getattr(layer, "weight", None)
    if (
        isinstance(weight, torch.Tensor)
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype in (torch.float32, torch.bfloat16)
        and not getattr(layer, "use_intel_amx_backend", False)
    ):
        return weight
    return None


def compute_lm_head(
    original: Callable[..., Any], self: Any, hidden_states: Any, lm_head: Any, embedding_bias: Any = None, **kwargs: Any
) -> Any:
    """AROUND ``LogitsProcessor._compute_lm_head(self, hidden_states, lm_head, embedding_bias=None, *, out=None)``.

    The CPU float32 plain head (no bias, LoRA, quantization method or RL on-policy cast) takes
    :func:`~sage_plugin.kernels.linear.linear` (``out`` is a CUDA-only buffer upstream: its CPU branch never writes it).
    """
    from ...kernels.linear import linear

    weight = _cpu_float32_weight(lm_head, hidden_states)
    quant = getattr(lm_head, "quant_method", None)
    if (
        weight is not None
        and embedding_bias is None
        and (quant is None or type(quant).__name__ == "UnquantizedEmbeddingMethod")
        and not hasattr(lm_head, "set_lora")
        and getattr(self, "rl_on_policy_target", None) is None
    ):
        return linear(hidden_states, weight)
    return original(self, hidden_states, lm_head, embedding_bias, **kwargs)


def unquantized_linear(original: Callable[..., Any], self: Any, layer: Any, x: Any, bias: Any = None) -> Any:
    """AROUND ``UnquantizedLinearMethod.apply(self, layer, x, bias=None)``: a CPU float32 layer that is not
    AMX-packed takes :func:`~sage_plugin.kernels.linear.linear` (upstream's CPU branch is ``F.linear``)."""
    from ...kernels.linear import linear

    weight = _cpu_float32_weight(layer, x)
    return original(self, layer, x, bias) if weight is None else linear(x, weight, bias)


def init_model_parallel_group(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND ``init_model_parallel_group(group_ranks, local_rank, backend, use_pynccl=None, ...)``.

    Without CUDA (``--device cpu``) a group never builds a PyNccl communicator: upstream 0.5.23 defaults
    ``use_pynccl`` to True on CPU, whose communicator then asks for a CUDA device and stops every ``--tp-size`` > 1
    CPU launch at start-up.  The group's collectives go through its gloo ``device_group`` as upstream's CPU branches
    already do.  With CUDA nothing changes.
    """
    import torch

    if not torch.cuda.is_available():
        if len(args) > 3:  # group_ranks, local_rank, backend, use_pynccl
            args = (*args[:3], False, *args[4:])
        else:
            kwargs["use_pynccl"] = False
    return original(*args, **kwargs)


def gather_spec_extras(
    original: Callable[..., Any], indices: Any, topk_p_buf: Any, topk_index_buf: Any, output_tokens_buf: Any,
    hidden_states_buf: Any,
) -> Any:  # fmt: skip
    """AROUND ``gather_spec_extras(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)``.

    The overlap scheduler hands each speculative step its draft inputs (top probabilities and ids, bonus tokens,
    hidden states) by gathering rows of the relay buffers; upstream's one implementation is a Triton kernel, which
    has no CPU driver.  CPU tensors take the same row gather in torch (``index_select``); others the original.
    """
    if indices.device.type != "cpu":
        return original(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)
    idx = indices.long()
    bufs = (topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)
    return tuple(None if b is None else b.index_select(0, idx) for b in bufs)


def amx_extend_metadata(original: Callable[..., Any], self: Any, forward_batch: Any) -> Any:
    """AROUND ``IntelAMXAttnBackend._build_extend_metadata(self, forward_batch)``: a ragged verify's TARGET_VERIFY batch
    (``ragged_verify.py``) carries its own ``(seq_lens, extend_seq_lens, extend_start_loc, tree_mask)`` as its verify
    input's ``sage_ragged``;
    upstream derives uniform lengths from ``spec_info.draft_token_num`` for every TARGET_VERIFY batch, and its eager
    runner re-plans target verify batches every time, so the lengths are handed over here.  Every other batch:
    upstream's."""
    ragged = (
        getattr(forward_batch.spec_info, "sage_ragged", None) if forward_batch.forward_mode.is_target_verify() else None
    )
    return original(self, forward_batch) if ragged is None else ragged


def _sage_draft_worker(scheduler: Any) -> Any:
    draft = getattr(getattr(scheduler, "draft_worker", None), "_draft_worker", None)
    return draft if draft is not None and hasattr(draft, "sage_stats") else None


def report_decode_stats(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``report_decode_stats(self, ...)``: SGLang's report, then the SAGE gauges at its metrics interval."""
    out = original(self, *args, **kwargs)
    if (
        not getattr(self, "current_scheduler_metrics_enabled", False)
        or self.forward_ct_decode % self.decode_log_interval
    ):
        return out
    draft = _sage_draft_worker(self.scheduler)
    if draft is None:
        return out
    labels = dict(self.metrics_collector.labels)
    if not _gauges:
        from prometheus_client import Gauge

        for name, (_, doc) in PROMETHEUS_GAUGES.items():
            _gauges[name] = Gauge(name=name, documentation=doc, labelnames=list(labels), multiprocess_mode="mostrecent")
    stats = draft.sage_stats()
    for name, (key, _) in PROMETHEUS_GAUGES.items():
        if key in stats:
            _gauges[name].labels(**labels).set(stats[key])
    return out


#: (target, hook) pairs, all AROUND; the targets are listed in patches/INDEX.md.
HOOKS: tuple[tuple[str, Callable[..., Any]], ...] = (
    (ADD_CLI_ARGS, add_cli_args),
    (FROM_CLI_ARGS, from_cli_args),
    (ORGANIZE_DRAFT_RESULTS, organize_draft_results),
    (ADD_SPECULATIVE_STATE, add_speculative_state),
    (OUTPUT_STREAMER_CLASS, output_streamer_class),
    (VERIFY_USES_GREEDY, verify_uses_greedy),
    (REPORT_DECODE_STATS, report_decode_stats),
    (COMPUTE_LM_HEAD, compute_lm_head),
    (UNQUANTIZED_LINEAR, unquantized_linear),
    (INIT_MODEL_PARALLEL_GROUP, init_model_parallel_group),
    (GATHER_SPEC_EXTRAS, gather_spec_extras),
    (AMX_EXTEND_METADATA, amx_extend_metadata),
    (EAGLE_SAMPLE, eagle_sample),
    (COPY_FOR_FORWARD, copy_for_forward),
    (CUMULATE_PENALTY, cumulate_penalty_output_tokens),
    *LLAVA_HOOKS,
    *ADMISSION_HOOKS,
)
HOOK_TARGETS: tuple[str, ...] = tuple(target for target, _ in HOOKS)


def install_hooks() -> int:
    """Register every hook in :data:`HOOKS` with SGLang's ``HookRegistry`` once; return how many were new.

    Idempotent: a hook already registered for its target (an earlier call, or an earlier copy of this
    module) is skipped, because ``HookRegistry`` would otherwise wrap the target twice and
    ``add_cli_args`` would add every flag twice (an argparse conflict).
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    added = 0
    for target, hook in HOOKS:
        existing = HookRegistry._hooks.get(target, ())  # private, 0.5.23: no public "is registered" query
        if any(_same_function(registered, hook) for _, registered, _ in existing):
            continue
        HookRegistry.register(target, hook, HookType.AROUND)
        added += 1
    return added


def _same_function(a: Any, b: Callable[..., Any]) -> bool:
    return a is b or (
        getattr(a, "__module__", None) == b.__module__ and getattr(a, "__qualname__", None) == b.__qualname__
    )
