"""CPU ops that SGLang's multimodal processors need to *exist*, not to run.

SGLang 0.5.23 registers its multimodal processors by importing every model module; ``models/qwen3_5.py`` (reached
from the Qwen-VL processors' import chain) and ``models/muse_glimmer.py`` look up four ``sgl_kernel`` CPU-build ops
at import time.  The PyPI ``sgl_kernel`` is a CUDA build without them, the import fails, and SGLang silently drops
the Qwen2-VL / Qwen2.5-VL processors: image requests then fail.  These definitions let the modules import.  The
ops belong to models this plugin does not serve on CPU (Qwen3.5, Muse): calling one raises a clear error instead of
computing something unchecked.
"""

from __future__ import annotations

__all__ = ["MODEL_ONLY_OPS", "unsupported_op"]

#: op name -> schema (as SGLang's CPU-compile fakes in ``model_executor/cpu_graph_runner.py`` declare them)
MODEL_ONLY_OPS: dict[str, str] = {
    "fused_sigmoid_mul_cpu": "(Tensor(a!) x, Tensor gate) -> ()",
    "fused_qk_gemma_rmsnorm_cpu": "(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps, int head_dim) "
    "-> (Tensor, Tensor)",
    "fused_qk_gemma_rmsnorm_with_gate_cpu": "(Tensor q_gate, Tensor k, Tensor q_weight, Tensor k_weight, float eps, "
    "int head_dim, int num_head) -> (Tensor, Tensor, Tensor)",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": "(Tensor mixed_qkvz, Tensor mixed_ba, int num_heads_qk, "
    "int num_heads_v, int head_qk, int head_v) -> (Tensor, Tensor, Tensor, Tensor)",
}


def unsupported_op(name: str):
    """The kernel of op ``name``: raises, naming the op and what would run it."""

    def kernel(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is a kernel of SGLang's CPU build used by Qwen3.5 / Muse models; sage-plugin defines "
            "it only so that SGLang's multimodal processors import on a CPU machine. Serve those models with "
            "SGLang's CPU kernel build (sgl-kernel built for CPU), not with the plugin's pure-torch ops."
        )

    kernel.__name__ = name
    return kernel
