// Element types of weights and activations, and scalar conversions between them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/core/dtype_enum.h"
#include "common/core/float8.h"
#include "common/core/status.h"

namespace pdserve {

size_t dtype_size(DType dtype);
// Names as used on the command line ("bfloat16", "float16", "float32"; "float8_e4m3fn").
std::string_view dtype_name(DType dtype);
// Accepts the compute dtypes' command-line names and torch-style aliases ("bf16", "fp16",
// "half", "float"); never FP8, which is a storage type only.
Result<DType> parse_dtype(std::string_view name);
// Safetensors header dtype strings ("BF16", "F16", "F32", "F8_E4M3").
Result<DType> parse_safetensors_dtype(std::string_view name);
std::string_view safetensors_dtype_name(DType dtype);

// bfloat16 <-> float: round to nearest even; NaN stays NaN.
inline uint16_t float_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}
inline float bf16_to_float(uint16_t value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value) << 16);
}

// IEEE binary16 <-> float, round to nearest even, with subnormals, infinities and NaN.
uint16_t float_to_f16(float value);
float f16_to_float(uint16_t value);

// Reads element `index` of an array of any DType as float (an FP8 code unscaled).
inline float load_as_float(const void* base, DType dtype, size_t index) {
  if (dtype == DType::kF32) return static_cast<const float*>(base)[index];
  if (dtype == DType::kF8E4M3) return fp8_e4m3_to_float(static_cast<const uint8_t*>(base)[index]);
  uint16_t bits;
  std::memcpy(&bits, static_cast<const uint16_t*>(base) + index, 2);
  return dtype == DType::kBF16 ? bf16_to_float(bits) : f16_to_float(bits);
}

// Converts `count` elements from `src` (of type `from`) to `dst` (of type `to`).
void convert_elements(const void* src, DType from, void* dst, DType to, size_t count);

}  // namespace pdserve
