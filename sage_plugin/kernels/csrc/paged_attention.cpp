// Attention over a paged K/V cache for the few query rows decoding, tree verification and draft steps produce
// (CPU, float32).  Built for the machine's instruction set level (sage_plugin/kernels/native.py, at first use by
// torch.utils.cpp_extension; sage_plugin/kernels/paged_attention.py documents the arguments and registers the fake
// kernel).
//
// Request b owns query rows q_row .. q_row + n_q - 1 of q [T, H, D] and keys j < n_keys: key j is read in place from
// the cache row slots[b, j] of k_buf / v_buf [P, H_kv, D | Dv] when j < n_cached, else from row new_row + j - n_cached
// of k_new / v_new [N, H_kv, D | Dv] (an extend's own keys).  Query row i sees key j when mode 0: always; mode 1
// (causal): j <= n_keys - n_q + i; mode 2: visible[b, i, j].  Query head h reads KV head h / (H / H_kv).
// No key is copied: one task per (request, KV head) scores its g = H / H_kv query heads' rows against each key as it
// is read, then mixes the values the same way.
//
// Reduction order: a row's score for key j sums its D products in LANES strided partial sums reduced by a fixed
// halving tree (then the tail), and its softmax and value mix run over its visible keys in increasing j; keys it
// cannot see are skipped, never added as zeros.  Nothing depends on the other rows, requests or threads of the call,
// so a row's output is bit-identical whether it is a decode row or a tree-verify row seeing the same keys.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

using sage::axpy;
using sage::dot;
using sage::exp_nonpositive;
using sage::LANES;
using sage::load;
using sage::store;
using sage::vec;

// Ask for the cache lines of a key / value row a few keys ahead: a sequence's slots are scattered over the pool,
// so each row is a fresh walk to memory that the hardware prefetcher cannot predict.
constexpr int64_t AHEAD = 6;
inline void prefetch_row(const float* p, int64_t d) {
  for (int64_t i = 0; i < d; i += 64 / sizeof(float)) __builtin_prefetch(p + i);
}

void check_rows(const at::Tensor& t, const char* name, int64_t heads) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 3 && t.stride(2) == 1 && t.size(1) == heads,
              "paged_attention: ", name, " must be float32 [rows, ", heads, ", dim] with unit stride in its last dim");
}

}  // namespace

