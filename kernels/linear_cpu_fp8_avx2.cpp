// AVX2 + FMA + F16C tiles for FP8 (E4M3) weights: the same reduction order as
// linear_cpu_fp8_columns_portable, lane for lane, with the codes widened by fp8_avx2.h. Compiled
// with -mavx2 -mfma -mf16c and only entered after a run-time CPU check.
//
// Two weight sources feed the same tile: a few rows (decode) widen the codes in registers for
// every row tile, reading 1 byte a weight; from kFp8DecodeOnceMinRows rows on (prefill) the
// column block is widened once into the caller's float buffer and every row tile reads that.
// The widening is exact, so both give the same floats and every element the same sums.
#include <immintrin.h>

#include "kernels/fp8_avx2.h"
#include "kernels/linear_problem.h"

namespace pdserve {
namespace {

inline __m256 load_codes8(const uint8_t* p) {
  return fp8_e4m3x8_to_float(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

inline float decode1(uint8_t code) {
  alignas(32) float out[8];
  _mm256_store_ps(out, fp8_e4m3x8_to_float(_mm_cvtsi32_si128(code)));
  return out[0];
}

// The weights as codes, widened at every use.
struct CodeWeights {
  const uint8_t* w;
  int64_t stride;
  __m256 load8(int64_t column, int64_t kk) const { return load_codes8(w + column * stride + kk); }
  float load1(int64_t column, int64_t kk) const { return decode1(w[column * stride + kk]); }
};

// The weights of columns [first_column, ...) widened once (row stride fp8_decoded_row_avx2(k)).
struct DecodedWeights {
  const float* w;
  int64_t stride;
  int64_t first_column;
  __m256 load8(int64_t column, int64_t kk) const {
    return _mm256_loadu_ps(w + (column - first_column) * stride + kk);
  }
  float load1(int64_t column, int64_t kk) const { return w[(column - first_column) * stride + kk]; }
};

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

template <int MR, int NR, typename Weights>
inline void tile(const LinearProblem& p, const Weights& weights, int64_t i0, int64_t j0) {
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
      for (int j = 0; j < NR; ++j) wv[j] = weights.load8(j0 + j, kk);
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
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        acc[i][j] = _mm256_fmadd_ps(part[i][j], scale_vec, acc[i][j]);
        const float* x = p.x + (i0 + i) * p.x_stride;
        float rest = 0.0f;
        for (int64_t kk = vec_end; kk < b1; ++kk)
          rest = __builtin_fmaf(x[kk], weights.load1(j0 + j, kk), rest);
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

template <int MR, typename Weights>
inline void row_tile(const LinearProblem& p, const Weights& weights, int64_t i0, int64_t n_begin,
                     int64_t n_end) {
  constexpr int kNr = MR == 1 ? 4 : 2;
  int64_t j = n_begin;
  for (; j + kNr <= n_end; j += kNr) tile<MR, kNr>(p, weights, i0, j);
  for (; j < n_end; ++j) tile<MR, 1>(p, weights, i0, j);
}

template <typename Weights>
void all_rows(const LinearProblem& p, const Weights& weights, int64_t n_begin, int64_t n_end) {
  for_each_row_tile(p.m, [&](auto rows, int64_t i) {
    row_tile<decltype(rows)::value>(p, weights, i, n_begin, n_end);
  });
}

// Columns [n_begin, n_end) widened into `decoded`, rows fp8_decoded_row_avx2(k) apart.
void decode_columns(const LinearProblem& p, int64_t n_begin, int64_t n_end, float* decoded) {
  const auto* w = static_cast<const uint8_t*>(p.w);
  const int64_t stride = fp8_decoded_row_avx2(p.k);
  const int64_t k_vec = p.k / 8 * 8;
  for (int64_t j = n_begin; j < n_end; ++j) {
    const uint8_t* codes = w + j * p.w_stride;
    float* out = decoded + (j - n_begin) * stride;
    for (int64_t kk = 0; kk < k_vec; kk += 8) {
      // Once a cache line (batch 8 of a 131072 x 4096 weight: 185 ms without, 127 with).
      if (kk % 64 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(codes + kk) + kFp8PrefetchAhead, _MM_HINT_T0);
      }
      _mm256_storeu_ps(out + kk, load_codes8(codes + kk));
    }
    for (int64_t kk = k_vec; kk < p.k; ++kk) out[kk] = decode1(codes[kk]);
  }
}

}  // namespace

void linear_cpu_fp8_columns_avx2(const LinearProblem& p, int64_t n_begin, int64_t n_end,
                                 float* decoded) {
  if (p.m < kFp8DecodeOnceMinRows) {
    all_rows(p, CodeWeights{static_cast<const uint8_t*>(p.w), p.w_stride}, n_begin, n_end);
    return;
  }
  decode_columns(p, n_begin, n_end, decoded);
  all_rows(p, DecodedWeights{decoded, fp8_decoded_row_avx2(p.k), n_begin}, n_begin, n_end);
}

}  // namespace pdserve
