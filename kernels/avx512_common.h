// Helpers shared by the AVX-512 kernel files (kernels/*_avx512*.cpp). Include only from files
// compiled with the AVX-512 flags; everything is in an anonymous namespace so that no inline
// function compiled with those flags can be picked by the linker for another file.
#pragma once

// GCC 12 warns about the deliberately undefined vectors inside its own AVX-512 intrinsics
// (GCC bug 105593, fixed in GCC 13); the warning is about the header, not this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "common/core/dtype_enum.h"

namespace pdserve {
namespace {  // NOLINT(google-build-namespaces): one private copy per instruction-set file

// Sums each of 16 vectors' lanes; result lane i is the sum of v[i]. Every sum uses the same
// tree whatever the other vectors are: s_l = (v[l] + v[l+8]) + (v[l+4] + v[l+12]) for
// l < 4, then (s_0 + s_2) + (s_1 + s_3). So a dot product's result does not depend on how
// many others were reduced with it (callers pad with zero vectors).
inline __m512 sum_lanes16(const __m512 (&v)[16]) {
  __m512 u[8];
#pragma GCC unroll 32
  for (int a = 0; a < 8; ++a) {
    u[a] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * a], v[2 * a + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * a], v[2 * a + 1], 0xEE));
  }
  __m512 w[4];  // quarter q of w[k] holds v[4k + q]'s four partial sums
#pragma GCC unroll 32
  for (int a = 0; a < 4; ++a) {
    w[a] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * a], u[2 * a + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * a], u[2 * a + 1], 0xDD));
  }
  __m512 x[2];
#pragma GCC unroll 32
  for (int a = 0; a < 2; ++a) {
    x[a] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * a], w[2 * a + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * a], w[2 * a + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // Lane 4q + s of r holds the sum of v[4s + q].
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, r);
}

// The lanes of one vector summed with the same tree as sum_lanes16.
inline float sum_lanes(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));  // s0 + s2, s1 + s3
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 0x55)));
}

// Stores the lane sums (sum_lanes16's tree) of acc[MR][NR] at y (row stride y_stride): the
// last step of every linear tile at the avx512 levels.
template <int MR, int NR>
inline void reduce_store(const __m512 (&acc)[MR][NR], float* y, int64_t y_stride) {
  constexpr int kCount = MR * NR;
  if constexpr (kCount < 4) {  // a few sums: one vector at a time is cheaper, and the same tree
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) y[i * y_stride + j] = sum_lanes(acc[i][j]);
    }
    return;
  }
  alignas(64) float sums[(kCount + 15) / 16 * 16];
#pragma GCC unroll 32
  for (int group = 0; group < kCount; group += 16) {
    __m512 v[16];
#pragma GCC unroll 32
    for (int t = 0; t < 16; ++t) {
      const int index = group + t;
      v[t] = index < kCount ? acc[index / NR][index % NR] : _mm512_setzero_ps();
    }
    _mm512_store_ps(sums + group, sum_lanes16(v));
  }
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) y[i * y_stride + j] = sums[i * NR + j];
  }
}

// 16 FP8 E4M3 codes as float32, exactly (fp8_e4m3_to_float's values): the magnitude bits
// placed in a float16's (exponent bias 15 instead of 7, subnormals included) are the value times
// 2^-8, converted exactly by vcvtph2ps; the NaN codes (S.1111.111) are set apart.
inline __m512 fp8_e4m3x16_to_float(__m128i codes) {
  const __m256i bytes = _mm256_cvtepu8_epi16(codes);
  const __m256i magnitude = _mm256_and_si256(bytes, _mm256_set1_epi16(0x7f));
  const __m256i half =
      _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(bytes, _mm256_set1_epi16(0x80)), 8),
                      _mm256_slli_epi16(magnitude, 7));
  const __m512 value = _mm512_mul_ps(_mm512_cvtph_ps(half), _mm512_set1_ps(256.0f));
  const __mmask16 nan = _mm256_cmpeq_epi16_mask(magnitude, _mm256_set1_epi16(0x7f));
  return _mm512_mask_mov_ps(value, nan, _mm512_set1_ps(__builtin_nanf("")));
}

// 16 bf16 / f16 / f32 / FP8 E4M3 values widened to float32 (`mask` selects lanes; others read
// as 0; FP8 codes unscaled).
inline __m512 load16(const void* base, DType dtype, int64_t index, __mmask16 mask = 0xFFFF) {
  if (dtype == DType::kF8E4M3) {
    return _mm512_maskz_mov_ps(mask, fp8_e4m3x16_to_float(_mm_maskz_loadu_epi8(
                                         mask, static_cast<const uint8_t*>(base) + index)));
  }
  if (dtype == DType::kF32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + index);
  }
  const __m256i half = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + index);
  if (dtype == DType::kF16) return _mm512_cvtph_ps(half);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

inline __m512 load_bf16x16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// float32 -> bf16, round to nearest even, NaN kept quiet: bit-identical to float_to_bf16 in
// common/core/dtype.h (which the scalar paths and the KV transfer use).
inline __m256i to_bf16x16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  const __m512i result = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x00400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(result, 16));
}

// exp(x) for float32 lanes: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact
// product), a degree-6 polynomial for e^r, scaled by 2^n. Max error ~2 ulp; exp(-inf) and
// anything below -104 give 0, above 88.7 +inf. One fixed sequence of operations, so the
// result depends only on x.
inline __m512 exp16(__m512 x) {
  const __m512 clamped = _mm512_min_ps(x, _mm512_set1_ps(88.75f));
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_LT_OQ);
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(1.44269504088896341f)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), clamped);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~underflow), p, n);
}

inline __mmask16 first_lanes16(int64_t count) {
  return count >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << count) - 1u);
}

}  // namespace
}  // namespace pdserve
