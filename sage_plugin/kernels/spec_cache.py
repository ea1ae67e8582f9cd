"""The speculative step's per-step index ops as single CPU calls: ``csrc/spec_cache.cpp``.

Eight ops in ``torch.ops.sage_plugin``, each the loop over the batch of the ``sgl_kernel`` CPU op of the same name
(``_cpu`` dropped) that SGLang's speculative path calls every decode step:

* ``assign_req_to_token_pool(req_pool_indices, req_to_token!, start, end, out_cache_loc, pool_len)``;
* ``assign_extend_cache_locs(req_pool_indices, req_to_token, start, end, out_cache_loc!, pool_len)``;
* ``assign_draft_cache_locs_contiguous(req_pool_indices, req_to_token, seq_lens, out_cache_loc!, pool_len, topk,
  num_steps)``;
* ``fill_bonus_tokens(accept_tokens, accept_lens, bonus_tokens!, accept_stride)``;
* ``fill_accept_out_cache_loc(accept_index, out_cache_loc, accept_out_cache_loc!, size=None)``;
* ``build_draft_decode_metadata(req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len) -> Tensor``;
* ``verify_tree_greedy(predicts!, accept_index!, accept_token_num!, candidates, retrive_index, retrive_next_token,
  retrive_next_sibling, target_predict)``;
* ``build_tree_kernel_efficient(parent_list, selected_index, verified_seq_len, tree_mask!, positions!,
  retrive_index!, retrive_next_token!, retrive_next_sibling!, topk, depth, draft_token_num, tree_mask_mode)``.

Semantics and shapes: :mod:`sage_plugin.runtimes.sglang.cpu_ops.cache_ops` and ``.tree_ops``, whose torch paths are
the ops' oracles and run wherever the library is not built.  Why one call: a step's host work follows a forward that
streamed the weights through the caches, so each of the torch path's few-element operators starts cold; measured on
the 2-core EPYC VM after a forward-sized weight stream, at 16 requests: ``assign_req_to_token_pool`` 491 us through
torch, one call of the loop about 90; ``build_draft_decode_metadata`` (4 branches, 8,200 columns) 3.1 ms against
0.24.

Worked example: two requests in rows 3 and 0 of ``req_to_token`` (``pool_len`` 8), each verifying two tokens from
positions 5 and 2: ``assign_req_to_token_pool([3, 0], table, [5, 2], [7, 4], [40, 41, 42, 43], 8)`` writes
``table[3, 5:7] = [40, 41]`` and ``table[0, 2:4] = [42, 43]``; ``assign_extend_cache_locs`` with the same rows and
ranges reads them back into ``out[:4]``.
"""

from __future__ import annotations

from typing import Any

import torch

from .native import NAMESPACE, cpu_ops

__all__ = ["spec_cache_ops"]

_MUTATING = (
    "assign_req_to_token_pool",
    "assign_extend_cache_locs",
    "assign_draft_cache_locs_contiguous",
    "fill_bonus_tokens",
    "fill_accept_out_cache_loc",
    "verify_tree_greedy",
    "build_tree_kernel_efficient",
)


def spec_cache_ops() -> Any:
    """The ops (``.assign_req_to_token_pool`` ...), registered on first use, or None where they cannot be built (one
    warning; the per-step ops then run their torch paths)."""
    return cpu_ops("spec_cache", "the speculative per-step index ops run their torch paths", _register_fakes)


def _register_fakes() -> None:
    for name in _MUTATING:  # in-place ops: the fake writes nothing and returns nothing
        torch.library.register_fake(f"{NAMESPACE}::{name}")(lambda *args, **kwargs: None)

    @torch.library.register_fake(f"{NAMESPACE}::build_draft_decode_metadata")
    def _(req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len):
        return req_to_token.new_empty((req_pool_indices.shape[0] * topk, pool_len))
