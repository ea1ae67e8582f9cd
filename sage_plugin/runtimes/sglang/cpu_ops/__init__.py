"""Pure-PyTorch CPU implementations of the ``sgl_kernel`` CPU ops SGLang 0.5.23 calls on its speculative CPU path.

The PyPI ``sgl_kernel`` is a CUDA build and registers none of the ``torch.ops.sgl_kernel.*_cpu`` ops that
SGLang's CPU speculative path needs (``docs/user-guide/serving-sglang.md``, "On a CPU-only machine").  :func:`register_cpu_ops` defines them with
``torch.library`` (only where nobody defined them yet) and binds this package's functions as their CPU kernels.
SGLang's Python wrappers and the ``intel_amx`` attention backend look the ops up in ``torch.ops.sgl_kernel``
at call time, so registering is enough.  The package imports only torch and the standard library (never
sglang).

Conventions: ``bs`` requests, ``N = draft_token_num`` tree nodes per request (node 0 = the root, i.e. the
last verified token), ``page_size == 1``.  Index inputs may be int32 or int64 (the upstream kernels differ
between versions); outputs are written in the dtype of the buffer the caller passes.  ``req_to_token`` is
addressed like the C++ kernels do, as ``req_to_token.flatten()[row * pool_len + col]`` (the attention ops,
which get no ``pool_len``, index it as ``req_to_token[row, col]``).  Ops mutate their ``(a!)`` arguments in
place and return nothing, except ``build_draft_decode_metadata_cpu``.

Modules (semantics and shapes in each docstring):

* :mod:`.cache_ops`: ``copy_all_layer_kv_cache_cpu``, ``assign_req_to_token_pool_cpu``,
  ``assign_draft_cache_locs_contiguous_cpu``, ``assign_extend_cache_locs_cpu``,
  ``build_draft_decode_metadata_cpu``, ``fill_bonus_tokens_cpu``, ``fill_accept_out_cache_loc_cpu``,
  ``rotate_input_ids_cpu``.
* :mod:`.tree_ops`: ``build_tree_kernel_efficient_cpu``, ``verify_tree_greedy_cpu``,
  ``reconstruct_indices_from_tree_mask_cpu`` (worked example there).
* :mod:`.attention_ops`: ``decode_attention_cpu``, ``extend_attention_cpu`` (the ``intel_amx`` backend's
  paged attention: prefill / extend, decode, multi-step draft decode, TARGET_VERIFY with the QLEN_ONLY tree
  mask, DRAFT_EXTEND).

* :mod:`.model_ops`: ``fused_sigmoid_mul_cpu``, ``fused_qk_gemma_rmsnorm_cpu``,
  ``fused_qk_gemma_rmsnorm_with_gate_cpu``, ``fused_qkvzba_split_reshape_cat_contiguous_cpu``: defined so that
  SGLang's model modules (and with them the Qwen-VL multimodal processors) import; calling one raises.

* :mod:`.sampling_ops`: ``tree_speculative_sampling_target_only_cpu``, ``top_k_renorm_prob_cpu``,
  ``top_p_renorm_prob_cpu``.  These are not ``torch.ops``: SGLang 0.5.23 binds the sampling-verify kernels as
  Python names in ``eagle_utils`` (``None`` on CPU, where it then verifies every request greedily); hook #6
  (``hooks.verify_uses_greedy``) puts these functions there and lets CPU sampling requests take SGLang's
  lossless sampling verify.
"""

from __future__ import annotations

from typing import Callable

import torch

from .attention_ops import decode_attention_cpu, extend_attention_cpu
from .cache_ops import (
    _build_draft_decode_metadata_fake,
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    rotate_input_ids_cpu,
)
from .model_ops import MODEL_ONLY_OPS, unsupported_op
from .tree_ops import (
    FULL_MASK,
    QLEN_ONLY,
    QLEN_ONLY_BITPACKING,
    build_tree_kernel_efficient_cpu,
    reconstruct_indices_from_tree_mask_cpu,
    verify_tree_greedy_cpu,
)

__all__ = [
    "CPU_OP_NAMES",
    "MODEL_ONLY_OPS",
    "FULL_MASK",
    "QLEN_ONLY",
    "QLEN_ONLY_BITPACKING",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "decode_attention_cpu",
    "extend_attention_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask_cpu",
    "register_cpu_ops",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]


# --------------------------------------------------------------------------------------------- registration

