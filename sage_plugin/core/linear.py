"""Linear layers on CPU at the few rows decoding and verification produce.

``y = x @ weight.T (+ bias)`` at a few rows is bound by streaming ``weight`` from memory (a decoder's weights do not
stay in cache from one forward to the next); how close a BLAS kernel comes to that bound at 2-16 rows differs by CPU.
The rule, by rows of ``x`` (float32 on CPU):

* **1..** :data:`KERNEL_MAX_ROWS` **rows: the rows kernel** (``csrc/rows_linear.cpp``, built for this machine at first
  use by ``torch.utils.cpp_extension``; ``tools/setup.sh`` builds it once), where the inner size is a multiple of 16
  and no gradient is wanted.  Every tile of the weight is read once, prefetched ahead, and multiplied into four rows
  of ``x`` at a time in vector registers.  It is **batch-invariant**: a row's result does not depend on the other rows
  of the call (each output sums its products in one fixed order), so a tree verify computes the same logits for a
  token as the decode step that would have produced it.
* **up to** :data:`MAX_ROWS` **rows otherwise: weight-major** ``(weight @ x.T).T`` (torch's BLAS; also every row
  count where the kernel cannot be built): a single row is duplicated to two, and above 8 rows the product runs at the
  next multiple of 8 (zero rows, cut off again).
* **more rows** (prefill), other devices (cuBLAS picks its own layout), mixed dtypes: ``F.linear``.

Measured by CPU (``python -m sage_plugin.bench.linear_curve``; 2 threads, float32).  On the 2-core AMD EPYC VM of
earlier sessions, whole SmolLM2-135M-Instruct forwards without KV cache (median ms of 15; before the kernel)::

    tokens        1     2     3     4     5     6     8     11    16    32    64
    F.linear     40.4  65.8  78.8  61.0  54.2  57.3  57.1  74.1  70.5  95.1  146.5
    weight-major 26.2  25.5  28.8  26.0  33.7  39.9  45.3  69.7  63.6  87.6  145.5

On a 2-core Intel Xeon (Sapphire Rapids, AVX-512, 300 MB L3) weight-major is the slow one.  There, by rows (medians
of 9, products interleaved): SmolLM2's 211 linear layers in forward order (538 MB of weights, streamed from memory as
in a forward), and whole HF forwards after 200 cached tokens::

    rows                  1     2     3     4     6     8     12    16    24    32
    layers  F.linear     20.2  21.4  22.9  33.4  35.2  43.0  49.7  48.0  53.6  60.7
            weight-major 50.7  50.5  51.4  51.7  52.2  54.3  53.2  56.0  70.2  70.6
            rows kernel  19.7  19.3  21.0  20.4  24.7  25.3  31.9  39.5  55.3  68.7
    forward F.linear     33.6  36.6  39.3  49.8  52.6  60.3  71.4  68.4  78.4  87.8
            weight-major 63.9  64.3  65.8  66.8  68.6  69.5  73.2  74.5  92.5  97.4
            this rule    35.2  37.1  39.6  40.0  44.4  45.1  53.2  62.0  94.2  97.1

The kernel streams the weights at memory speed up to 4 rows and within 1.3x of it at 8 (a 12-token verify costs 1.5x
a decode step, 2.1x with ``F.linear``).  Its outputs were first summed one at a time (a scalar halving tree per
output); they are now summed 16 at a time by shuffles in vector registers, the same additions in the same order (bit
for bit the same results), which takes a fifth to a quarter off the kernel at 8-48 rows (one thread, CPU time of the
211 layers: 8 rows 47.4 -> 39.6 ms, 16 rows 76.1 -> 58.8, 32 rows 130.3 -> 98.1).  Measured again on the Xeon with
it (2 threads, medians of 9, a noisier day: one row takes 24.5 ms against 19.7 above)::

    rows                  1     2     3     4     6     8     12    16    24    32    48    64
    layers  F.linear     28.5  26.4  27.8  44.4  45.9  55.3  72.6  65.2  75.4  85.1  103.6 124.3
            weight-major 62.7  60.6  62.7  65.5  63.0  68.9  66.0  66.2  85.7  84.8  109.5 152.2
            rows kernel  24.5  24.5  26.2  25.8  29.0  30.1  35.4  42.6  59.5  74.5  102.0 130.0

so on AVX-512 the kernel takes up to 32 rows (at 48 it only ties ``F.linear``); above, weight-major.

Until stop 49 GCC folded the kernel's loads into its FMAs' memory operands: each weight vector was re-read for every
row of x it multiplied (16 loads for 12 FMAs in the AVX2 build), and past 4 rows the loop was bound by loads.  Holding
each loaded vector in a register (``lanes.h`` ``in_register``; the same arithmetic, bit for bit the same results)
took the AVX2 build on the 2-core AMD EPYC VM (2 threads, medians of 9, the old and new kernel interleaved in one
process) from 33.8 / 47.5 / 61.3 ms to 22.8 / 29.2 / 37.1 at 8 / 12 / 16 rows (1-4 rows unchanged, memory-bound).
By rows after it (medians of 5; 1-12 and 16-64 rows are two runs minutes apart)::

    rows                  1     2     4     8     12    16    24    32    48    64
    layers  F.linear     70.6  108.0 89.7  84.8  103.4 90.9  116.6 134.6 172.5 200.6
            weight-major 53.9  38.2  45.9  105.8 104.4 86.8  121.0 124.2 183.1 223.5
            rows kernel  24.0  21.7  22.3  28.5  39.3  45.1  60.9  82.5  119.9 160.7

so the AVX2 build takes every row count up to :data:`MAX_ROWS` (it had kept 16, unmeasured above).  On the EPYC,
before the kernel, weight-major beat ``F.linear`` with spikes at ragged row counts; on the Xeon ``F.linear`` is
10-20% faster at 33-64 rows.  Results equal ``F.linear``'s up to
float rounding; every consumer, plain decoding included, takes the same
rule: the reference engine's models and EAGLE-3 heads (:func:`sage_plugin.engines.lm.use_fast_linears`), and SGLang's
linear methods and ``LogitsProcessor`` on CPU (``runtimes/sglang/hooks.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .native import cpu_kernel

__all__ = ["KERNEL_MAX_ROWS", "MAX_ROWS", "kernel_streams", "linear", "rows_kernel", "stored_as"]

#: the most rows taken by the rows kernel or weight-major (above: F.linear)
MAX_ROWS = 64
#: weight-major only: above this many rows the product runs at the next multiple of :data:`PAD_TO` rows
PAD_ABOVE = 8
PAD_TO = 8
#: the rows kernel's inner size must be a multiple of this (its widest vector)
KERNEL_K_MULTIPLE = 16
#: the most rows the rows kernel takes (above it, up to :data:`MAX_ROWS`: weight-major).  32 where torch runs AVX-512
#: (the kernel's 16-lane build ties ``F.linear`` at 48 rows on an Intel Xeon, figures above), :data:`MAX_ROWS`
#: elsewhere (the 8-lane AVX2 build beats both BLAS products at every row count up to 64 on the AMD EPYC VM)
KERNEL_MAX_ROWS = 32 if torch.backends.cpu.get_cpu_capability() == "AVX512" else MAX_ROWS


def rows_kernel() -> Any:
    """The compiled rows kernel (``.rows_linear(x, w)``, ``.lanes``; ``csrc/rows_linear.cpp``), building it on first
    use (:func:`~sage_plugin.core.native.cpu_kernel`); ``None`` where it cannot be built (one warning per process, then
    weight-major)."""
    return cpu_kernel("rows_linear", "using weight-major products")


def _padded_rows(rows: int) -> int:
    """Rows the weight-major product runs at: 1 -> 2; above :data:`PAD_ABOVE`, the next multiple of :data:`PAD_TO`."""
    if rows == 1:
        return 2
    if rows > PAD_ABOVE and rows % PAD_TO:
        return rows + PAD_TO - rows % PAD_TO
    return rows


def _weight_major(x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    rows, k = x2.shape
    padded = _padded_rows(rows)
    if padded != rows:
        x2 = torch.cat([x2, x2.new_zeros(padded - rows, k)] if rows > 1 else [x2, x2])  # cat: repeat costs 10 us
    return torch.mm(weight, x2.t()).t()[:rows].contiguous()


def kernel_streams(weight: torch.Tensor) -> bool:
    """Whether the rows kernel can stream ``weight`` ``[N, K]`` as stored: float32 or bfloat16, contiguous, ``K`` a
    multiple of :data:`KERNEL_K_MULTIPLE` (its consumers: :func:`linear` and the draft's one-call decoder)."""
    return (
        weight.dtype in (torch.float32, torch.bfloat16)
        and weight.is_contiguous()
        and weight.shape[-1] % KERNEL_K_MULTIPLE == 0
    )


def _kernel_applies(x: torch.Tensor, weight: torch.Tensor, rows: int) -> bool:
    return (
        rows <= KERNEL_MAX_ROWS
        and x.dtype == torch.float32
        and kernel_streams(weight)  # its K is x's in any valid call
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: ``x [..., K]``, ``weight [N, K]``, ``bias [N]`` -> ``[..., N]`` (contiguous).

    ``weight`` may be stored in bfloat16 under float32 ``x`` (a draft's weights, ``SageConfig.cpu_draft_dtype``):
    the rows kernel widens it as it streams it (float32 products, half the bytes); elsewhere it is widened first.

    Example: a verify of one request with 5 tree nodes passes the head ``x [1, 5, 576]`` and gets ``[1, 5, 49152]``
    from the rows kernel (two row tiles, 4 + 1); without the kernel, ``weight [49152, 576] @ x.T [576, 5]``
    transposed; a 300-token prefill's rows take ``F.linear``.
    """
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    few_rows = x.device.type == "cpu" and weight.dim() == 2 and 1 <= rows <= MAX_ROWS
    kernel = rows_kernel() if few_rows and _kernel_applies(x, weight, rows) else None
    if kernel is None and weight.dtype == torch.bfloat16 and x.dtype == torch.float32:
        weight = weight.float()  # bfloat16 storage off the kernel's path (a prefill; no kernel here): widened per call
    if kernel is None and not (few_rows and x.dtype == weight.dtype):
        return F.linear(x, weight, bias)
    x2 = x.reshape(rows, k)
    out = kernel.rows_linear(x2.contiguous(), weight) if kernel is not None else _weight_major(x2, weight)
    if bias is not None:
        out.add_(bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def stored_as(weight: torch.Tensor, dtype: torch.dtype) -> torch.nn.Parameter:
    """A layer's ``weight`` as a new parameter stored in ``dtype`` (a draft's ``cpu_draft_dtype``), without
    gradient, carrying the original's attributes (a loader's ``weight_loader``, ...).

    Assign it to the layer (``layer.weight = stored_as(layer.weight, torch.bfloat16)``) rather than casting in place:
    a tensor tied to another module (an embedding) keeps its own dtype.
    """
    out = torch.nn.Parameter(weight.detach().to(dtype), requires_grad=False)
    out.__dict__.update(weight.__dict__)
    return out
