// FP8 E4M3 codes widened exactly with AVX2, for the translation units compiled with those flags
// (kernels/*_avx2.cpp) only. A code sign-extended to 32 bits and shifted left by 20 has its sign
// at bit 31 and its exponent and mantissa at bits 26-20: the float32 of 2^-120 times its value,
// subnormal codes included (exponent field 0 is a float32 subnormal with the same mantissa),
// which a multiply by 2^120 makes the value exactly (with MXCSR's denormals-are-zero off, the
// default, which nothing in pdserve changes). NaN codes (0x7F, 0xFF) are made NaN. Four vector
// operations and the NaN test, where an f16 bit pattern widened by F16C took about twice as
// many: at one activation row the avx2 FP8 kernel went from bf16 weights' speed to 1.42x
// (docs/PERF.md, 2026-11-28 19:26).
#pragma once

#include <immintrin.h>

namespace pdserve {

// Eight codes in the low 8 bytes.
inline __m256 fp8_e4m3x8_to_float(__m128i codes) {
  const __m256i wide = _mm256_cvtepi8_epi32(codes);
  const __m256i bits = _mm256_and_si256(_mm256_slli_epi32(wide, 20),
                                        _mm256_set1_epi32(static_cast<int>(0x87F00000)));
  const __m256 value = _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0x1p120f));
  const __m256i nan =
      _mm256_cmpeq_epi32(_mm256_and_si256(wide, _mm256_set1_epi32(0x7F)), _mm256_set1_epi32(0x7F));
  return _mm256_or_ps(value, _mm256_castsi256_ps(nan));
}

}  // namespace pdserve
