#include "kernels/vector_math.h"

#include <cmath>
#include <cstring>

#include "common/core/dtype.h"

namespace pdserve {

namespace portable {

float dot_f32(const float* a, const void* b, DType b_dtype, int64_t n) {
  const int64_t n_vec = n - n % 8;
  float lanes[8] = {};
  for (int64_t i = 0; i < n_vec; i += 8) {
    for (int l = 0; l < 8; ++l)
      lanes[l] =
          std::fma(a[i + l], load_as_float(b, b_dtype, static_cast<size_t>(i + l)), lanes[l]);
  }
  float sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
              ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
  for (int64_t i = n_vec; i < n; ++i) sum = std::fma(a[i], load_as_float(b, b_dtype, i), sum);
  return sum;
}

void axpy_f32(float alpha, const void* x, DType x_dtype, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(alpha, load_as_float(x, x_dtype, i), y[i]);
}

}  // namespace portable

}  // namespace pdserve
