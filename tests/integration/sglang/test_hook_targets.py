"""Contract test: every SGLang symbol SAGE hooks or calls still exists in the installed SGLang, as assumed.

SGLang only *logs* an unresolvable hook target, so a renamed target would silently drop the ``--sage-*``
flags; this test makes it loud.  Each hook target must also be documented in ``patches/INDEX.md``.
"""

from __future__ import annotations

import inspect
import pkgutil
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from sage_plugin.compat import SGLANG_VERSION  # noqa: E402
from sage_plugin.runtimes.sglang.admission_hold import SHOULD_DELAY  # noqa: E402
from sage_plugin.runtimes.sglang.hooks import (  # noqa: E402
    ADD_CLI_ARGS,
    ADD_SPECULATIVE_STATE,
    AMX_EXTEND_METADATA,
    COMPUTE_LM_HEAD,
    COPY_FOR_FORWARD,
    CUMULATE_PENALTY,
    EAGLE_SAMPLE,
    FROM_CLI_ARGS,
    GATHER_SPEC_EXTRAS,
    HOOK_TARGETS,
    INIT_MODEL_PARALLEL_GROUP,
    ORGANIZE_DRAFT_RESULTS,
    OUTPUT_STREAMER_CLASS,
    REPORT_DECODE_STATS,
    UNQUANTIZED_LINEAR,
    VERIFY_USES_GREEDY,
)
from sage_plugin.runtimes.sglang.llava_compat import LLAVA_FORWARD, LLAVA_LOAD_WEIGHTS, LLAVA_QWEN_INIT  # noqa: E402

INDEX = Path(__file__).resolve().parents[3] / "patches" / "INDEX.md"

#: Hook target -> (decorator kind on the class, or None for a module function; parameters of the original).
HOOK_SHAPES = {
    ADD_CLI_ARGS: (staticmethod, ["parser"]),
    FROM_CLI_ARGS: (classmethod, ["cls", "args"]),
    ORGANIZE_DRAFT_RESULTS: (None, ["score_list", "token_list", "parents_list", "num_draft_token"]),
    ADD_SPECULATIVE_STATE: (None, ["self", "state"]),
    OUTPUT_STREAMER_CLASS: (None, ["self"]),
    VERIFY_USES_GREEDY: (None, ["is_all_greedy", "is_cpu", "is_hip", "is_xpu", "use_rejection_sampling"]),
    REPORT_DECODE_STATS: (None, ["self", "can_run_cuda_graph", "running_batch", "num_generated_tokens"]),
    COMPUTE_LM_HEAD: (None, ["self", "hidden_states", "lm_head", "embedding_bias", "out"]),
    UNQUANTIZED_LINEAR: (None, ["self", "layer", "x", "bias"]),
    GATHER_SPEC_EXTRAS: (None, ["indices", "topk_p_buf", "topk_index_buf", "output_tokens_buf", "hidden_states_buf"]),
    AMX_EXTEND_METADATA: (None, ["self", "forward_batch"]),
    EAGLE_SAMPLE: (
        None,
        [
            "verify_input",
            "batch",
            "logits_output",
            "grammar_mask",
            "uno_target_max_top_k",
            "watermark_state",
            "watermark_full_mask",
        ],
    ),  # fmt: skip
    COPY_FOR_FORWARD: (None, ["self"]),
    CUMULATE_PENALTY: (None, ["self"]),
    LLAVA_QWEN_INIT: (None, ["self", "config", "quant_config", "prefix"]),
    LLAVA_LOAD_WEIGHTS: (None, ["self", "weights"]),
    LLAVA_FORWARD: (None, ["self", "input_ids", "positions", "forward_batch"]),
    SHOULD_DELAY: (None, ["self", "running_bs", "num_allocatable_reqs"]),
    INIT_MODEL_PARALLEL_GROUP: (
        None,
        [
            "group_ranks",
            "local_rank",
            "backend",
            "use_pynccl",
            "use_custom_allreduce",
            "use_message_queue_broadcaster",
            "group_name",
            "use_mscclpp",
            "use_torch_symm_mem_allreduce",
            "recovered_rank",
            "rank_offset",
            "max_world_size",
        ],
    ),
}

