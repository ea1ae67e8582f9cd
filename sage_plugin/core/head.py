"""The output head's matmul on CPU: weight-major for the few rows decoding and verification produce.

``logits = hidden @ weight.T`` with a ``[V, H]`` head (SmolLM2: 49,152 x 576, 113 MB in float32, far beyond the
caches) is memory-bound at a few rows.  On the 2-core AVX2 CPU this project measures on, ``F.linear`` (which SGLang's
``LogitsProcessor`` and HF's ``nn.Linear`` call) streams it slowly and erratically at 1-8 rows, while the same product
taken weight-major, ``(weight @ hidden.T).T``, streams it at close to memory speed; a single row is duplicated to
two because the one-row product takes a slower matrix-vector kernel either way.  Median ms over 21 runs
(``F.linear`` / weight-major), SmolLM2's head::

    rows      1      2      3      6      8      12     16
    linear    6.68   13.94  21.39  16.56  12.58  14.53  14.85
    weight    2.25   2.37   3.26   5.75   6.87   15.04  13.03

and its 8,192-row draft head: 0.42 / 0.33 at 1 row, 1.17 / 0.34 at 2, 2.14 / 0.53 at 3, 1.46 / 0.92 at 8.  Above
:data:`WEIGHT_MAJOR_MAX_ROWS` rows the two are within about 10% and ``F.linear`` is kept.  The results equal
``F.linear``'s up to float rounding (a row's sum is reduced in another order; neither kernel is batch-invariant
to the last bit either), so every consumer, plain decoding included, takes the same path: the reference engine's
heads (:mod:`sage_plugin.engines.lm`) and SGLang's ``LogitsProcessor`` on CPU (``runtimes/sglang/hooks.py``).

Other devices keep ``F.linear`` (cuBLAS picks its own layout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["WEIGHT_MAJOR_MAX_ROWS", "head_logits"]

#: the most rows taken weight-major
WEIGHT_MAJOR_MAX_ROWS = 8
#: heads this large (elements) duplicate a single row (smaller ones fit the caches: one row is as fast alone)
PAD_ONE_ROW_MIN_NUMEL = 1 << 22


def head_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``hidden @ weight.T``: ``hidden [..., H]``, ``weight [V, H]`` -> ``[..., V]`` (contiguous).

    Example: a verify of one request with 5 tree nodes passes ``hidden [1, 5, 576]`` and gets ``[1, 5, 49152]``,
    computed as ``weight [49152, 576] @ x.T [576, 5]`` then transposed; a decode step's single row ``[1, 576]`` is
    computed as two copies of itself and the first kept.
    """
    rows = hidden.numel() // max(1, hidden.shape[-1])
    if hidden.device.type != "cpu" or weight.dim() != 2 or not 0 < rows <= WEIGHT_MAJOR_MAX_ROWS:
        return F.linear(hidden, weight)
    x = hidden.reshape(rows, hidden.shape[-1])
    if rows == 1 and weight.numel() >= PAD_ONE_ROW_MIN_NUMEL:
        x = x.repeat(2, 1)
    out = torch.mm(weight, x.t()).t()[:rows].contiguous()
    return out.reshape(*hidden.shape[:-1], weight.shape[0])
