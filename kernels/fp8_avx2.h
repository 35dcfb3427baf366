// FP8 E4M3 codes widened exactly with AVX2 + F16C, for the translation units compiled with those
// flags (kernels/*_avx2.cpp) only. An E4M3 code becomes an f16 bit pattern by a shift (exponent
// bias 7 vs 15, so the f16 value is 2^-8 times the E4M3 one, subnormals included) which F16C
// widens exactly; NaN codes (0x7F, 0xFF) are made f16 NaN.
#pragma once

#include <immintrin.h>

namespace pdserve {

// Eight codes in the low 8 bytes.
inline __m256 fp8_e4m3x8_to_float(__m128i codes) {
  const __m128i codes16 = _mm_cvtepu8_epi16(codes);
  const __m128i magnitude = _mm_and_si128(codes16, _mm_set1_epi16(0x7F));
  __m128i half = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(codes16, _mm_set1_epi16(0x80)), 8),
                              _mm_slli_epi16(magnitude, 7));
  const __m128i nan = _mm_cmpeq_epi16(magnitude, _mm_set1_epi16(0x7F));
  half = _mm_or_si128(half, _mm_and_si128(nan, _mm_set1_epi16(0x7E00)));
  return _mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(256.0f));
}

}  // namespace pdserve
