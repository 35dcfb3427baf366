// AVX2 + FMA + F16C tiles for FP8 (E4M3) weights: the same reduction order as
// linear_cpu_fp8_columns_portable, lane for lane. An E4M3 code becomes an f16 bit pattern by a
// shift (exponent bias 7 vs 15, so the f16 value is 2^-8 times the E4M3 one, subnormals
// included) which F16C widens exactly; NaN codes (0x7F, 0xFF) are made f16 NaN. Compiled with
// -mavx2 -mfma -mf16c and only entered after a run-time CPU check.
#include <immintrin.h>

#include "kernels/linear_problem.h"

namespace pdserve {
namespace {

inline __m256 decode8(__m128i codes16) {
  const __m128i magnitude = _mm_and_si128(codes16, _mm_set1_epi16(0x7F));
  __m128i half = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(codes16, _mm_set1_epi16(0x80)), 8),
                              _mm_slli_epi16(magnitude, 7));
  const __m128i nan = _mm_cmpeq_epi16(magnitude, _mm_set1_epi16(0x7F));
  half = _mm_or_si128(half, _mm_and_si128(nan, _mm_set1_epi16(0x7E00)));
  return _mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(256.0f));
}

inline __m256 load_codes8(const uint8_t* p) {
  return decode8(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline float decode1(uint8_t code) {
  alignas(32) float out[8];
  _mm256_store_ps(out, decode8(_mm_cvtsi32_si128(code)));
  return out[0];
}

// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)): the portable kernel's order.
inline float combine_lanes(__m256 acc) {
  __m128 low = _mm256_castps256_ps128(acc);
  __m128 high = _mm256_extractf128_ps(acc, 1);
  __m128 pairs = _mm_add_ps(low, high);
  __m128 swapped = _mm_movehl_ps(pairs, pairs);
  __m128 quads = _mm_add_ps(pairs, swapped);
  __m128 odd = _mm_shuffle_ps(quads, quads, 0x55);
  return _mm_cvtss_f32(_mm_add_ss(quads, odd));
}

template <int MR, int NR>
inline void tile(const LinearProblem& p, int64_t i0, int64_t j0) {
  const auto* w = static_cast<const uint8_t*>(p.w);
  const int64_t block_k = p.scale_block_k;
  const int64_t scale_cols = (p.k + block_k - 1) / block_k;
  __m256 acc[MR][NR];
  float tail[MR][NR];
  const float* scales[NR];
#pragma GCC unroll 4
  for (int j = 0; j < NR; ++j) scales[j] = p.w_scale + ((j0 + j) / p.scale_block_n) * scale_cols;
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      acc[i][j] = _mm256_setzero_ps();
      tail[i][j] = 0.0f;
    }
  }
  for (int64_t b0 = 0, b = 0; b0 < p.k; b0 += block_k, ++b) {
    const int64_t b1 = p.k < b0 + block_k ? p.k : b0 + block_k;
    const int64_t vec_end = b0 + (b1 - b0) / 8 * 8;
    __m256 part[MR][NR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) part[i][j] = _mm256_setzero_ps();
    }
    for (int64_t kk = b0; kk < vec_end; kk += 8) {
      __m256 wv[NR];
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) wv[j] = load_codes8(w + (j0 + j) * p.w_stride + kk);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m256 x = _mm256_loadu_ps(p.x + (i0 + i) * p.x_stride + kk);
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) part[i][j] = _mm256_fmadd_ps(x, wv[j], part[i][j]);
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      const float scale = scales[j][b];
      const __m256 scale_vec = _mm256_set1_ps(scale);
      const uint8_t* row = w + (j0 + j) * p.w_stride;
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        acc[i][j] = _mm256_fmadd_ps(part[i][j], scale_vec, acc[i][j]);
        const float* x = p.x + (i0 + i) * p.x_stride;
        float rest = 0.0f;
        for (int64_t kk = vec_end; kk < b1; ++kk)
          rest = __builtin_fmaf(x[kk], decode1(row[kk]), rest);
        tail[i][j] = __builtin_fmaf(rest, scale, tail[i][j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      p.y[(i0 + i) * p.y_stride + j0 + j] = combine_lanes(acc[i][j]) + tail[i][j];
    }
  }
}

template <int MR>
inline void row_tile(const LinearProblem& p, int64_t i0, int64_t n_begin, int64_t n_end) {
  constexpr int kNr = MR == 1 ? 4 : 2;
  int64_t j = n_begin;
  for (; j + kNr <= n_end; j += kNr) tile<MR, kNr>(p, i0, j);
  for (; j < n_end; ++j) tile<MR, 1>(p, i0, j);
}

}  // namespace

void linear_cpu_fp8_columns_avx2(const LinearProblem& p, int64_t n_begin, int64_t n_end) {
  for_each_row_tile(
      p.m, [&](auto rows, int64_t i) { row_tile<decltype(rows)::value>(p, i, n_begin, n_end); });
}

}  // namespace pdserve
