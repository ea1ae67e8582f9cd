// The vector type of the plugin's CPU kernels (rows_kernel.h, paged_attention.cpp, llama_decoder.cpp), its fixed-order lane
// sum, and the attention kernels' score, exponential and value-mix helpers.
// LANES float32 lanes: 16 where the compiler targets AVX-512, else 8 (AVX2); GCC vector extensions, so the kernels
// build for each instruction set level sage_plugin/kernels/native.py compiles (avx512, avx2, baseline x86-64).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace sage {

#if defined(__AVX512F__)
constexpr int LANES = 16;
#else
constexpr int LANES = 8;
#endif
typedef float vec __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t ivec __attribute__((vector_size(LANES * sizeof(int32_t))));

inline vec load(const float* p) {
  vec v;
  __builtin_memcpy(&v, p, sizeof(vec));
  return v;
}

inline void store(float* p, vec v) { __builtin_memcpy(p, &v, sizeof(vec)); }

// a * b + c in every lane: one rounding where the target has FMA, else two.  Spelled out rather than left to the
// compiler's contraction of a * b + c, which GCC applied differently to two code shapes of one sum in the AVX2 build
// of the rows kernel (a row of a 2-row call differed in its last bit from the row alone): every bit-for-bit guarantee
// of the kernels rests on each sum being formed the same way wherever it is computed.
inline vec madd(vec a, vec b, vec c) {
#if defined(__AVX512F__)
  return (vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  return (vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
}

// v, held in a register from here on: the compiler may no longer re-read it from memory at each use.  A kernel's
// inner loop loads each vector it multiplies once and uses it several times (a weight vector against 4 rows of x, an
// x vector against 3-4 weight rows); without this GCC folds the loads into the FMAs' memory operands, one load per
// FMA, and the loop becomes bound by loads instead of FMAs (the AVX2 rows kernel: 16 loads for 12 FMAs, 7 with it;
// the timings are in sage_plugin/kernels/linear.py).  It changes no arithmetic.
inline vec in_register(vec v) {
#if defined(__AVX__)
  asm("" : "+v"(v));
#endif
  return v;  // without AVX a vec spans two SSE registers: no constraint names it (such builds are not tuned)
}

// The sum of a's lanes by a fixed halving tree: lanes l and l + h added for h = LANES / 2, ..., 1 (by half vectors).
// Every kernel's results depend on this order; none depends on where a lane's value came from.
inline float reduce(vec a) {
  typedef float v4 __attribute__((vector_size(4 * sizeof(float))));
#if defined(__AVX512F__)
  typedef float v8 __attribute__((vector_size(8 * sizeof(float))));
  v8 lo8, hi8;
  __builtin_memcpy(&lo8, &a, sizeof(v8));
  __builtin_memcpy(&hi8, reinterpret_cast<const char*>(&a) + sizeof(v8), sizeof(v8));
  const v8 s8 = lo8 + hi8;
#else
  const vec s8 = a;
#endif
  v4 lo4, hi4;
  __builtin_memcpy(&lo4, &s8, sizeof(v4));
  __builtin_memcpy(&hi4, reinterpret_cast<const char*>(&s8) + sizeof(v4), sizeof(v4));
  const v4 s4 = lo4 + hi4;
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// Vector helpers of the attention kernels (paged_attention.cpp, llama_decoder.cpp): one definition each, so the
// two compute a score, an exponential and a value mix the same way.

// q . k over d: LANES strided partial sums (fused multiply-adds from zero, madd()) reduced by reduce(), then the
// tail in order.
inline float dot(const float* q, const float* k, int64_t d) {
  const int64_t body = d - d % LANES;
  float total = 0.0f;
  if (body > 0) {
    vec acc{};
    for (int64_t i = 0; i < body; i += LANES) acc = madd(load(q + i), load(k + i), acc);
    total = reduce(acc);
  }
  for (int64_t i = body; i < d; ++i) total += q[i] * k[i];
  return total;
}

// exp(x) of each lane, for x <= 0 (scores less their row's maximum): Cephes' expf (x = n ln 2 + r, a degree-5
// polynomial in r, times 2^n), the same operations in every lane; x below -87 (an invisible key's -inf included)
// gives 0.
inline vec exp_nonpositive(vec x) {
  const vec floor_ = vec{} - 87.0f, magic = vec{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const vec xc = x < floor_ ? floor_ : x;
  const vec n = (xc * 1.44269504088896341f + magic) - magic;
  vec r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vec p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;
  vec scale;
  __builtin_memcpy(&scale, &bits, sizeof(vec));
  return x < floor_ ? vec{} : p * scale;
}

// acc += p * v over d
inline void axpy(float* acc, float p, const float* v, int64_t d) {
  const int64_t body = d - d % LANES;
  const vec pv = vec{} + p;
  for (int64_t i = 0; i < body; i += LANES) store(acc + i, madd(pv, load(v + i), load(acc + i)));
  for (int64_t i = body; i < d; ++i) acc[i] += p * v[i];
}

}  // namespace sage
