// The rows kernel as the custom op sage_plugin::rows_linear(x, w) for sage_plugin/kernels/linear.py (its fake kernel
// is registered there).  The kernel, its tiling and its reduction order (batch-invariant): rows_kernel.h.
#include <torch/extension.h>

#include "rows_kernel.h"

#include <cstdint>

namespace {

torch::Tensor rows_linear(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "rows_linear: x [M, K], w [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "rows_linear: float32 x, float32 or bfloat16 w");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && x.device().is_cpu() && w.device().is_cpu(),
              "rows_linear: contiguous CPU tensors");
  TORCH_CHECK(x.size(1) % 16 == 0, "rows_linear: K must be a multiple of 16");
  auto y = torch::empty({x.size(0), w.size(0)}, x.options());
  sage::rows::run(x.data_ptr<float>(), w, y.data_ptr<float>(), x.size(0));
  return y;
}

}  // namespace

// x [M, K] @ w [N, K].T, float32 x, float32 or bfloat16 w, CPU, batch-invariant
TORCH_LIBRARY_FRAGMENT(sage_plugin, m) { m.def("rows_linear(Tensor x, Tensor w) -> Tensor"); }

TORCH_LIBRARY_IMPL(sage_plugin, CPU, m) { m.impl("rows_linear", &rows_linear); }
