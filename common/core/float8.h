// OCP FP8 E4M3 ("float8_e4m3fn": torch.float8_e4m3fn, safetensors F8_E4M3), the element type of
// Qwen3's FP8 checkpoints and of an FP8 KV cache: 1 sign, 4 exponent (bias 7), 3 mantissa bits;
// subnormals; no infinities; S.1111.111 is NaN; the largest finite value is 448. Header-only
// and free of other project headers so instruction-set-specific kernels can include it.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace pdserve {

inline constexpr float kFp8E4M3Max = 448.0f;

// Exact: every code is a float.
constexpr float fp8_e4m3_to_float(uint8_t code) {
  const bool negative = (code & 0x80u) != 0;
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 0x7;
  float magnitude = 0.0f;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = __builtin_nanf("");
  } else if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * 0x1p-9f;  // subnormal: m * 2^-9
  } else {
    magnitude = (1.0f + static_cast<float>(mantissa) * 0.125f) *
                std::bit_cast<float>(static_cast<uint32_t>(exponent - 7 + 127) << 23);
  }
  return negative ? -magnitude : magnitude;
}

// Rounds to nearest, ties to even, as ml_dtypes and torch convert: NaN, infinities and values
// that round beyond 448 give NaN (the format has no infinity).
inline uint8_t float_to_fp8_e4m3(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits >= 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN or infinity
  if (abs_bits < 0x3c800000u) {
    // Below the smallest normal (2^-6): a multiple of the subnormal step 2^-9, rounded to even
    // (a result of 8 is the smallest normal's code).
    const float steps = std::nearbyint(std::bit_cast<float>(abs_bits) * 512.0f);
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(steps));
  }
  // Rebase the exponent (bias 127 -> 7) and round the 23 mantissa bits to 3, ties to even; a
  // carry moves into the exponent as it should.
  const uint32_t rebased = abs_bits - (120u << 23);
  const uint32_t rounded = (rebased + 0x7ffffu + ((rebased >> 20) & 1u)) >> 20;
  if (rounded >= 0x7fu) return static_cast<uint8_t>(sign | 0x7fu);  // beyond 448
  return static_cast<uint8_t>(sign | rounded);
}

// What quantizers store (vLLM and Qwen's exports clamp before casting): finite values beyond
// +-448 become +-448, NaN stays NaN.
inline uint8_t float_to_fp8_e4m3_saturated(float value) {
  if (std::isnan(value)) return float_to_fp8_e4m3(value);
  return float_to_fp8_e4m3(std::fmax(-kFp8E4M3Max, std::fmin(kFp8E4M3Max, value)));
}

}  // namespace pdserve
