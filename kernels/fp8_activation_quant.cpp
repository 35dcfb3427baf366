#include "kernels/fp8_activation_quant.h"

#include <algorithm>
#include <cmath>

#include "common/core/float8.h"

namespace pdserve {

void quantize_fp8_token_groups_reference(const float* x, int64_t m, int64_t k, int64_t x_stride,
                                         uint8_t* q, float* scales) {
  for (int64_t row = 0; row < m; ++row) {
    const float* in = x + row * x_stride;
    for (int64_t begin = 0, group = 0; begin < k; begin += kFp8ActivationGroup, ++group) {
      const int64_t end = std::min(k, begin + kFp8ActivationGroup);
      float amax = 0.0f;
      for (int64_t j = begin; j < end; ++j) amax = std::fmax(amax, std::fabs(in[j]));
      const float scale = std::fmax(amax, kFp8ScaleFloor) / kFp8E4M3Max;
      scales[group * m + row] = scale;
      for (int64_t j = begin; j < end; ++j) {
        q[row * k + j] = float_to_fp8_e4m3_saturated(in[j] / scale);
      }
    }
  }
}

}  // namespace pdserve
