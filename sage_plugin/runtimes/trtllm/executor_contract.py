"""What the TensorRT-LLM adapter reads and writes on the executor's objects, and the executor step it was written
against (records of :mod:`.contract`, checked by ``tests/unit/test_trtllm_contract.py`` and followed by the fake
executor of ``tests/engine/test_trtllm_fake_loop.py``; ``docs/design/trtllm.md``, "Recorded interfaces")."""

from __future__ import annotations

__all__ = ["CALL_ORDER", "REQUEST_FIELDS_READ", "REQUEST_FIELDS_WRITTEN", "TREE_WORKER_READ"]

#: ``LlmRequest`` members the drafter reads (``py_*`` are Python attributes, the rest binding members).
REQUEST_FIELDS_READ = frozenset(
    "py_request_id request_id py_seq_slot py_draft_pages_allocated py_num_accepted_draft_tokens "
    "py_disable_speculative_decoding is_dummy is_attention_dp_dummy is_cuda_graph_dummy get_tokens".split()
)
#: ``LlmRequest`` members the drafter writes.
REQUEST_FIELDS_WRITTEN = frozenset({"py_draft_tokens", "py_draft_logits", "py_draft_use_greedy_sampling"})

#: Attributes of ``Eagle3OneModelDynamicTreeWorker`` (set in its ``__init__`` @ :data:`DYNAMIC_TREE_COMMIT`) and of
#: what it holds that the tree policy reads: ``spec_tree_manager.slot_storage.all_ids_buf`` (``[num_slots]`` int64,
#: the batch rows' ``py_seq_slot``, CUDA-graph dummies -> ``num_slots``) and ``attn_metadata.num_contexts``.
TREE_WORKER_READ = frozenset(
    "K max_total_draft_tokens _max_batch_size history_score_buffer history_draft_tokens_buffer "
    "history_draft_tokens_parent_buffer _num_accepted_tokens_buf spec_tree_manager".split()
)

#: The non-overlap executor step as read (1.2-late ``py_executor.py``; main adds ``_handle_dynamic_draft_len``
#: before ``prepare_resources`` and passes ``resource_manager`` to the pad).  The fake executor of
#: ``tests/engine/test_trtllm_fake_loop.py`` follows it.
CALL_ORDER: tuple[str, ...] = (
    "generation requests: request.draft_tokens = [0] * K (scheduler budget)",
    "_prepare_draft_requests: py_last_draft_tokens = py_draft_tokens; py_draft_tokens = [0] * K; "
    "py_draft_pages_allocated = K (0 and [] when speculation is off for the request)",
    "resource_manager.prepare_resources(batch): KV for 1 + py_draft_pages_allocated tokens",
    "drafter.prepare_draft_tokens(batch, resource_manager)",
    "drafter.pad_draft_tokens_for_cuda_graph(batch): zeros up to K",
    "_forward_step(batch): the target over 1 + K tokens per generation request",
    "sampler.update_requests: accept while draft == target token (greedy; padding included) or rejection sampling "
    "with py_draft_logits; add_new_token for accepted + 1; py_num_accepted_draft_tokens; "
    "py_rewind_len = py_draft_pages_allocated - accepted",
    "resource_manager.update_resources(batch): the KV cache rewinds py_rewind_len tokens",
)
