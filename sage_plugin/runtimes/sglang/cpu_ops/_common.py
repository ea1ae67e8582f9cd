"""Small index helpers shared by :mod:`.cache_ops` and :mod:`.tree_ops`, and their native loops' loader."""

from __future__ import annotations

from typing import Any

import torch

from ....kernels.spec_cache import spec_cache_ops


def native() -> Any:
    """The one-call loops of the per-step ops (``kernels/csrc/spec_cache.cpp``, same semantics as the torch paths of
    :mod:`.cache_ops` and :mod:`.tree_ops`), or None where the library is not built: each op then runs its torch path,
    the loops' oracle."""
    return spec_cache_ops()


def _long(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).to(torch.long)


def _flat_out(t: torch.Tensor, name: str) -> torch.Tensor:
    """A flat view that writes through to ``t`` (the C++ kernels require contiguous outputs too)."""
    if not t.is_contiguous():
        raise RuntimeError(f"{name} must be contiguous")
    return t.view(-1)


def _segments(start: torch.Tensor, end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged ranges ``[start[b], end[b])`` flattened: ``(request id [T], column [T])``."""
    lens = (end - start).clamp(min=0)
    rows = torch.repeat_interleave(torch.arange(lens.numel()), lens)
    first = torch.cumsum(lens, 0) - lens  # exclusive running sum: where each request's run begins
    cols = torch.arange(rows.numel()) - first[rows] + start[rows]
    return rows, cols


def _write_accepted_paths(
    accept_index: torch.Tensor, accept_token_num: torch.Tensor, acc: torch.Tensor
) -> torch.Tensor:
    """Write verified paths ``acc [bs, steps]`` (global node ids, -1 past the path) into SGLang's outputs.

    ``accept_index`` gets the path entries (the rest stays as the caller filled it), ``accept_token_num`` the
    number of accepted drafts (path length - 1).  Returns ``taken [bs, steps]``, the mask of path entries.
    """
    bs, steps = acc.shape
    taken = acc >= 0
    ai = accept_index.view(bs, steps)
    ai[taken] = acc[taken].to(ai.dtype)
    _flat_out(accept_token_num, "accept_token_num")[:bs] = (taken.sum(1) - 1).to(accept_token_num.dtype)
    return taken
