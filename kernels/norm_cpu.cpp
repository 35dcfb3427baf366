#include <cmath>

#include "kernels/cpu_kernels.h"
#include "kernels/row_ops_avx512.h"

namespace pdserve::cpu {
namespace {

// The mean square is accumulated in double, in index order, so it is exact enough and fixed.
void normalize_row(const float* in, const VectorView& weight, float eps, int64_t n, float* out) {
  double sum_squares = 0.0;
  for (int64_t j = 0; j < n; ++j) sum_squares += static_cast<double>(in[j]) * in[j];
  const float inv_rms =
      static_cast<float>(1.0 / std::sqrt(sum_squares / static_cast<double>(n) + eps));
  for (int64_t j = 0; j < n; ++j)
    out[j] = in[j] * inv_rms * load_as_float(weight.data, weight.dtype, j);
}

// Rows are split across threads only when there are several: one row (a decode step) costs
// less than waking the other threads.
int threads_for(int64_t rows, int num_threads) {
  return static_cast<int>(rows < num_threads ? (rows < 1 ? 1 : rows) : num_threads);
}

}  // namespace

Status rms_norm(MatrixView in, VectorView weight, float eps, MatrixView out, int num_threads,
                CpuIsa isa) {
  const bool vector = uses_avx512(isa);
#pragma omp parallel for schedule(static) num_threads(threads_for(in.rows, num_threads))
  for (int64_t i = 0; i < in.rows; ++i) {
    if (vector) {
      avx512::rms_norm_row(in.row<float>(i), weight.data, weight.dtype, eps, in.cols,
                           out.row<float>(i));
    } else {
      normalize_row(in.row<float>(i), weight, eps, in.cols, out.row<float>(i));
    }
  }
  return {};
}

Status add_rms_norm(MatrixView x, MatrixView residual, VectorView weight, float eps,
                    int num_threads, CpuIsa isa) {
  const bool vector = uses_avx512(isa);
#pragma omp parallel for schedule(static) num_threads(threads_for(x.rows, num_threads))
  for (int64_t i = 0; i < x.rows; ++i) {
    float* xr = x.row<float>(i);
    float* rr = residual.row<float>(i);
    if (vector) {
      avx512::add_rms_norm_row(xr, rr, weight.data, weight.dtype, eps, x.cols);
    } else {
      for (int64_t j = 0; j < x.cols; ++j) rr[j] += xr[j];
      normalize_row(rr, weight, eps, x.cols, xr);
    }
  }
  return {};
}

}  // namespace pdserve::cpu
