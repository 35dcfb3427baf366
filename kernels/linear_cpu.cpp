#include "kernels/linear_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/core/dtype.h"

namespace pdserve {
namespace {

// Weight rows handled together so that their block stays in L2 while every activation row
// streams past it.
constexpr int64_t kColumnBlock = 48;

}  // namespace

bool cpu_has_avx2_fma() {
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                                __builtin_cpu_supports("f16c");
  return supported;
}

// The reference order that the AVX2 kernel reproduces lane for lane.
void linear_cpu_columns_portable(const LinearProblem& p, int64_t n_begin, int64_t n_end) {
  const int64_t k_vec = p.k - p.k % 8;
  for (int64_t i = 0; i < p.m; ++i) {
    const float* x = p.x + i * p.x_stride;
    for (int64_t j = n_begin; j < n_end; ++j) {
      const int64_t w_row = j * p.w_stride;
      float lanes[8] = {};
      for (int64_t kk = 0; kk < k_vec; kk += 8) {
        for (int l = 0; l < 8; ++l) {
          lanes[l] = std::fma(x[kk + l],
                              load_as_float(p.w, p.w_dtype, static_cast<size_t>(w_row + kk + l)),
                              lanes[l]);
        }
      }
      float sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
                  ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
      for (int64_t kk = k_vec; kk < p.k; ++kk) {
        sum = std::fma(x[kk], load_as_float(p.w, p.w_dtype, static_cast<size_t>(w_row + kk)), sum);
      }
      p.y[i * p.y_stride + j] = sum;
    }
  }
}

Status linear_cpu(const LinearProblem& p, int num_threads) {
  if (p.m < 0 || p.n < 0 || p.k < 0) return invalid_argument("linear: negative dimension");
  if (p.m == 0 || p.n == 0) return {};
  if (p.x == nullptr || p.w == nullptr || p.y == nullptr) {
    return invalid_argument("linear: null operand");
  }
  const bool use_avx2 = cpu_has_avx2_fma();
  const int64_t num_blocks = (p.n + kColumnBlock - 1) / kColumnBlock;
  const int threads = static_cast<int>(std::min<int64_t>(num_threads, num_blocks));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t block = 0; block < num_blocks; ++block) {
    const int64_t begin = block * kColumnBlock;
    const int64_t end = std::min(p.n, begin + kColumnBlock);
    if (use_avx2) {
      linear_cpu_columns_avx2(p, begin, end);
    } else {
      linear_cpu_columns_portable(p, begin, end);
    }
  }
  return {};
}

}  // namespace pdserve
