#include "common/core/dtype.h"

#include <cmath>
#include <string>

#include "common/core/float8.h"

namespace pdserve {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kF32:
      return 4;
    case DType::kF8E4M3:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kF32:
      return "float32";
    case DType::kF8E4M3:
      return "float8_e4m3fn";
  }
  return "unknown";
}

Result<DType> parse_dtype(std::string_view name) {
  if (name == "bfloat16" || name == "bf16") return DType::kBF16;
  if (name == "float16" || name == "fp16" || name == "half") return DType::kF16;
  if (name == "float32" || name == "fp32" || name == "float") return DType::kF32;
  return invalid_argument("unknown dtype '" + std::string(name) +
                          "' (expected bfloat16, float16 or float32)");
}

Result<DType> parse_safetensors_dtype(std::string_view name) {
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "F32") return DType::kF32;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  return invalid_argument("unsupported safetensors dtype '" + std::string(name) +
                          "' (supported: BF16, F16, F32, F8_E4M3)");
}

std::string_view safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF32:
      return "F32";
    case DType::kF8E4M3:
      return "F8_E4M3";
  }
  return "unknown";
}

uint16_t float_to_f16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs_bits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs_bits < 0x38800000u) {
    // Subnormal or zero in half precision: scale into the subnormal range and round.
    float magnitude = std::bit_cast<float>(abs_bits);
    float scaled = magnitude * 16777216.0f;  // 2^24: one half-subnormal ulp becomes 1.0
    auto rounded = static_cast<uint16_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | rounded);
  }
  uint32_t mantissa_rounding = 0xfffu + ((abs_bits >> 13) & 1u);
  uint32_t rebased = abs_bits - (112u << 23);  // exponent bias 127 -> 15
  return static_cast<uint16_t>(sign | ((rebased + mantissa_rounding) >> 13));
}

float f16_to_float(uint16_t value) {
  uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  uint32_t exponent = (value >> 10) & 0x1fu;
  uint32_t mantissa = value & 0x3ffu;
  if (exponent == 0) {
    float magnitude = static_cast<float>(mantissa) / 16777216.0f;  // mantissa * 2^-24
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

namespace {

template <DType From>
inline float load_typed(const void* src, size_t i) {
  if constexpr (From == DType::kF8E4M3) {
    return fp8_e4m3_to_float(static_cast<const uint8_t*>(src)[i]);
  } else if constexpr (From == DType::kF32) {
    float v;
    std::memcpy(&v, static_cast<const std::byte*>(src) + 4 * i, 4);
    return v;
  } else {
    uint16_t v;
    std::memcpy(&v, static_cast<const std::byte*>(src) + 2 * i, 2);
    return From == DType::kBF16 ? bf16_to_float(v) : f16_to_float(v);
  }
}

template <DType To>
inline void store_typed(void* dst, size_t i, float value) {
  if constexpr (To == DType::kF8E4M3) {
    static_cast<uint8_t*>(dst)[i] = float_to_fp8_e4m3(value);
  } else if constexpr (To == DType::kF32) {
    std::memcpy(static_cast<std::byte*>(dst) + 4 * i, &value, 4);
  } else {
    const uint16_t v = To == DType::kBF16 ? float_to_bf16(value) : float_to_f16(value);
    std::memcpy(static_cast<std::byte*>(dst) + 2 * i, &v, 2);
  }
}

// One loop per (from, to) pair so the element type is not re-examined per element.
template <DType From, DType To>
void convert_loop(const void* src, void* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) store_typed<To>(dst, i, load_typed<From>(src, i));
}

template <DType From>
void convert_from(const void* src, void* dst, DType to, size_t count) {
  switch (to) {
    case DType::kBF16:
      convert_loop<From, DType::kBF16>(src, dst, count);
      return;
    case DType::kF16:
      convert_loop<From, DType::kF16>(src, dst, count);
      return;
    case DType::kF32:
      convert_loop<From, DType::kF32>(src, dst, count);
      return;
    case DType::kF8E4M3:
      convert_loop<From, DType::kF8E4M3>(src, dst, count);
      return;
  }
}

}  // namespace

void convert_elements(const void* src, DType from, void* dst, DType to, size_t count) {
  if (from == to) {
    std::memcpy(dst, src, count * dtype_size(from));
    return;
  }
  switch (from) {
    case DType::kBF16:
      convert_from<DType::kBF16>(src, dst, to, count);
      return;
    case DType::kF16:
      convert_from<DType::kF16>(src, dst, to, count);
      return;
    case DType::kF32:
      convert_from<DType::kF32>(src, dst, to, count);
      return;
    case DType::kF8E4M3:
      convert_from<DType::kF8E4M3>(src, dst, to, count);
      return;
  }
}

}  // namespace pdserve
