// FP8 (E4M3) weights for linear_cpu: the portable reference kernel and the exact table the
// AVX-512 kernel looks rare codes up in. See linear_problem.h for the reduction order.
#include <algorithm>
#include <array>
#include <cmath>

#include "common/core/dtype.h"
#include "common/core/float8.h"
#include "kernels/linear_problem.h"

namespace pdserve {
namespace {

constexpr std::array<float, 256> kFp8Values = [] {
  std::array<float, 256> values{};
  for (int code = 0; code < 256; ++code)
    values[code] = fp8_e4m3_to_float(static_cast<uint8_t>(code));
  return values;
}();

// Times 2^-8 is exact (the smallest subnormal, 2^-9, stays a normal bf16) and keeps NaN.
std::array<uint16_t, 128> make_bf16_magnitudes_scaled() {
  std::array<float, 128> scaled{};
  for (size_t code = 0; code < scaled.size(); ++code) scaled[code] = kFp8Values[code] / 256.0f;
  std::array<uint16_t, 128> bits{};
  convert_elements(scaled.data(), DType::kF32, bits.data(), DType::kBF16, bits.size());
  return bits;
}

}  // namespace

const uint16_t* fp8_e4m3_magnitudes_bf16_scaled() {
  static const std::array<uint16_t, 128> table = make_bf16_magnitudes_scaled();
  return table.data();
}

void linear_cpu_fp8_columns_portable(const LinearProblem& p, int64_t n_begin, int64_t n_end) {
  const auto* w = static_cast<const uint8_t*>(p.w);
  const int64_t block_k = p.scale_block_k;
  const int64_t scale_cols = (p.k + block_k - 1) / block_k;
  for (int64_t i = 0; i < p.m; ++i) {
    const float* x = p.x + i * p.x_stride;
    for (int64_t j = n_begin; j < n_end; ++j) {
      const uint8_t* row = w + j * p.w_stride;
      const float* scales = p.w_scale + (j / p.scale_block_n) * scale_cols;
      float acc[8] = {};
      float tail = 0.0f;
      for (int64_t b0 = 0, b = 0; b0 < p.k; b0 += block_k, ++b) {
        const int64_t b1 = std::min(p.k, b0 + block_k);
        const int64_t vec_end = b0 + (b1 - b0) / 8 * 8;
        float part[8] = {};
        for (int64_t kk = b0; kk < vec_end; kk += 8) {
          for (int l = 0; l < 8; ++l)
            part[l] = std::fma(x[kk + l], kFp8Values[row[kk + l]], part[l]);
        }
        float rest = 0.0f;
        for (int64_t kk = vec_end; kk < b1; ++kk) rest = std::fma(x[kk], kFp8Values[row[kk]], rest);
        const float scale = scales[b];
        for (int l = 0; l < 8; ++l) acc[l] = std::fma(part[l], scale, acc[l]);
        tail = std::fma(rest, scale, tail);
      }
      p.y[i * p.y_stride + j] =
          (((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))) +
          tail;
    }
  }
}

}  // namespace pdserve
