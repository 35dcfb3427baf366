// FP8 E4M3 conversions against ml_dtypes' (tests/data/fp8_e4m3_ml_dtypes.txt, written by
// tests/reference/fp8_e4m3_goldens.py): all 256 codes decoded, and the encoding of every
// value, every midpoint (ties to even) and one ulp either side, the specials and random floats.
#include "common/core/float8.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/core/dtype.h"

namespace pdserve {
namespace {

struct Goldens {
  std::vector<std::pair<int, uint32_t>> decode;  // code, float32 bits
  std::vector<std::pair<uint32_t, int>> encode;  // float32 bits, code
};

Goldens read_goldens() {
  std::ifstream in(std::string(PDSERVE_TEST_DATA_DIR) + "/fp8_e4m3_ml_dtypes.txt");
  Goldens goldens;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (kind == "decode") {
      int code = 0;
      uint32_t bits = 0;
      fields >> code >> std::hex >> bits;
      goldens.decode.emplace_back(code, bits);
    } else {
      uint32_t bits = 0;
      int code = 0;
      fields >> std::hex >> bits >> std::dec >> code;
      goldens.encode.emplace_back(bits, code);
    }
  }
  return goldens;
}

TEST(Float8E4M3, EveryCodeDecodesAsMlDtypes) {
  const Goldens goldens = read_goldens();
  ASSERT_EQ(goldens.decode.size(), 256u);
  int nans = 0;
  for (const auto& [code, bits] : goldens.decode) {
    const float expected = std::bit_cast<float>(bits);
    const float actual = fp8_e4m3_to_float(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(actual)) << "code " << code;
      ++nans;
      continue;
    }
    EXPECT_EQ(std::bit_cast<uint32_t>(actual), bits) << "code " << code;  // -0 included
  }
  EXPECT_EQ(nans, 2);  // 0x7f and 0xff
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), kFp8E4M3Max);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), 0x1p-9f);  // the smallest subnormal
}

TEST(Float8E4M3, EncodingRoundsAsMlDtypes) {
  const Goldens goldens = read_goldens();
  ASSERT_GT(goldens.encode.size(), 3000u);
  for (const auto& [bits, code] : goldens.encode) {
    const float value = std::bit_cast<float>(bits);
    const uint8_t actual = float_to_fp8_e4m3(value);
    if (std::isnan(value)) {
      // ml_dtypes keeps a NaN's sign; either NaN code means NaN.
      EXPECT_EQ(actual & 0x7f, 0x7f) << std::hex << bits;
      continue;
    }
    EXPECT_EQ(actual, code) << "float bits " << std::hex << bits << " (" << value << ")";
  }
}

TEST(Float8E4M3, SaturatedEncodingClampsFiniteValues) {
  EXPECT_EQ(float_to_fp8_e4m3_saturated(1e30f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3_saturated(-500.0f), 0xfe);
  EXPECT_EQ(float_to_fp8_e4m3_saturated(448.0f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3_saturated(1.0f), float_to_fp8_e4m3(1.0f));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(float_to_fp8_e4m3_saturated(std::nanf("")))));
  // Infinities are beyond every finite value: they clamp too.
  EXPECT_EQ(float_to_fp8_e4m3_saturated(-INFINITY), 0xfe);
}

TEST(Float8E4M3, IsAStorageDType) {
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_EQ(parse_safetensors_dtype("F8_E4M3").value(), DType::kF8E4M3);
  EXPECT_EQ(safetensors_dtype_name(DType::kF8E4M3), "F8_E4M3");
  // Nothing computes in FP8: the compute-dtype parser refuses every spelling.
  for (const char* name : {"float8_e4m3fn", "fp8", "fp8_e4m3", "F8_E4M3"}) {
    EXPECT_FALSE(parse_dtype(name).ok()) << name;
  }
  const std::vector<float> values = {0.0f, -1.5f, 448.0f, 0x1p-9f, 3.0f};
  std::vector<uint8_t> codes(values.size());
  std::vector<float> back(values.size());
  convert_elements(values.data(), DType::kF32, codes.data(), DType::kF8E4M3, values.size());
  convert_elements(codes.data(), DType::kF8E4M3, back.data(), DType::kF32, values.size());
  EXPECT_EQ(back, values);  // each is exactly representable
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(load_as_float(codes.data(), DType::kF8E4M3, i), values[i]);
  }
}

}  // namespace
}  // namespace pdserve
