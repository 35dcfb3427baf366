// AVX2 + FMA + F16C versions of vector_math.h (b and x also FP8 E4M3, unscaled); compiled with
// those flags, entered only after the run-time CPU check.
#include <immintrin.h>

#include "kernels/fp8_avx2.h"
#include "kernels/vector_math.h"

namespace pdserve::avx2 {
namespace {

inline __m256 load8(const void* base, DType dtype, int64_t index) {
  if (dtype == DType::kF8E4M3) {
    return fp8_e4m3x8_to_float(_mm_loadl_epi64(
        reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(base) + index)));
  }
  if (dtype == DType::kF32) return _mm256_loadu_ps(static_cast<const float*>(base) + index);
  __m128i half =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + index));
  if (dtype == DType::kF16) return _mm256_cvtph_ps(half);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

inline float load1(const void* base, DType dtype, int64_t index) {
  if (dtype == DType::kF32) return static_cast<const float*>(base)[index];
  if (dtype == DType::kF8E4M3) {
    const uint8_t code = static_cast<const uint8_t*>(base)[index];
    return _mm256_cvtss_f32(fp8_e4m3x8_to_float(_mm_cvtsi32_si128(code)));
  }
  uint16_t bits = static_cast<const uint16_t*>(base)[index];
  if (dtype == DType::kF16) return _cvtsh_ss(bits);
  uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  __builtin_memcpy(&value, &widened, 4);
  return value;
}

inline float combine_lanes(__m256 acc) {
  __m128 pairs = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  __m128 quads = _mm_add_ps(pairs, _mm_movehl_ps(pairs, pairs));
  return _mm_cvtss_f32(_mm_add_ss(quads, _mm_shuffle_ps(quads, quads, 0x55)));
}

}  // namespace

float dot_f32(const float* a, const void* b, DType b_dtype, int64_t n) {
  const int64_t n_vec = n - n % 8;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n_vec; i += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b, b_dtype, i), acc);
  }
  float sum = combine_lanes(acc);
  for (int64_t i = n_vec; i < n; ++i) sum = __builtin_fmaf(a[i], load1(b, b_dtype, i), sum);
  return sum;
}

void axpy_f32(float alpha, const void* x, DType x_dtype, float* y, int64_t n) {
  const int64_t n_vec = n - n % 8;
  const __m256 scale = _mm256_set1_ps(alpha);
  for (int64_t i = 0; i < n_vec; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(scale, load8(x, x_dtype, i), _mm256_loadu_ps(y + i)));
  }
  for (int64_t i = n_vec; i < n; ++i) y[i] = __builtin_fmaf(alpha, load1(x, x_dtype, i), y[i]);
}

}  // namespace pdserve::avx2
