"""A Llama-family draft's decoder over a few new tokens in one call on CPU: ``csrc/lean_decoder.cpp``.

Built at first use (:func:`~sage_plugin.core.native.cpu_kernel`); its consumers are the reference engine's
``engines/lean.py`` (``lean_decoder``: the whole layer stack, the K/V rows written into the cache buffers) and SGLang's
``runtimes/sglang/lean_draft.py`` (``layer_before`` / ``layer_after``: one layer's work either side of the runtime's
own attention).  The C++ source documents the shapes; the numbers are a draft's (float rounding may differ from
transformers' or SGLang's forward, which moves no verified token).
"""

from __future__ import annotations

from typing import Any

from .native import cpu_kernel

__all__ = ["lean_kernel"]


def lean_kernel() -> Any:
    """The compiled kernel (``.lean_decoder``, ``.layer_before``, ``.layer_after``), or None where it cannot be
    built (one warning; the drafts then run operator by operator)."""
    return cpu_kernel("lean_decoder", "a draft's lean forward runs operator by operator")
