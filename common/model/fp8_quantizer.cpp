#include "common/model/fp8_quantizer.h"

#include <algorithm>
#include <cmath>

#include "common/core/float8.h"

namespace pdserve {

void quantize_fp8_stripe(const float* values, int64_t rows, int64_t k, int64_t block_k,
                         DType scale_dtype, uint8_t* codes, float* scales) {
  for (int64_t c0 = 0, block = 0; c0 < k; c0 += block_k, ++block) {
    const int64_t c1 = std::min(k, c0 + block_k);
    float amax = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(values[r * k + c]));
    }
    // Stored in the checkpoint's scale dtype: quantize with the value the loader will read.
    float scale = amax / kFp8E4M3Max;
    if (scale_dtype != DType::kF32) {
      uint16_t stored = 0;
      convert_elements(&scale, DType::kF32, &stored, scale_dtype, 1);
      convert_elements(&stored, scale_dtype, &scale, DType::kF32, 1);
    }
    scales[block] = scale;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        codes[r * k + c] =
            scale > 0.0f ? float_to_fp8_e4m3_saturated(values[r * k + c] / scale) : uint8_t{0};
      }
    }
  }
}

}  // namespace pdserve
