// The rows kernel: y = x @ w.T for the few rows decoding and tree verification produce (CPU, float32 x, float32 or
// bfloat16 w).  One implementation, included by rows_linear.cpp (the linear layers) and llama_decoder.cpp (a draft's
// whole decoder in one call).
//
// x [M, K] float32, w [N, K] float32 or bfloat16 (widened to float32 exactly as it is loaded: a bfloat16 is the high
// half of a float32, so the products and sums are float32 ones and half the bytes are streamed), both contiguous, M small (decode: 1, a verify: the tree's nodes), K a multiple of 16.
// A decoder's weights do not stay in cache from one forward to the next, so at a few rows a linear layer is bound by
// streaming w from memory: every tile of R rows of w is read once and multiplied into MB rows of x at a time (x stays
// in L1), R x MB vector accumulators in registers.  Built for the machine's instruction set level
// (sage_plugin/kernels/native.py, compiled at first use by torch.utils.cpp_extension; sage_plugin/kernels/linear.py).
//
// Reduction order: each output element y[m, n] sums its K products in LANES strided partial sums (k = l, l + LANES,
// ...) reduced by a fixed halving tree.  That order depends on neither M, nor the row tile it falls in, nor the split
// of N between threads: a row's result is bit-identical whatever other rows share the call (batch-invariant), so a
// tree verify computes the same logits for a token as the decode step that would have produced it.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "simd.h"

#include <algorithm>
#include <cstdint>

