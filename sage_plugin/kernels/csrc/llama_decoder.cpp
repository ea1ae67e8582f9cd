// A Llama-family draft's whole decoder over a few new tokens in one call (CPU, float32 activations): the layers of
// sage_plugin/engines/lean.py without a Python call per operator (sage_plugin/kernels/llama_decoder.py registers the
// ops' fake kernels).  A small draft's
// forward at a few tokens is bound by that host work (the bundled 4-layer draft: about 150 operator calls, 2-3 ms,
// against well under 1 ms of arithmetic); here each layer is RMSNorm -> fused q/k/v product -> rotary -> K/V written
// into the cache buffer -> attention over the cache -> o product + residual -> RMSNorm -> fused gate/up product ->
// SiLU gate -> down product + residual, the products by the rows kernel (rows_kernel.h), the rest plain loops.
//
// Shapes: x [B, Q, H] float32 (the embedded new tokens), cos / sin [B, Q, D / 2] float32 (the rotary angles' cos / sin at
// their positions), mask [B, Q, S + Q] bool (row i of request b sees key j where true), per layer 6 weights (input norm [H],
// q/k/v [(Hq + 2 Hkv) D, H], o [H, Hq D], post-attention norm [H], gate/up [2 I, H], down [H, I]; products float32 or
// bfloat16, norms float32), the final norm [H], per layer K / V buffers [B, Hkv, capacity, D] float32 contiguous
// holding S cached rows (capacity >= S + Q; rows S .. S + Q - 1 are written).  Returns the final normed hidden
// states [B, Q, H].  Query head h reads KV head h / (Hq / Hkv).
//
// The numbers are a draft's: they match transformers' to float rounding (sums in other orders), which moves no
// verified token (drafts only propose).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "simd.h"
#include "rows_kernel.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using namespace sage;  // simd.h: vec, LANES, load, store, dot, exp_nonpositive, axpy, reduce

// y [T, H] = x * rsqrt(mean(x^2) + eps) * w, row by row
void rms_norm(const float* x, const float* w, float* y, int64_t T, int64_t H, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * H;
    float ss = 0.0f;
    for (int64_t i = 0; i < H; ++i) ss += xr[i] * xr[i];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
    for (int64_t i = 0; i < H; ++i) y[t * H + i] = w[i] * (xr[i] * r);
  }
}

// v [D] rotated in place (neox style): v * cos + rotate_half(v) * sin, rotate_half(v) = (-v[D/2:], v[:D/2]), with
// c / s [D / 2] the angles' cos / sin (each repeated for the two halves)
inline void rotate(float* v, const float* c, const float* s, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t d = 0; d < half; ++d) {
    const float a = v[d], b = v[d + half];
    v[d] = a * c[d] - b * s[d];
    v[d + half] = b * c[d] + a * s[d];
  }
}

// Scratch rows of one call.
struct Scratch {
  std::vector<float> h, gu, act, delta;
  Scratch(int64_t T, int64_t H, int64_t I) : h(T * H), gu(T * 2 * I), act(T * I), delta(T * H) {}
};

// qkv [T, (Hq + 2 Hkv) D] = the q/k/v product of norm(x), the first `rotated` heads (q's and k's) rotated at their
// rows' angles (c / s [T, D / 2])
void before_attention(const float* x, const at::Tensor& norm, const at::Tensor& w_qkv, const float* c, const float* s,
                      float* qkv, Scratch& sc, int64_t T, int64_t H, int64_t rotated, int64_t D, float eps) {
  const int64_t width = w_qkv.size(0);
  rms_norm(x, norm.data_ptr<float>(), sc.h.data(), T, H, eps);
  rows::run(sc.h.data(), w_qkv, qkv, T);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t hh = 0; hh < rotated; ++hh) rotate(qkv + t * width + hh * D, c + t * D / 2, s + t * D / 2, D);
}

