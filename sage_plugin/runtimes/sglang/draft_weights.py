"""The SGLang draft's own weights: its head cut to the draft vocabulary's rows (:class:`DraftHeadRows`, split over
tensor-parallel ranks by :func:`rank_head_ids`) and ``cpu_draft_dtype``, its linear weights stored in bfloat16 on a
CPU server (:func:`store_draft_linears`).

A draft forward at a few rows streams its weights from memory; the rows kernel (``kernels/linear.py``) widens bfloat16
weights to float32 as it streams them, so a bfloat16 copy halves the bytes while every product and sum stays a float32
one.  The hooks that route SGLang's CPU linears and heads to that kernel (``hooks.py``: ``unquantized_linear``,
``compute_lm_head``) take such a weight under float32 activations.  Only the draft's own layers change: a weight the
draft shares with the target (an EAGLE head's embedding or lm_head, ``set_embed_and_head``) is left as it is, and a
layer gets a new parameter, never an in-place cast, so no tied tensor changes under another module.
"""

from __future__ import annotations

from typing import Any

import torch

from ...config import CpuConfig
from ...kernels.linear import rows_kernel, stored_as

__all__ = ["DraftHeadRows", "rank_head_ids", "store_draft_linears"]


def _is_plain_layer(module: Any) -> bool:
    """A float32 CPU layer the hooks compute (not AMX-packed, no quantization, not an embedding lookup; a head tied
    to its embedding is the embedding module itself in SGLang's models, and stays float32)."""
    weight = getattr(module, "weight", None)
    quant = getattr(module, "quant_method", None)
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.float32 or weight.device.type != "cpu":
        return False
    if getattr(module, "use_intel_amx_backend", False) or weight.dim() != 2:
        return False
    if quant is None:  # the SAGE head has no quantization method
        return isinstance(module, DraftHeadRows)
    name = type(quant).__name__
    # an embedding method serves lookups too: only an output head (ParallelLMHead) is a product
    return name == "UnquantizedLinearMethod" or (
        name == "UnquantizedEmbeddingMethod" and "Head" in type(module).__name__
    )


def store_draft_linears(model: Any, cfg: CpuConfig, shared: Any = None) -> int:
    """Store the draft ``model``'s plain linear weights and head in bfloat16 (``cfg.cpu_draft_dtype``), in place.

    Args:
        model: the draft runner's model.
        cfg: the server's CPU section (``float32``: nothing changes).
        shared: a model whose parameters must not change (the target, whose embedding / head an EAGLE head shares).

    Returns:
        the number of layers stored in bfloat16 (0 off CPU, without the rows kernel, or with ``float32``).
    """
    if cfg.cpu_draft_dtype != "bfloat16":
        return 0
    keep = {p.data_ptr() for p in shared.parameters()} if shared is not None else set()
    layers = [m for m in model.modules() if _is_plain_layer(m) and m.weight.data_ptr() not in keep]
    if not layers or rows_kernel() is None:  # a GPU draft has no CPU layer (and builds no CPU kernel)
        return 0
    for module in layers:
        module.weight = stored_as(module.weight, torch.bfloat16)  # the loader's attributes kept
    return len(layers)


class DraftHeadRows(torch.nn.Module):
    """A draft's output head cut to the rows ``ids`` (what SGLang's ``LogitsProcessor`` needs: a ``weight``)."""

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight.detach().index_select(0, ids.to(weight.device)), requires_grad=False)


def rank_head_ids(ids: torch.Tensor, world: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Split a draft vocabulary ``ids`` [n] (ascending) over ``world`` tensor-parallel ranks, in order.

    SGLang's ``LogitsProcessor`` all-gathers each rank's logits along the vocabulary in rank order, so rank ``r``
    holds the ``r``-th equal chunk of the draft vocabulary's rows and the gathered logits come out in ``ids``
    order.  The chunks must be equal: ``ids`` is padded to a multiple of ``world`` by repeating its last id (a
    repeated row scores exactly as its original; SGLang maps either index back to the same token).  Returns
    (the padded ids [n'], one chunk per rank).

    >>> full, parts = rank_head_ids(torch.tensor([2, 5, 7, 11, 13]), 2)
    >>> full.tolist(), [p.tolist() for p in parts]
    ([2, 5, 7, 11, 13, 13], [[2, 5, 7], [11, 13, 13]])
    """
    pad = -ids.numel() % world
    full = torch.cat([ids, ids[-1:].expand(pad)]) if pad else ids
    return full, list(full.chunk(world))