void paged_attention(const at::Tensor& q, at::Tensor& o, const at::Tensor& k_buf, const at::Tensor& v_buf,
                     const at::Tensor& k_new, const at::Tensor& v_new, const at::Tensor& slots,
                     const at::Tensor& meta, const at::Tensor& visible, int64_t mode, double sm_scale,
                     double key_scale, double value_scale) {
  const int64_t heads = q.size(1), kv_heads = k_buf.size(1), d = q.size(2), dv = v_buf.size(2);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "paged_attention: query heads not a multiple of KV heads");
  check_rows(q, "q", heads);
  check_rows(o, "o", heads);
  check_rows(k_buf, "k_buf", kv_heads);
  check_rows(v_buf, "v_buf", kv_heads);
  TORCH_CHECK(k_buf.size(2) == d && o.size(2) == dv, "paged_attention: head sizes disagree");
  const bool fresh = k_new.numel() > 0;
  if (fresh) {
    check_rows(k_new, "k_new", kv_heads);
    check_rows(v_new, "v_new", kv_heads);
  }
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 2 && slots.is_contiguous(),
              "paged_attention: slots must be contiguous int64 [bs, L]");
  TORCH_CHECK(meta.scalar_type() == at::kLong && meta.is_contiguous() && meta.dim() == 2 && meta.size(1) == 5 &&
                  meta.size(0) == slots.size(0),
              "paged_attention: meta must be contiguous int64 [bs, 5]");
  TORCH_CHECK(mode != 2 || (visible.scalar_type() == at::kBool && visible.is_contiguous() && visible.dim() == 3 &&
                            visible.size(0) == slots.size(0)),
              "paged_attention: mode 2 needs a contiguous bool visible [bs, Lq, L]");
  const int64_t bs = slots.size(0), width = slots.size(1), group = heads / kv_heads;
  const int64_t vis_q = mode == 2 ? visible.size(1) : 0, vis_k = mode == 2 ? visible.size(2) : 0;
  const int64_t* m = meta.data_ptr<int64_t>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const bool* vis = mode == 2 ? visible.data_ptr<bool>() : nullptr;
  const float* qp = q.data_ptr<float>();
  float* op = o.data_ptr<float>();
  const float* kb = k_buf.data_ptr<float>();
  const float* vb = v_buf.data_ptr<float>();
  const float* kn = fresh ? k_new.data_ptr<float>() : nullptr;
  const float* vn = fresh ? v_new.data_ptr<float>() : nullptr;
  const int64_t pool = k_buf.size(0), news = fresh ? k_new.size(0) : 0;
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), os0 = o.stride(0), os1 = o.stride(1);
  const int64_t kbs0 = k_buf.stride(0), kbs1 = k_buf.stride(1), vbs0 = v_buf.stride(0), vbs1 = v_buf.stride(1);
  const int64_t kns0 = fresh ? k_new.stride(0) : 0, kns1 = fresh ? k_new.stride(1) : 0;
  const int64_t vns0 = fresh ? v_new.stride(0) : 0, vns1 = fresh ? v_new.stride(1) : 0;
  int64_t work = 0;
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t nq = m[b * 5 + 1], nc = m[b * 5 + 2], nk = m[b * 5 + 3], nr = m[b * 5 + 4];
    TORCH_CHECK(nq >= 0 && nk >= 0 && nc >= 0 && nc <= nk && nk <= width && m[b * 5] >= 0 &&
                    m[b * 5] + nq <= q.size(0) && (mode != 2 || (nq <= vis_q && nk <= vis_k)),
                "paged_attention: request ", b, " has lengths outside its tensors");
    TORCH_CHECK(nc == nk || (fresh && nr >= 0 && nr + nk - nc <= news),
                "paged_attention: request ", b, " reads keys past k_new");
    for (int64_t j = 0; j < nc; ++j)
      TORCH_CHECK(slot[b * width + j] >= 0 && slot[b * width + j] < pool, "paged_attention: slot out of range");
    work += nq * nk;
  }
  const float neg = -std::numeric_limits<float>::infinity();
  const float scale = static_cast<float>(sm_scale);
  // tasks of a small call run in the calling thread: waking the pool costs more than they do
  const int64_t tasks = bs * kv_heads, grain = work * group * (d + dv) < (1 << 16) ? tasks : 1;
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc, denom;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / kv_heads, h = t % kv_heads;
      const int64_t q0 = m[b * 5], nq = m[b * 5 + 1], nc = m[b * 5 + 2], nk = m[b * 5 + 3], nr = m[b * 5 + 4];
      const int64_t rows = nq * group;
      if (rows == 0) continue;
      const int64_t stride = (nk + LANES - 1) / LANES * LANES;  // a row's scores, padded to whole vectors
      scores.assign(rows * stride, neg);
      acc.assign(rows * dv, 0.0f);
      // key / value row j of this request and KV head: in place in the cache, or an extend's own
      auto row = [&](int64_t j, const float* buf, int64_t bs0, int64_t bs1, const float* add, int64_t as0,
                     int64_t as1) {
        return j < nc ? buf + slot[b * width + j] * bs0 + h * bs1 : add + (nr + j - nc) * as0 + h * as1;
      };
      auto sees = [&](int64_t i, int64_t j) {
        return mode == 0 || (mode == 1 ? j <= nk - nq + i : vis[(b * vis_q + i) * vis_k + j]);
      };
      for (int64_t j = 0; j < nk; ++j) {
        if (j + AHEAD < nk) prefetch_row(row(j + AHEAD, kb, kbs0, kbs1, kn, kns0, kns1), d);
        const float* kp = row(j, kb, kbs0, kbs1, kn, kns0, kns1);
        const float ks = j < nc ? static_cast<float>(key_scale) : 1.0f;
        for (int64_t i = 0; i < nq; ++i) {
          if (!sees(i, j)) continue;
          const float* qi = qp + (q0 + i) * qs0 + h * group * qs1;
          for (int64_t r = 0; r < group; ++r)
            scores[(i * group + r) * stride + j] = dot(qi + r * qs1, kp, d) * ks * scale;
        }
      }
      // softmax weights (unnormalised) in place: exp(s - max) by whole vectors, 0 for keys a row cannot see; the
      // denominator summed over the nonzero weights in key order
      denom.assign(rows, 0.0f);
      for (int64_t x = 0; x < rows; ++x) {
        float* s = scores.data() + x * stride;
        vec most = vec{} + neg;  // the row's maximum (padding is -inf)
        for (int64_t j = 0; j < stride; j += LANES) {
          const vec v = load(s + j);
          most = v > most ? v : most;
        }
        float top = neg;
        for (int64_t l = 0; l < LANES; ++l) top = most[l] > top ? most[l] : top;
        if (top == neg) {  // a padding row: it sees no key, mixes nothing
          std::fill(s, s + stride, 0.0f);
          continue;
        }
        for (int64_t j = 0; j < stride; j += LANES) store(s + j, exp_nonpositive(load(s + j) - top));
        // the c-th nonzero weight (in key order) goes to partial sum c % 4: the same keys seen give the same sum
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int64_t c = 0;
        for (int64_t j = 0; j < nk; ++j)
          if (s[j] != 0.0f) part[c++ & 3] += s[j];
        denom[x] = (part[0] + part[2]) + (part[1] + part[3]);
      }
      for (int64_t j = 0; j < nk; ++j) {
        if (j + AHEAD < nk) prefetch_row(row(j + AHEAD, vb, vbs0, vbs1, vn, vns0, vns1), dv);
        const float* vp = row(j, vb, vbs0, vbs1, vn, vns0, vns1);
        const float vs = j < nc ? static_cast<float>(value_scale) : 1.0f;
        for (int64_t x = 0; x < rows; ++x) {
          const float w = scores[x * stride + j];
          if (w == 0.0f) continue;  // unseen (a cache row past a sequence may hold anything), or exp underflowed
          axpy(acc.data() + x * dv, vs == 1.0f ? w : w * vs, vp, dv);
        }
      }
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t r = 0; r < group; ++r) {
          const int64_t x = i * group + r;
          const float inv = denom[x] > 0.0f ? 1.0f / denom[x] : 0.0f;
          float* out = op + (q0 + i) * os0 + (h * group + r) * os1;
          for (int64_t c = 0; c < dv; ++c) out[c] = acc[x * dv + c] * inv;
        }
    }
  });
}

// Attention over a paged K/V cache, written into o.  An empty k_new / v_new / visible is "not given".
TORCH_LIBRARY_FRAGMENT(sage_plugin, m) {
  m.def(
      "paged_attention(Tensor q, Tensor(a!) o, Tensor k_buf, Tensor v_buf, Tensor k_new, Tensor v_new, Tensor slots, "
      "Tensor meta, Tensor visible, int mode, float sm_scale, float key_scale, float value_scale) -> ()");
}

TORCH_LIBRARY_IMPL(sage_plugin, CPU, m) { m.impl("paged_attention", &paged_attention); }
