// The rows kernel's binding: rows_linear(x, w) for sage_plugin/core/linear.py.  The kernel, its tiling and its
// reduction order (batch-invariant): rows.h.
#include <torch/extension.h>

#include "rows.h"

#include <cstdint>

namespace {

torch::Tensor rows_linear(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "rows_linear: x [M, K], w [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "rows_linear: float32 x, float32 or bfloat16 w");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && x.device().is_cpu() && w.device().is_cpu(),
              "rows_linear: contiguous CPU tensors");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K % 16 == 0, "rows_linear: K must be a multiple of 16");
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (w.scalar_type() == at::kBFloat16)
    sage::rows::run(xp, reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), yp, M, K, N);
  else
    sage::rows::run(xp, w.data_ptr<float>(), yp, M, K, N);
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rows_linear", &rows_linear, "x [M, K] @ w [N, K].T, float32 x, float32 or bfloat16 w, CPU, batch-invariant");
  m.attr("lanes") = sage::LANES;
}
