#include "common/core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace pdserve {
namespace {

// Reference: the representable neighbour closest to x in double precision, ties to even.
double round_to_grid(double x, double lo, double hi, uint32_t lo_bits) {
  double d_lo = x - lo, d_hi = hi - x;
  if (d_lo < d_hi) return lo;
  if (d_hi < d_lo) return hi;
  return (lo_bits & 1u) == 0 ? lo : hi;
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)).value(), t);
    EXPECT_EQ(parse_safetensors_dtype(safetensors_dtype_name(t)).value(), t);
  }
  EXPECT_FALSE(parse_dtype("int8").ok());
  EXPECT_FALSE(parse_safetensors_dtype("F64").ok());
}

TEST(DType, Bf16RoundsToNearestEven) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> bits_dist;
  for (int i = 0; i < 200000; ++i) {
    float x = std::bit_cast<float>(bits_dist(rng));
    if (!std::isfinite(x)) continue;
    uint32_t lo_bits = std::bit_cast<uint32_t>(x) >> 16;
    float lo = bf16_to_float(static_cast<uint16_t>(lo_bits));
    float hi = bf16_to_float(static_cast<uint16_t>(lo_bits + 1));
    if (!std::isfinite(hi)) continue;
    // Truncation gives the neighbour towards zero; compare magnitudes.
    double expected = round_to_grid(std::fabs(x), std::fabs(lo), std::fabs(hi), lo_bits);
    EXPECT_EQ(std::fabs(bf16_to_float(float_to_bf16(x))), expected) << x;
  }
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    float value = f16_to_float(static_cast<uint16_t>(bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(value))));
      continue;
    }
    EXPECT_EQ(float_to_f16(value), bits) << "bits=" << bits;
  }
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(70000.0f), 0x7c00);         // overflow to infinity
  EXPECT_EQ(float_to_f16(5.960464477539063e-08f), 1);  // smallest subnormal
  EXPECT_EQ(float_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);  // tie rounds to even
}

TEST(DType, ConvertElementsBetweenAllTypes) {
  std::vector<float> source = {0.0f, 1.5f, -3.25f, 1024.0f, 0.0078125f};
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    std::vector<std::byte> packed(source.size() * dtype_size(t));
    convert_elements(source.data(), DType::kF32, packed.data(), t, source.size());
    std::vector<float> back(source.size());
    convert_elements(packed.data(), t, back.data(), DType::kF32, source.size());
    EXPECT_EQ(back, source) << dtype_name(t);  // all values are exact in every type
  }
}

}  // namespace
}  // namespace pdserve
