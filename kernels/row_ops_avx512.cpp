// The avx512 level's row operations (row_ops_avx512.h). Compiled with the AVX-512 flags and
// only entered after the run-time CPU check.
#include "kernels/row_ops_avx512.h"

#include "kernels/avx512_common.h"

namespace pdserve::avx512 {
namespace {

// Sum of squares in double: lanes l of a / b accumulate elements 16i + l / 16i + 8 + l; the
// tail is zero-padded; then (a + b) and its eight lanes in a fixed tree.
inline double sum_squares(const float* x, int64_t n) {
  __m512d a = _mm512_setzero_pd();
  __m512d b = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(first_lanes16(n - j), x + j);
    const __m512d low = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d high = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    a = _mm512_fmadd_pd(low, low, a);
    b = _mm512_fmadd_pd(high, high, b);
  }
  const __m512d s = _mm512_add_pd(a, b);
  const __m256d q = _mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1));
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(q), _mm256_extractf128_pd(q, 1));
  return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

inline float inverse_rms(const float* x, int64_t n, float eps) {
  return static_cast<float>(1.0 / __builtin_sqrt(sum_squares(x, n) / static_cast<double>(n) + eps));
}

inline void scale_row(const float* in, float inv_rms, const void* weight, DType weight_dtype,
                      int64_t n, float* out) {
  const __m512 scale = _mm512_set1_ps(inv_rms);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 mask = first_lanes16(n - j);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, in + j), scale);
    _mm512_mask_storeu_ps(out + j, mask, _mm512_mul_ps(v, load16(weight, weight_dtype, j, mask)));
  }
}

}  // namespace

void rms_norm_row(const float* in, const void* weight, DType weight_dtype, float eps, int64_t n,
                  float* out) {
  scale_row(in, inverse_rms(in, n, eps), weight, weight_dtype, n, out);
}

void add_rms_norm_row(float* x, float* residual, const void* weight, DType weight_dtype, float eps,
                      int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 mask = first_lanes16(n - j);
    _mm512_mask_storeu_ps(residual + j, mask,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(mask, residual + j),
                                        _mm512_maskz_loadu_ps(mask, x + j)));
  }
  rms_norm_row(residual, weight, weight_dtype, eps, n, x);
}

void norm_rope_head(float* head, const void* norm_weight, DType weight_dtype, float eps,
                    int head_dim, const double* cos_table, const double* sin_table) {
  rms_norm_row(head, norm_weight, weight_dtype, eps, head_dim, head);
  // HF rotate-half layout: element j pairs with j + head_dim/2; products in double.
  const int half = head_dim / 2;
  for (int j = 0; j < half; j += 8) {
    const __mmask8 mask = static_cast<__mmask8>(half - j >= 8 ? 0xFF : (1u << (half - j)) - 1u);
    const __m512d x1 = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(mask, head + j));
    const __m512d x2 = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(mask, head + j + half));
    const __m512d c = _mm512_maskz_loadu_pd(mask, cos_table + j);
    const __m512d s = _mm512_maskz_loadu_pd(mask, sin_table + j);
    const __m512d first = _mm512_sub_pd(_mm512_mul_pd(x1, c), _mm512_mul_pd(x2, s));
    const __m512d second = _mm512_add_pd(_mm512_mul_pd(x2, c), _mm512_mul_pd(x1, s));
    _mm256_mask_storeu_ps(head + j, mask, _mm512_cvtpd_ps(first));
    _mm256_mask_storeu_ps(head + j + half, mask, _mm512_cvtpd_ps(second));
  }
}

void silu_mul_row(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 mask = first_lanes16(n - j);
    const __m512 g = _mm512_maskz_loadu_ps(mask, gate + j);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + j, mask, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(mask, up + j)));
  }
}

void store_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 mask = first_lanes16(n - j);
    _mm256_mask_storeu_epi16(dst + j, mask, to_bf16x16(_mm512_maskz_loadu_ps(mask, src + j)));
  }
}

}  // namespace pdserve::avx512
