"""Linear layers on CPU at the few rows decoding and verification produce.

:func:`linear` computes ``F.linear(x, weight, bias)``: ``x [..., K]``, ``weight [N, K]``, ``bias [N]`` ->
``[..., N]``, equal to ``F.linear``'s result up to float rounding.  At a few rows the product is bound by streaming
``weight`` from memory (a decoder's weights do not stay in cache from one forward to the next), and how close a BLAS
kernel comes to that bound at 2-16 rows differs by CPU, so the number of rows of ``x`` (``x.numel() // K``, float32 on
CPU) picks the path:

* **1..** :data:`KERNEL_MAX_ROWS` **rows: the rows kernel** (the custom op ``torch.ops.sage_plugin.rows_linear``,
  ``csrc/rows_linear.cpp``, built for this machine's instruction set level at first use
  (:mod:`~sage_plugin.kernels.native`); ``sage setup`` builds it once), where the inner size is a multiple of 16 and
  no gradient is wanted.  Every tile of the weight is read once, prefetched ahead, and multiplied into four rows of
  ``x`` at a time in vector registers; each loaded vector stays in a register for every row it multiplies
  (``simd.h``, ``in_register``), so past 4 rows the loop is bound by arithmetic rather than by loads.  It is
  **batch-invariant**: a row's result does not depend on the other rows of the call (each output sums its products
  in one fixed order, 16 at a time in vector registers), so a tree verify computes the same logits for a token as the
  decode step that would have produced it.
* **up to** :data:`MAX_ROWS` **rows otherwise: weight-major** ``(weight @ x.T).T`` (torch's BLAS; also every row
  count where the kernel cannot be built): a single row is duplicated to two, and above 8 rows the product runs at the
  next multiple of 8 (zero rows, cut off again), which avoids BLAS's slow ragged row counts.
* **more rows** (prefill), other devices (cuBLAS picks its own layout), mixed dtypes: ``F.linear``.

:data:`KERNEL_MAX_ROWS` is 32 on AVX-512 (there the kernel's 16-lane build ties ``F.linear`` near 48 rows, and
weight-major is slower than ``F.linear``), :data:`MAX_ROWS` on AVX2 (the 8-lane build is the fastest of the three
products up to 64 rows) and 0 on a baseline x86-64 CPU or off x86-64.  ``python -m sage_plugin.bench.linear_curve``
times the three products by rows on the machine it runs on (``docs/benchmarks.md``, "Linear layers by rows").

Every consumer, plain decoding included, takes the same rule: the reference engine's models and EAGLE-3 heads
(:func:`sage_plugin.engines.lm.use_fast_linears`), and SGLang's linear methods and ``LogitsProcessor`` on CPU
(``runtimes/sglang/hooks.py``).

Example (3 rows through the kernel where it builds, weight-major where it does not)::

    >>> x, w = torch.randn(3, 64), torch.randn(8, 64)
    >>> y = linear(x, w)
    >>> y.shape, torch.allclose(y, F.linear(x, w), atol=1e-4)
    (torch.Size([3, 8]), True)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .native import NAMESPACE, cpu_ops, host_isa

__all__ = ["KERNEL_MAX_ROWS", "MAX_ROWS", "kernel_streams", "linear", "rows_kernel", "stored_as"]

#: the most rows taken by the rows kernel or weight-major (above: F.linear)
MAX_ROWS = 64
#: weight-major only: above this many rows the product runs at the next multiple of :data:`PAD_TO` rows
PAD_ABOVE = 8
PAD_TO = 8
#: the rows kernel's inner size must be a multiple of this (its widest vector)
KERNEL_K_MULTIPLE = 16
#: the most rows the rows kernel takes (above it, up to :data:`MAX_ROWS`: weight-major), by the level it is built for
#: (:func:`~sage_plugin.kernels.native.host_isa`): 32 on AVX-512 (the kernel's 16-lane build ties ``F.linear`` near 48
#: rows there), :data:`MAX_ROWS` on AVX2 (the 8-lane build beats both BLAS products at every row count up to 64), 0 on
#: a baseline x86-64 CPU (the build without vector instructions is never faster than BLAS)
KERNEL_MAX_ROWS = {"avx512": 32, "avx2": MAX_ROWS}.get(host_isa() or "", 0)


def rows_kernel() -> Any:
    """The ops holding the rows kernel (``.rows_linear(x, w)``: ``x [M, K]`` float32, ``w [N, K]`` float32 or
    bfloat16, both contiguous, ``K`` a multiple of 16 -> ``[M, N]`` float32; ``csrc/rows_linear.cpp``), building it on
    first use (:func:`~sage_plugin.kernels.native.cpu_ops`); ``None`` where it cannot be built (one warning per process,
    then weight-major)."""
    return cpu_ops("rows_linear", "using weight-major products", _register_fakes)


def _register_fakes() -> None:
    @torch.library.register_fake(f"{NAMESPACE}::rows_linear")
    def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x.new_empty(x.shape[0], w.shape[0])


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

    ``weight`` may be stored in bfloat16 under float32 ``x`` (a draft's weights, ``CpuConfig.cpu_draft_dtype``):
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