// x [T, H] += o(att); x += down(silu(gate) * up) of the gate/up product of norm(x)
void after_attention(float* x, const float* att, const at::Tensor* w, Scratch& sc, int64_t T, int64_t H, float eps) {
  const int64_t I = w[2].size(0) / 2;
  rows::run(att, w[0], sc.delta.data(), T);
  for (int64_t e = 0; e < T * H; ++e) x[e] += sc.delta[e];
  rms_norm(x, w[1].data_ptr<float>(), sc.h.data(), T, H, eps);
  rows::run(sc.h.data(), w[2], sc.gu.data(), T);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < I; ++e) {
      const float g = sc.gu[t * 2 * I + e];
      sc.act[t * I + e] = g / (1.0f + std::exp(-g)) * sc.gu[t * 2 * I + I + e];
    }
  rows::run(sc.act.data(), w[3], sc.delta.data(), T);
  for (int64_t e = 0; e < T * H; ++e) x[e] += sc.delta[e];
}

struct Dims {
  int64_t B, Q, H, Hq, Hkv, D, S, cap;
};

// out [B * Q, Hq * D] = softmax(q k^T * scale over the visible keys) v, one task per (request, KV head)
void attend(const Dims& n, const float* q, const float* kb, const float* vb, const bool* mask, float* out,
            float scale) {
  const int64_t L = n.S + n.Q, G = n.Hq / n.Hkv, padded = (L + LANES - 1) / LANES * LANES;
  const int64_t qkv_row = (n.Hq + 2 * n.Hkv) * n.D;
  at::parallel_for(0, n.B * n.Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> p(padded);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / n.Hkv, kh = task % n.Hkv;
      const float* K = kb + (b * n.Hkv + kh) * n.cap * n.D;
      const float* V = vb + (b * n.Hkv + kh) * n.cap * n.D;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = kh * G + g;
        for (int64_t i = 0; i < n.Q; ++i) {
          const float* qv = q + (b * n.Q + i) * qkv_row + h * n.D;
          const bool* vis = mask + (b * n.Q + i) * L;
          float* o = out + (b * n.Q + i) * n.Hq * n.D + h * n.D;
          float top = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < padded; ++j) {
            p[j] = j < L && vis[j] ? dot(qv, K + j * n.D, n.D) * scale : -std::numeric_limits<float>::infinity();
            top = std::max(top, p[j]);
          }
          for (int64_t d = 0; d < n.D; ++d) o[d] = 0.0f;
          if (top == -std::numeric_limits<float>::infinity()) continue;  // a row that sees no key: zeros
          vec total{};
          for (int64_t j = 0; j < padded; j += LANES) {
            const vec e = exp_nonpositive(load(p.data() + j) - top);
            store(p.data() + j, e);
            total += e;
          }
          const float sum = reduce(total);
          for (int64_t j = 0; j < L; ++j)
            if (vis[j]) axpy(o, p[j] / sum, V + j * n.D, n.D);
        }
      }
    }
  });
}

