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

}  // namespace

Status rms_norm(MatrixView in, VectorView weight, float eps, MatrixView out, CpuThreadPool& pool,
                CpuIsa isa) {
  const bool vector = uses_avx512(isa);
  pool.run(in.rows, [&](int64_t i) {
    if (vector) {
      avx512::rms_norm_row(in.row<float>(i), weight.data, weight.dtype, eps, in.cols,
                           out.row<float>(i));
    } else {
      normalize_row(in.row<float>(i), weight, eps, in.cols, out.row<float>(i));
    }
  });
  return {};
}

Status add_rms_norm(MatrixView x, MatrixView residual, VectorView weight, float eps,
                    CpuThreadPool& pool, CpuIsa isa) {
  const bool vector = uses_avx512(isa);
  pool.run(x.rows, [&](int64_t i) {
    float* xr = x.row<float>(i);
    float* rr = residual.row<float>(i);
    if (vector) {
      avx512::add_rms_norm_row(xr, rr, weight.data, weight.dtype, eps, x.cols);
    } else {
      for (int64_t j = 0; j < x.cols; ++j) rr[j] += xr[j];
      normalize_row(rr, weight, eps, x.cols, xr);
    }
  });
  return {};
}

}  // namespace pdserve::cpu
