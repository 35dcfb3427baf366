// AVX2 + FMA + F16C tiles for linear_cpu. This file is compiled with -mavx2 -mfma -mf16c and is
// only entered after a run-time CPU check; it includes nothing that could leak vector code
// into shared inline functions.
#include <immintrin.h>

#include "kernels/linear_problem.h"

namespace pdserve {
namespace {

inline __m256 load8(const uint16_t* p, DType dtype) {
  __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (dtype == DType::kF16) return _mm256_cvtph_ps(half);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

template <DType W>
inline __m256 load_weights8(const void* base, int64_t index) {
  if constexpr (W == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + index);
  } else {
    return load8(static_cast<const uint16_t*>(base) + index, W);
  }
}

template <DType W>
inline float load_weight1(const void* base, int64_t index) {
  if constexpr (W == DType::kF32) {
    return static_cast<const float*>(base)[index];
  } else {
    alignas(16) uint16_t bits[8] = {static_cast<const uint16_t*>(base)[index]};
    alignas(32) float out[8];
    _mm256_store_ps(out, load8(bits, W));
    return out[0];
  }
}

// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)): the portable kernel's order.
inline float combine_lanes(__m256 acc) {
  __m128 low = _mm256_castps256_ps128(acc);
  __m128 high = _mm256_extractf128_ps(acc, 1);
  __m128 pairs = _mm_add_ps(low, high);          // l0+l4, l1+l5, l2+l6, l3+l7
  __m128 swapped = _mm_movehl_ps(pairs, pairs);  // l2+l6, l3+l7, ...
  __m128 quads = _mm_add_ps(pairs, swapped);     // (l0+l4)+(l2+l6), (l1+l5)+(l3+l7)
  __m128 odd = _mm_shuffle_ps(quads, quads, 0x55);
  return _mm_cvtss_f32(_mm_add_ss(quads, odd));
}

template <DType W, int MR, int NR>
inline void tile(const LinearProblem& p, int64_t i0, int64_t j0) {
  const int64_t k_vec = p.k - p.k % 8;
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  for (int64_t kk = 0; kk < k_vec; kk += 8) {
    __m256 w[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) w[j] = load_weights8<W>(p.w, (j0 + j) * p.w_stride + kk);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      __m256 x = _mm256_loadu_ps(p.x + (i0 + i) * p.x_stride + kk);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(x, w[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    const float* x = p.x + (i0 + i) * p.x_stride;
    for (int j = 0; j < NR; ++j) {
      float sum = combine_lanes(acc[i][j]);
      const int64_t w_row = (j0 + j) * p.w_stride;
      for (int64_t kk = k_vec; kk < p.k; ++kk) {
        sum = __builtin_fmaf(x[kk], load_weight1<W>(p.w, w_row + kk), sum);
      }
      p.y[(i0 + i) * p.y_stride + j0 + j] = sum;
    }
  }
}

template <DType W, int MR>
inline void row_tile(const LinearProblem& p, int64_t i0, int64_t n_begin, int64_t n_end) {
  constexpr int kNr = MR == 1 ? 4 : 3;
  int64_t j = n_begin;
  for (; j + kNr <= n_end; j += kNr) tile<W, MR, kNr>(p, i0, j);
  for (; j < n_end; ++j) tile<W, MR, 1>(p, i0, j);
}

}  // namespace

void linear_cpu_columns_avx2(const LinearProblem& p, int64_t n_begin, int64_t n_end) {
  with_weight_dtype(p.w_dtype, [&](auto w) {
    for_each_row_tile(p.m, [&](auto rows, int64_t i) {
      row_tile<decltype(w)::value, decltype(rows)::value>(p, i, n_begin, n_end);
    });
  });
}

}  // namespace pdserve