void check_weight(const at::Tensor& w, int64_t rows, int64_t cols, const char* name) {
  TORCH_CHECK(w.dim() == 2 && w.size(0) == rows && w.size(1) == cols && w.is_contiguous() && w.device().is_cpu() &&
                  (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "llama_decoder: ", name, " must be a contiguous CPU float32 / bfloat16 [", rows, ", ", cols, "]");
  TORCH_CHECK(cols % 16 == 0, "llama_decoder: ", name, "'s input width must be a multiple of 16");
}

void check_vector(const at::Tensor& w, int64_t size, const char* name) {
  TORCH_CHECK(w.dim() == 1 && w.size(0) == size && w.is_contiguous() && w.scalar_type() == at::kFloat,
              "llama_decoder: ", name, " must be a contiguous float32 [", size, "]");
}

torch::Tensor llama_decoder(const torch::Tensor& x_in, const torch::Tensor& cos, const torch::Tensor& sin,
                            const torch::Tensor& mask, at::TensorList weights, const torch::Tensor& final_norm,
                            at::TensorList k_bufs, at::TensorList v_bufs, int64_t cached, int64_t heads,
                            int64_t kv_heads, double eps, double scale) {
  TORCH_CHECK(x_in.dim() == 3 && x_in.scalar_type() == at::kFloat && x_in.device().is_cpu(),
              "llama_decoder: x must be CPU float32 [B, Q, H]");
  const int64_t layers = static_cast<int64_t>(k_bufs.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 6 * layers && static_cast<int64_t>(v_bufs.size()) == layers,
              "llama_decoder: 6 weights and one K and V buffer per layer");
  TORCH_CHECK(layers > 0 && heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "llama_decoder: bad head counts");
  Dims n{x_in.size(0), x_in.size(1), x_in.size(2), heads, kv_heads, 0, cached, 0};
  n.D = k_bufs[0].size(3);
  n.cap = k_bufs[0].size(2);
  TORCH_CHECK(n.D % 2 == 0 && n.S >= 0 && n.cap >= n.S + n.Q, "llama_decoder: the buffers need S + Q rows");
  const int64_t T = n.B * n.Q, L = n.S + n.Q, I = weights[4].size(0) / 2, width = (n.Hq + 2 * n.Hkv) * n.D;
  for (const auto* t : {&cos, &sin})
    TORCH_CHECK(t->sizes() == at::IntArrayRef({n.B, n.Q, n.D / 2}) && t->is_contiguous() &&
                    t->scalar_type() == at::kFloat,
                "llama_decoder: cos / sin must be contiguous float32 [B, Q, D / 2]");
  TORCH_CHECK(mask.sizes() == at::IntArrayRef({n.B, n.Q, L}) && mask.is_contiguous() && mask.scalar_type() == at::kBool,
              "llama_decoder: mask must be contiguous bool [B, Q, S + Q]");
  check_vector(final_norm, n.H, "the final norm");
  for (int64_t l = 0; l < layers; ++l) {
    check_vector(weights[6 * l], n.H, "input_layernorm");
    check_weight(weights[6 * l + 1], width, n.H, "qkv");
    check_weight(weights[6 * l + 2], n.H, n.Hq * n.D, "o_proj");
    check_vector(weights[6 * l + 3], n.H, "post_attention_layernorm");
    check_weight(weights[6 * l + 4], 2 * I, n.H, "gate_up");
    check_weight(weights[6 * l + 5], n.H, I, "down_proj");
    for (const auto* t : {&k_bufs[l], &v_bufs[l]})
      TORCH_CHECK(t->sizes() == at::IntArrayRef({n.B, n.Hkv, n.cap, n.D}) && t->is_contiguous() &&
                      t->scalar_type() == at::kFloat,
                  "llama_decoder: K / V buffers must be contiguous float32 [B, Hkv, capacity, D], alike");
  }
  auto x = x_in.contiguous().clone();
  Scratch sc(T, n.H, I);
  std::vector<float> qkv(T * width), att(T * n.Hq * n.D);
  float* xp = x.data_ptr<float>();
  for (int64_t l = 0; l < layers; ++l) {
    const auto* w = &weights[6 * l];
    float* kb = k_bufs[l].data_ptr<float>();
    float* vb = v_bufs[l].data_ptr<float>();
    before_attention(xp, w[0], w[1], cos.data_ptr<float>(), sin.data_ptr<float>(), qkv.data(), sc, T, n.H,
                     n.Hq + n.Hkv, n.D, static_cast<float>(eps));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t b = t / n.Q, i = t % n.Q;
      const float* row = qkv.data() + t * width;
      for (int64_t kh = 0; kh < n.Hkv; ++kh) {
        const int64_t at_row = ((b * n.Hkv + kh) * n.cap + n.S + i) * n.D;
        std::copy_n(row + (n.Hq + kh) * n.D, n.D, kb + at_row);
        std::copy_n(row + (n.Hq + n.Hkv + kh) * n.D, n.D, vb + at_row);
      }
    }
    attend(n, qkv.data(), kb, vb, mask.data_ptr<bool>(), att.data(), static_cast<float>(scale));
    after_attention(xp, att.data(), w + 2, sc, T, n.H, static_cast<float>(eps));
  }
  auto y = torch::empty_like(x);
  rms_norm(xp, final_norm.data_ptr<float>(), y.data_ptr<float>(), T, n.H, static_cast<float>(eps));
  return y;
}