namespace sage::rows {

using sage::in_register;
using sage::ivec;
using sage::LANES;
using sage::load;
using sage::madd;
using sage::reduce;
using sage::vec;
#if defined(__AVX512F__)
constexpr int R = 4;  // 4 x 4 accumulators + 4 w + 1 x of 32 zmm registers
#else
constexpr int R = 3;  // 4 x 3 accumulators + 3 w + 1 x of 16 ymm registers
#endif
constexpr int MB = 4;
typedef uint16_t hvec __attribute__((vector_size(LANES * sizeof(uint16_t))));

// LANES bfloat16 (their bits) widened to float32: each one the high 16 bits of its float, the low 16 zero.
inline vec load(const uint16_t* p) {
  hvec h;
  __builtin_memcpy(&h, p, sizeof(hvec));
  const ivec bits = __builtin_convertvector(h, ivec) << 16;
  vec v;
  __builtin_memcpy(&v, &bits, sizeof(vec));
  return v;
}

// One halving step of reduce() on two vectors at once.  Each vector holds LANES / (2 H) blocks of 2 H lanes, a block
// the partial sums of one output; the result holds a's blocks then b's, each folded to H lanes (lane l of a block:
// s[l] + s[l + H], as in reduce()).
template <int H>
__attribute__((always_inline)) inline vec fold(vec a, vec b) {
  ivec lo, hi;
  for (int p = 0; p < LANES; ++p) {
    const int half = LANES / 2, q = p % half;
    const int src = (p < half ? 0 : LANES) + (q / H) * 2 * H + q % H;
    lo[p] = src;
    hi[p] = src + H;
  }
  return __builtin_shuffle(a, b, lo) + __builtin_shuffle(a, b, hi);
}

template <int H>
__attribute__((always_inline)) inline void fold_all(vec* v, int n) {
  for (int i = 0; i < n / 2; ++i) v[i] = fold<H>(v[2 * i], v[2 * i + 1]);
  if constexpr (H > 1) fold_all<H / 2>(v, n / 2);
}

// reduce() of LANES vectors at once, bit for bit (the same additions in the same order): lane j of the result is
// reduce(v[j]).  v is overwritten.
__attribute__((always_inline)) inline vec reduce_lanes(vec* v) {
  fold_all<LANES / 2>(v, LANES);
  return v[0];
}

// Tiles ahead whose w is prefetched into L2 while this one computes: without it a tile's compute and its memory
// traffic add up (8 rows of SmolLM2-135M: 38 ms against 26 with it, 1 row alone streams in 20).
constexpr int PREFETCH_TILES = 4;

// y[m, n0 + r] for m < RowsX, r < RowsW; W: float (float32 w) or uint16_t (bfloat16 w)
template <int RowsW, int RowsX, typename W>
inline void tile(const float* __restrict x, const W* __restrict w, float* __restrict y, int64_t K, int64_t N,
                 int64_t n0) {
  vec acc[RowsX][RowsW];
  for (int m = 0; m < RowsX; ++m)
    for (int r = 0; r < RowsW; ++r) acc[m][r] = vec{};
  const W* wt = w + n0 * K;
  // an address, not a pointer: past the last tile it points beyond w (a prefetch of it never faults).  A step reads
  // RowsW * LANES weights; the tile PREFETCH_TILES ahead is prefetched at the same pace, one prefetch per 64-byte line
  // (rounded up: AVX2 float32 reads 1.5 lines a step, bfloat16 0.75; AVX-512 4 and 2)
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(wt + 0) + PREFETCH_TILES * RowsW * K * sizeof(W);
  constexpr int LINES_PER_STEP = (RowsW * LANES * sizeof(W) + 63) / 64;
  for (int64_t k = 0; k < K; k += LANES) {
    for (int l = 0; l < LINES_PER_STEP; ++l)
      __builtin_prefetch(reinterpret_cast<const void*>(ahead + k * RowsW * sizeof(W) + l * 64), 0, 2);
    vec wv[RowsW];
    for (int r = 0; r < RowsW; ++r) wv[r] = in_register(load(wt + r * K + k));
    for (int m = 0; m < RowsX; ++m) {
      const vec xv = in_register(load(x + m * K + k));
      for (int r = 0; r < RowsW; ++r) acc[m][r] = madd(xv, wv[r], acc[m][r]);
    }
  }
  constexpr int NACC = RowsX * RowsW;
  if constexpr (2 * NACC < LANES) {  // a few outputs: one reduce() each
    for (int m = 0; m < RowsX; ++m)
      for (int r = 0; r < RowsW; ++r) y[m * N + n0 + r] = reduce(acc[m][r]);
  } else {  // LANES outputs per reduce_lanes() (zero vectors pad the last group)
    for (int g = 0; g < NACC; g += LANES) {
      vec v[LANES];
      for (int j = 0; j < LANES; ++j) v[j] = g + j < NACC ? acc[(g + j) / RowsW][(g + j) % RowsW] : vec{};
      float s[LANES];
      const vec sums = reduce_lanes(v);
      __builtin_memcpy(s, &sums, sizeof(vec));
      for (int j = 0; j < LANES && g + j < NACC; ++j) y[((g + j) / RowsW) * N + n0 + (g + j) % RowsW] = s[j];
    }
  }
}

template <int RowsW, typename W>
inline void rows_of_x(const float* x, const W* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0) {
  int64_t m = 0;
  for (; m + MB <= M; m += MB) tile<RowsW, MB>(x + m * K, w, y + m * N, K, N, n0);
  switch (M - m) {
    case 3: tile<RowsW, 3>(x + m * K, w, y + m * N, K, N, n0); break;
    case 2: tile<RowsW, 2>(x + m * K, w, y + m * N, K, N, n0); break;
    case 1: tile<RowsW, 1>(x + m * K, w, y + m * N, K, N, n0); break;
    default: break;
  }
}

// y [M, N] = x [M, K] @ w [N, K].T, the work split over N between threads (at::parallel_for).
template <typename W>
inline void run(const float* xp, const W* wp, float* yp, int64_t M, int64_t K, int64_t N) {
  const int64_t tiles = N / R;
  // about 32 KB of w per task: enough work to amortise a task, small enough to split a layer between threads
  const int64_t grain = std::max<int64_t>(1, 8192 * sizeof(float) / sizeof(W) / (R * K));
  at::parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) rows_of_x<R>(xp, wp, yp, M, K, N, t * R);
  });
  for (int64_t n = tiles * R; n < N; ++n) rows_of_x<1>(xp, wp, yp, M, K, N, n);
}

// run() over w's own storage: w [N, K] contiguous CPU float32 or bfloat16 (the caller checks it), y [M, N].
inline void run(const float* xp, const at::Tensor& w, float* yp, int64_t M) {
  const int64_t N = w.size(0), K = w.size(1);
  if (w.scalar_type() == at::kBFloat16)
    run(xp, reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), yp, M, K, N);
  else
    run(xp, w.data_ptr<float>(), yp, M, K, N);
}

}  // namespace sage::rows