# name -> (schema after the name, implementation, fake or None for "mutates only, returns nothing").
# Argument names follow sgl-kernel's C++ (``retrive_*`` spelling included) so keyword calls line up.
_OPS: dict[str, tuple[str, Callable, Callable | None]] = {
    "copy_all_layer_kv_cache_cpu": (
        "(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()",
        copy_all_layer_kv_cache_cpu,
        None,
    ),
    "assign_req_to_token_pool_cpu": (
        "(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, Tensor end_offset, "
        "Tensor out_cache_loc, int pool_len, int? bs_upper=None) -> ()",
        assign_req_to_token_pool_cpu,
        None,
    ),
    "assign_draft_cache_locs_contiguous_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, Tensor(a!) out_cache_loc, int pool_len, "
        "int topk, int num_steps) -> ()",
        assign_draft_cache_locs_contiguous_cpu,
        None,
    ),
    "assign_extend_cache_locs_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, Tensor end_offset, "
        "Tensor(a!) out_cache_loc, int pool_len) -> ()",
        assign_extend_cache_locs_cpu,
        None,
    ),
    "build_draft_decode_metadata_cpu": (
        "(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, int topk, int num_steps, int pool_len) "
        "-> Tensor",
        build_draft_decode_metadata_cpu,
        _build_draft_decode_metadata_fake,
    ),
    "build_tree_kernel_efficient_cpu": (
        "(Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, Tensor(a!) tree_mask, "
        "Tensor(b!) positions, Tensor(c!) retrive_index, Tensor(d!) retrive_next_token, "
        "Tensor(e!) retrive_next_sibling, int topk, int depth, int draft_token_num, int tree_mask_mode) -> ()",
        build_tree_kernel_efficient_cpu,
        None,
    ),
    "verify_tree_greedy_cpu": (
        "(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, Tensor candidates, "
        "Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, Tensor target_predict) -> ()",
        verify_tree_greedy_cpu,
        None,
    ),
    "fill_bonus_tokens_cpu": (
        "(Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, int accept_stride) -> ()",
        fill_bonus_tokens_cpu,
        None,
    ),
    "fill_accept_out_cache_loc_cpu": (
        "(Tensor accept_index, Tensor out_cache_loc, Tensor(a!) accept_out_cache_loc, int? size=None) -> ()",
        fill_accept_out_cache_loc_cpu,
        None,
    ),
    "rotate_input_ids_cpu": (
        "(Tensor(a!) input_ids, Tensor extend_start_loc, Tensor extend_seq_lens, Tensor topk_index, "
        "Tensor? select_index=None) -> ()",
        rotate_input_ids_cpu,
        None,
    ),
    "reconstruct_indices_from_tree_mask_cpu": (
        "(Tensor tree_mask, Tensor verified_seq_len, Tensor(a!) positions, Tensor(b!) retrive_index, "
        "Tensor(c!) retrive_next_token, Tensor(d!) retrive_next_sibling, int batch_size, int draft_token_num) -> ()",
        reconstruct_indices_from_tree_mask_cpu,
        None,
    ),
    "decode_attention_cpu": (
        "(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float key_scale, float value_scale, "
        "Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor attn_logits, Tensor req_to_token, "
        "Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, bool is_cross_attn, "
        "int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()",
        decode_attention_cpu,
        None,
    ),
    "extend_attention_cpu": (
        "(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, Tensor k_buffer, "
        "Tensor v_buffer, float key_scale, float value_scale, Tensor req_to_token, Tensor req_pool_indices, "
        "Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, int max_len_extend, float sm_scale, "
        "float logit_cap, bool is_cross_attn, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks, "
        "Tensor? custom_mask, bool is_causal) -> ()",
        extend_attention_cpu,
        None,
    ),
}
# ops that only have to exist (SGLang's model modules look them up at import time); calling one raises
_OPS.update({name: (schema, unsupported_op(name), unsupported_op(name)) for name, schema in MODEL_ONLY_OPS.items()})

CPU_OP_NAMES: tuple[str, ...] = tuple(_OPS)

# torch.library.Library objects must stay alive: their registrations are dropped when they are collected.
_LIBRARIES: list[torch.library.Library] = []
_OURS: dict[str, list[str]] = {}


def _no_op_fake(*args, **kwargs) -> None:
    """Fake kernel of an op that only mutates its arguments: nothing to allocate."""


def _op_exists(namespace: str, name: str) -> bool:
    return hasattr(getattr(torch.ops, namespace), name)


def _has_cpu_kernel(qualname: str) -> bool:
    try:
        has = torch._C._dispatch_has_kernel_for_dispatch_key
    except AttributeError:  # private API gone: assume the existing op works rather than override it
        return True
    return any(has(qualname, key) for key in ("CPU", "CompositeExplicitAutograd", "CompositeImplicitAutograd"))


def register_cpu_ops(namespace: str = "sgl_kernel") -> list[str]:
    """Define and implement the missing CPU ops in ``torch.ops.<namespace>``; safe to call repeatedly.

    An op is left alone when its schema already exists with a CPU kernel (a real CPU ``sgl_kernel`` build,
    or an earlier call here).  A schema that exists without a CPU kernel gets this package's kernel.  Every
    op this package defines also gets a fake (meta) kernel so ``torch.compile`` can trace calls to it
    (``copy_all_layer_kv_cache_cpu`` writes through raw addresses its schema cannot declare: keep it out of
    compiled regions, as SGLang does).

    Call it after ``sgl_kernel`` (if importable) has been imported: a real CPU build then keeps its own
    kernels, whereas loading such a build after this call would collide with the schemas defined here.

    Returns:
        The op names in ``namespace`` backed by this package's kernels (from this or earlier calls), in
        :data:`CPU_OP_NAMES` order; the same list on every call.
    """
    ours = _OURS.setdefault(namespace, [])
    lib: torch.library.Library | None = None
    for name, (schema, impl, fake) in _OPS.items():
        if name in ours:
            continue
        qualname = f"{namespace}::{name}"
        defined_here = False
        if _op_exists(namespace, name):
            if _has_cpu_kernel(qualname):
                continue  # someone else's kernel (or a real CPU build): never override it
        else:
            lib = lib or torch.library.Library(namespace, "FRAGMENT")
            lib.define(name + schema)
            defined_here = True
        lib = lib or torch.library.Library(namespace, "FRAGMENT")
        lib.impl(name, impl, "CPU")
        if defined_here:
            torch.library.register_fake(qualname, fake or _no_op_fake, lib=lib)
        ours.append(name)
    if lib is not None:
        _LIBRARIES.append(lib)
    order = {name: i for i, name in enumerate(CPU_OP_NAMES)}
    ours.sort(key=order.__getitem__)
    return list(ours)