// One layer's work either side of a runtime's own attention (SGLang's draft: its backend writes the K / V pool and
// reads the tree mask): x [T, H] float32 contiguous; before: qkv [T, (Hq + 2 Hkv) D] with the first `rotated` heads
// rotated (cos / sin [T, D / 2]); after: x updated in place from att [T, Hq D].
torch::Tensor layer_before(const torch::Tensor& x, const torch::Tensor& norm, const torch::Tensor& w_qkv,
                           const torch::Tensor& cos, const torch::Tensor& sin, int64_t rotated, int64_t head_dim,
                           double eps) {
  const int64_t T = x.size(0), H = x.size(1);
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "layer_before: x must be contiguous CPU float32 [T, H]");
  TORCH_CHECK(head_dim % 2 == 0 && rotated * head_dim <= w_qkv.size(0), "layer_before: bad head layout");
  check_vector(norm, H, "input_layernorm");
  check_weight(w_qkv, w_qkv.size(0), H, "qkv");
  for (const auto* t : {&cos, &sin})
    TORCH_CHECK(t->sizes() == at::IntArrayRef({T, head_dim / 2}) && t->is_contiguous() && t->scalar_type() == at::kFloat,
                "layer_before: cos / sin must be contiguous float32 [T, D / 2]");
  auto qkv = torch::empty({T, w_qkv.size(0)}, x.options());
  Scratch sc(T, H, 0);
  before_attention(x.data_ptr<float>(), norm, w_qkv, cos.data_ptr<float>(), sin.data_ptr<float>(),
                   qkv.data_ptr<float>(), sc, T, H, rotated, head_dim, static_cast<float>(eps));
  return qkv;
}

void layer_after(torch::Tensor& x, const torch::Tensor& att, const torch::Tensor& w_o, const torch::Tensor& norm,
                 const torch::Tensor& w_gate_up, const torch::Tensor& w_down, double eps) {
  const int64_t T = x.size(0), H = x.size(1), I = w_gate_up.size(0) / 2;
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "layer_after: x must be contiguous CPU float32 [T, H]");
  TORCH_CHECK(att.dim() == 2 && att.size(0) == T && att.is_contiguous() && att.scalar_type() == at::kFloat,
              "layer_after: att must be contiguous float32 [T, Hq D]");
  check_weight(w_o, H, att.size(1), "o_proj");
  check_vector(norm, H, "post_attention_layernorm");
  check_weight(w_gate_up, 2 * I, H, "gate_up");
  check_weight(w_down, H, I, "down_proj");
  const at::Tensor w[4] = {w_o, norm, w_gate_up, w_down};
  Scratch sc(T, H, I);
  after_attention(x.data_ptr<float>(), att.data_ptr<float>(), w, sc, T, H, static_cast<float>(eps));
}

}  // namespace

// llama_decoder: the whole decoder over a few new tokens, K / V rows written into the buffers; llama_layer_before: one
// layer's norm, q/k/v product and rotary; llama_layer_after: its o product, MLP and residuals, x in place.
TORCH_LIBRARY_FRAGMENT(sage_plugin, m) {
  m.def(
      "llama_decoder(Tensor x, Tensor cos, Tensor sin, Tensor mask, Tensor[] weights, Tensor final_norm, "
      "Tensor(a!)[] k_bufs, Tensor(b!)[] v_bufs, int cached, int heads, int kv_heads, float eps, float scale) "
      "-> Tensor");
  m.def(
      "llama_layer_before(Tensor x, Tensor norm, Tensor w_qkv, Tensor cos, Tensor sin, int rotated, int head_dim, "
      "float eps) -> Tensor");
  m.def(
      "llama_layer_after(Tensor(a!) x, Tensor att, Tensor w_o, Tensor norm, Tensor w_gate_up, Tensor w_down, "
      "float eps) -> ()");
}

TORCH_LIBRARY_IMPL(sage_plugin, CPU, m) {
  m.impl("llama_decoder", &llama_decoder);
  m.impl("llama_layer_before", &layer_before);
  m.impl("llama_layer_after", &layer_after);
}