#: Upstream symbols the adapter calls or subclasses (not hooked, but pinned by the same version).
USED_SYMBOLS = [
    "sglang.srt.plugins.load_plugins",
    "sglang.srt.plugins.hook_registry.HookRegistry.register",
    "sglang.srt.plugins.hook_registry.HookRegistry._hooks",  # private: install_hooks() checks it for duplicates
    "sglang.srt.plugins.hook_registry.HookType.AROUND",
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.register",
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.from_string",
    "sglang.srt.speculative.spec_registry.CustomSpecAlgo",
    "sglang.srt.managers.overlap_utils.FutureMap",
    "sglang.srt.speculative.eagle_info.EagleVerifyInput.tree_topk",  # ragged_verify.py: a chain's verify has no tree mask
    "sglang.srt.utils.common.is_cpu",
    "sglang.srt.layers.quantization.unquant.UnquantizedEmbeddingMethod",  # compute_lm_head's plain-head test
    # cpu_draft_dtype (draft_weights.py) tells layers apart by these class names
    "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod",
    "sglang.srt.layers.vocab_parallel_embedding.ParallelLMHead",
    "sglang.srt.layers.vocab_parallel_embedding.VocabParallelEmbedding",
    "sglang.srt.utils.common.use_intel_amx_backend",  # reads the layer's use_intel_amx_backend attribute
    # the SAGE worker subclasses / calls these (worker.py)
    "sglang.srt.speculative.standalone_worker_v2.StandaloneWorkerV2.forward_batch_generation",
    "sglang.srt.speculative.standalone_worker_v2.StandaloneDraftWorker.draft",
    "sglang.srt.speculative.standalone_worker_v2.StandaloneDraftWorker.init_cuda_graphs",
    "sglang.srt.speculative.eagle_worker_v2.organize_draft_results",
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation",
    # the off tier's verify forward in DECODE mode (off_decode.py; the call's shape: tests/integration/sglang/test_off_decode.py)
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.verify",
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._build_trivial_verify_input",
    "sglang.srt.speculative.eagle_worker_common.run_eagle_verify",
    "sglang.srt.model_executor.forward_batch_info.ForwardMode.DECODE",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft_forward",  # the plan in the draft graph, INDEX.md
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill",  # VLM prompts, INDEX.md
    "sglang.srt.speculative.base_spec_worker.EagleDraftWorkerBase",
    # the draft's lean decoder (lean_draft.py, INDEX.md): the instance forward it replaces and what it reads
    "sglang.srt.models.llama.LlamaModel.forward",
    "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding",
    "sglang.srt.layers.layernorm.RMSNorm",
    # meta_info["sage"] (request_meta.py): the auxiliary-output contract and the request-level key of the streamer
    "sglang.srt.managers.auxiliary_output.append_auxiliary_output",
    "sglang.srt.managers.utils.GenerationBatchResult.copy_auxiliary_output_to_cpu",
    "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer.is_request_level_customized_info_key",
    "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor.consume_auxiliary_output",
    # CPU sampling verify (hook #6): the verify's helpers it relies on
    "sglang.srt.speculative.eagle_utils.sampling_softmax",
    "sglang.srt.speculative.eagle_utils._verify_coins",
    # exact request parameters (hooks #13-15, penalties.py): the penalizer classes and fields they read
    "sglang.srt.sampling.penaltylib.BatchedFrequencyPenalizer",
    "sglang.srt.sampling.penaltylib.BatchedPresencePenalizer",
    "sglang.srt.sampling.penaltylib.BatchedRepetitionPenalizer",
    "sglang.srt.sampling.penaltylib.BatchedMinNewTokensPenalizer",
    # Prometheus gauges (hook #7): SGLang's labels and its metrics interval
    "sglang.srt.observability.metrics_collector.SchedulerMetricsCollector.log_stats",
]


#: Module globals hook #6 fills where SGLang leaves them None (no kernel on the platform): they must exist.
PLATFORM_KERNELS = [
    "sglang.srt.speculative.eagle_utils.tree_speculative_sampling_target_only",
    "sglang.srt.speculative.eagle_utils.top_k_renorm_prob",
    "sglang.srt.speculative.eagle_utils.top_p_renorm_prob",
]


def _resolve(path: str):
    module, _, attr = path.rpartition(".")
    return getattr(pkgutil.resolve_name(module), attr)


def test_hook_table_covers_every_hook():
    assert set(HOOK_SHAPES) == set(HOOK_TARGETS)


@pytest.mark.parametrize("target", HOOK_TARGETS)
def test_hook_target_exists_with_the_assumed_shape(target):
    owner_path, _, name = target.rpartition(".")
    owner = pkgutil.resolve_name(owner_path)
    kind, params = HOOK_SHAPES[target]
    if kind is None:
        original = inspect.unwrap(getattr(owner, name))
        assert inspect.isfunction(original), f"{target} is no longer a function"
        assert list(inspect.signature(original).parameters) == params
        return
    raw = vars(owner)[name]  # before the descriptor protocol: staticmethod / classmethod
    assert isinstance(raw, kind), f"{target} is no longer a {kind.__name__}"
    original = inspect.unwrap(raw.__func__)  # past a HookRegistry wrapper, if applied in this process
    assert list(inspect.signature(original).parameters) == params


@pytest.mark.parametrize("path", USED_SYMBOLS)
def test_used_symbol_exists(path):
    assert _resolve(path) is not None


@pytest.mark.parametrize("path", PLATFORM_KERNELS)
def test_platform_kernel_name_exists(path):
    module, _, attr = path.rpartition(".")
    assert hasattr(pkgutil.resolve_name(module), attr)


def test_worker_base_classes_exist():
    pytest.importorskip("sgl_kernel")
    assert inspect.isclass(_resolve("sglang.srt.speculative.standalone_worker_v2.StandaloneWorkerV2"))
    assert inspect.isclass(_resolve("sglang.srt.speculative.standalone_worker_v2.StandaloneDraftWorker"))


@pytest.mark.parametrize("target", HOOK_TARGETS)
def test_hook_documented_in_patch_index(target):
    text = INDEX.read_text()
    assert f"`{target}`" in text, f"patches/INDEX.md has no entry for {target}"
    assert f"sglang=={SGLANG_VERSION}" in text
