"""Linear layers on CPU at the few rows decoding and verification produce: weight-major.

``y = x @ weight.T (+ bias)`` at a few rows is bound by streaming ``weight`` from memory (a decoder's weights do not
stay in cache from one forward to the next).  On the 2-core AVX2 CPU this project measures on, ``F.linear`` (which
SGLang's linear methods and ``LogitsProcessor`` and HF's ``nn.Linear`` call) streams it slowly and erratically at
1-64 rows, while the same product taken weight-major, ``(weight @ x.T).T``, streams it at close to memory speed; a
single row is duplicated to two because the one-row product takes a slower matrix-vector kernel either way, and
above 8 rows the product runs at the next multiple of 8 (zero rows, cut off again): at other counts the weight-major
kernel is slow too (13-15 rows cost more than 16, 31 more than 32).

Whole forwards of SmolLM2-135M-Instruct (HF, float32, 2 threads, no KV cache, all positions' logits), median ms of
15, by tokens per forward (``F.linear`` / weight-major)::

    tokens     1     2     3     4     5     6     8     11    16    32    64
    linear    40.4  65.8  78.8  61.0  54.2  57.3  57.1  74.1  70.5  95.1  146.5
    weight    26.2  25.5  28.8  26.0  33.7  39.9  45.3  69.7  63.6  87.6  145.5

and of the bundled 4-layer draft: 6.81 / 3.81 ms at 1 token, 10.75 / 3.36 at 2, 9.22 / 3.74 at 4, 8.49 / 5.23 at 8.
Weight-major unpadded / padded to a multiple of 8 above 8 rows (last position's logits only, median of 9)::

    tokens     9     10    12    13    15    16    17    19    23    24    31    32    41    47    55    63    64
    unpadded  47.0  53.9  60.3  73.4  85.9  49.9  63.2  76.0  88.7  63.3  102.2 67.4  96.3  122.1 126.2 143.8 104.9
    padded    47.7  47.4  48.0  48.5  49.1  48.5  60.8  61.4  60.7  62.1  65.6  65.2  83.2  86.6  97.7  106.3 102.9

(Timing one layer alone in a loop is misleading: its weight stays in cache there, and weight-major then loses at 1
and 7-11 rows.)  Above :data:`MAX_ROWS` rows (prefill), and on every other device (cuBLAS picks its own layout),
``F.linear`` is kept.  The results equal ``F.linear``'s up to float rounding (a row's sum is reduced in another order;
neither kernel is batch-invariant to the last bit either), so every consumer, plain decoding included, takes the same
rule: the reference engine's models and EAGLE-3 heads (:func:`sage_plugin.engines.lm.use_fast_linears`), and SGLang's
linear methods and ``LogitsProcessor`` on CPU (``runtimes/sglang/hooks.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["MAX_ROWS", "linear"]

#: the most rows taken weight-major (measured to 64 above)
MAX_ROWS = 64
#: above this many rows the product runs at the next multiple of :data:`PAD_TO` rows (zero rows added, results cut)
PAD_ABOVE = 8
PAD_TO = 8


def _padded_rows(rows: int) -> int:
    """Rows the weight-major product runs at: 1 -> 2; above :data:`PAD_ABOVE`, the next multiple of :data:`PAD_TO`."""
    if rows == 1:
        return 2
    if rows > PAD_ABOVE and rows % PAD_TO:
        return rows + PAD_TO - rows % PAD_TO
    return rows


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: ``x [..., K]``, ``weight [N, K]``, ``bias [N]`` -> ``[..., N]`` (contiguous).

    Example: a verify of one request with 5 tree nodes passes the head ``x [1, 5, 576]`` and gets ``[1, 5, 49152]``,
    computed as ``weight [49152, 576] @ x.T [576, 5]`` then transposed; a decode step's single row ``[1, 576]`` is
    computed as two copies of itself and the first kept; a 300-token prefill's rows take ``F.linear``.
    """
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if x.device.type != "cpu" or weight.dim() != 2 or x.dtype != weight.dtype or not 1 <= rows <= MAX_ROWS:
        return F.linear(x, weight, bias)
    x2 = x.reshape(rows, k)
    padded = _padded_rows(rows)
    if padded != rows:
        x2 = torch.cat([x2, x2.new_zeros(padded - rows, k)] if rows > 1 else [x2, x2])  # cat: repeat costs 10 us
    out = torch.mm(weight, x2.t()).t()[:rows].contiguous()
    if bias is not None:
        out.add_(bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])
